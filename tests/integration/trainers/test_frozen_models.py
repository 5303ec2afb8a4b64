"""Frozen models scored on the policy's tokens (`hf_seqrl.trainers.services.frozen`): a teacher next to any rewarded trainer,
and the KL reference as one case of it."""

import copy
from functools import partial

import pytest
import torch

from helpers import byt5_tokenizer, make_config, overlap_reward, params, text_pairs, tiny_causal_model, tiny_model
from hf_seqrl import MRTConfig, MRTTrainer, SCSTTrainer, SeqRLConfig
from hf_seqrl.models.tiny import build_tiny_model

config = partial(make_config, SeqRLConfig, max_steps=2, num_samples=2, logging_steps=1)


@pytest.mark.parametrize("causal", [False, True], ids=["seq2seq", "causal"])
def test_a_teacher_is_scored_on_the_samples_in_eval_mode_and_never_trains(tmp_path, causal):
    tok = byt5_tokenizer()
    build = tiny_causal_model if causal else partial(tiny_model, "t5", dropout=0.1)
    model, teacher = build(seed=1), build(seed=2)
    teacher.train()
    before = params(teacher)
    trainer = SCSTTrainer(model=model, args=config(tmp_path), reward_funcs=overlap_reward,
                          train_dataset=text_pairs(causal), processing_class=tok, teacher_model=teacher)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rl/teacher_logprob" in h]
    assert len(logs) == 2 and all(h["rl/teacher_logprob"] < 0 and "rl/teacher_kl" in h for h in logs)
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())


def test_a_teacher_equal_to_the_policy_has_no_kl_from_it_at_the_first_step(tmp_path):
    tok = byt5_tokenizer()
    model = tiny_model("t5", seed=3, dropout=0.1)
    trainer = MRTTrainer(model=model, args=make_config(MRTConfig, tmp_path, max_steps=1, num_samples=2,
                                                       logging_steps=1, disable_dropout=True),
                         reward_funcs=overlap_reward, train_dataset=text_pairs(False), processing_class=tok,
                         teacher_model=copy.deepcopy(model))
    trainer.train()
    log = next(h for h in trainer.state.log_history if "rl/teacher_kl" in h)
    assert log["rl/teacher_kl"] == pytest.approx(0.0, abs=1e-6)


def test_a_teacher_with_another_vocabulary_is_refused(tmp_path):
    tok = byt5_tokenizer()
    other = build_tiny_model("t5", vocab_size=512, d_model=32, layers=1, pad_token_id=0, eos_token_id=1)
    with pytest.raises(ValueError, match="teacher_model has an output layer of 512 tokens and the policy one of 384"):
        SCSTTrainer(model=tiny_model("t5"), args=config(tmp_path), reward_funcs=overlap_reward,
                    train_dataset=text_pairs(False), processing_class=tok, teacher_model=other)


def test_the_kl_reference_is_a_frozen_model_following_the_policy(tmp_path):
    tok = byt5_tokenizer()
    trainer = SCSTTrainer(model=tiny_model("t5", dropout=0.1), args=config(tmp_path, kl_coef=0.1),
                          reward_funcs=overlap_reward, train_dataset=text_pairs(False), processing_class=tok)
    reference = trainer.frozen_models["reference"]
    assert reference.follow_policy and trainer.ref_model is reference.model
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rl/kl" in h]
    assert logs[0]["rl/kl"] == pytest.approx(0.0, abs=1e-7)  # the same dropout draws: only the weights differ
