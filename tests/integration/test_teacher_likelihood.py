"""`TeacherLikelihoodReward`: a teacher's mean token log-probability of each prediction given its source, against the
teacher's own forward by hand (encoder-decoder and decoder-only teachers), each distinct pair scored once, and a
teacher with another tokenizer rewarding a student through `SCSTTrainer`."""

import pytest
import torch
from datasets import Dataset

from helpers import bpe_tokenizer, byt5_tokenizer, make_config, tiny_causal_model, tiny_model, toy_pairs
from hf_seqrl import SCSTTrainer, SeqRLConfig
from hf_seqrl.models.tiny import build_tiny_model
from hf_seqrl.rewards import TeacherLikelihoodReward


def by_hand(model, tok, source, prediction, causal):
    """The mean log-prob of the prediction's tokens (EOS included) after the source, one pair at a time."""
    with torch.no_grad():
        if causal:
            prompt = tok(source)["input_ids"]
            completion = tok(prediction, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0]
            logp = torch.log_softmax(logits[len(prompt) - 1:-1].float(), -1)
            target = torch.tensor(completion)
        else:
            labels = tok(text_target=[prediction], return_tensors="pt")["input_ids"]
            logits = model(**tok([source], return_tensors="pt"), labels=labels).logits[0]
            logp, target = torch.log_softmax(logits.float(), -1), labels[0]
    return logp.gather(-1, target[:, None]).mean().item()


@pytest.mark.parametrize("causal", [False, True], ids=["seq2seq", "causal"])
def test_the_reward_is_the_teachers_mean_token_logprob_and_each_pair_runs_once(causal):
    tok = byt5_tokenizer()
    teacher = tiny_causal_model(seed=3) if causal else tiny_model("t5", seed=3, dropout=0.1)
    teacher.train()  # the reward puts it in eval mode
    reward = TeacherLikelihoodReward(teacher, tok, batch_size=2, device="cpu")
    sources = ["abc", "dd", "abc", "bca"]
    predictions = ["cba", "d", "cba", ""]
    calls = []
    teacher.register_forward_hook(lambda module, args, kwargs, output: calls.append(1), with_kwargs=True)
    values = reward(predictions, [["x"]] * 4, sources)
    assert len(calls) == 2  # three distinct pairs, two to a forward
    assert values[0] == values[2]
    for value, source, prediction in zip(values, sources, predictions):
        assert value == pytest.approx(by_hand(teacher, tok, source, prediction, causal), abs=1e-5)
    assert not teacher.training
    with pytest.raises(ValueError, match="add a `sources` column"):
        reward(predictions, [["x"]] * 4, None)


def test_a_teacher_with_another_tokenizer_rewards_a_student(tmp_path):
    sources, targets = toy_pairs(8, alphabet="abcd", lengths=(2, 5))
    teacher_tok = bpe_tokenizer(sources + targets)
    teacher = build_tiny_model("llama", tokenizer=teacher_tok, d_model=32, layers=1, seed=4)
    assert teacher.config.vocab_size != 384  # the student's ByT5 vocabulary
    calls = []

    class Recorded(TeacherLikelihoodReward):
        def __call__(self, predictions, references, sources=None, **columns):
            values = super().__call__(predictions, references, sources, **columns)
            calls.append((list(predictions), list(sources), values))
            return values

    reward = Recorded(teacher, teacher_tok)
    args = make_config(SeqRLConfig, tmp_path, max_steps=2, num_samples=2, baseline="mean", logging_steps=1)
    trainer = SCSTTrainer(model=tiny_model("marian", seed=1, dropout=0.1), args=args, reward_funcs=reward,
                          train_dataset=Dataset.from_dict({"source": sources, "target": targets}),
                          processing_class=byt5_tokenizer())
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rl/rewards/teacher_likelihood/mean" in h]
    assert len(logs) == 2 and all(h["rl/rewards/teacher_likelihood/mean"] < 0 for h in logs)
    # Each sample's reward is the teacher's own likelihood of the student's text, through the teacher's tokenizer.
    assert calls and sum(len(p) for p, _, _ in calls) >= 8
    for predictions, call_sources, values in calls:
        for prediction, source, value in zip(predictions, call_sources, values):
            assert value == pytest.approx(by_hand(teacher, teacher_tok, source, prediction, True), abs=1e-5)
