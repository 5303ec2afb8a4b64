"""What a run says it trained with: the card and `seqrl_run.json` of a run whose steps are all cross-entropy (and the
warning at train start), `CrossEntropyTrainer` on both families, and the warning of a resume under another algorithm,
method or baseline (`hf_seqrl.trainers.services.run_record`)."""

import json
import logging

import pytest

from helpers import byt5_tokenizer, make_config, params, prompt_completion_dataset, tiny_causal_model, tiny_model, \
    toy_dataset, toy_pairs
from hf_seqrl import (CrossEntropyTrainer, DistillationConfig, DistillationTrainer, MRTConfig, MRTTrainer,
                      SCSTTrainer, SeqRLBaseConfig, SeqRLConfig)
from hf_seqrl.trainers.services.checkpoints import STATE_FILE, TRAINED_BY


def data(tok):
    sources, targets = toy_pairs(8, seed=0, alphabet="abcd", lengths=(2, 5))
    return toy_dataset(tok, sources, targets)


def saved(trainer, folder):
    """Returns `(card, seqrl_run.json's training entry)` of `trainer` saved in `folder`."""
    trainer.save_model(str(folder))
    return (folder / "README.md").read_text(), json.loads((folder / "seqrl_run.json").read_text())["training"]


def warnings_of(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


@pytest.mark.parametrize("warmup", [2, 5])
def test_a_run_all_in_the_warm_up_is_cross_entropy_fine_tuning(tmp_path, caplog, warmup):
    """SCST with warmup_xe_steps >= max_steps never runs SCST: a warning at train start, and the card and
    seqrl_run.json say cross-entropy, with no reward or baseline."""
    tok = byt5_tokenizer()
    args = make_config(SeqRLConfig, tmp_path, max_steps=2, warmup_xe_steps=warmup)
    trainer = SCSTTrainer(model=tiny_model("t5"), args=args, reward_funcs="bleu", train_dataset=data(tok),
                          processing_class=tok)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert f"warmup_xe_steps={warmup} covers all 2 optimizer steps of the run" in warnings_of(caplog)
    assert "SCST never runs" in warnings_of(caplog) and "--algorithm xe" in warnings_of(caplog)
    card, training = saved(trainer, tmp_path / "saved")
    assert "fine-tuned with **Cross-entropy**" in card and "- Algorithm: Cross-entropy" in card
    assert "SCSTTrainer's SCST never ran" in card
    assert "- Reward:" not in card and "- Baseline:" not in card and "**SCST**" not in card
    assert training == {"trainer": "SCSTTrainer", "algorithm": "xe", "method": "Cross-entropy",
                        "objective": "maximum likelihood with teacher forcing", "baseline": None,
                        "cross_entropy_only": f"warmup_xe_steps={warmup} covers all 2 optimizer steps of the run",
                        "reward": None, "teacher": None, "steps": 2, "warmup_xe_steps": warmup}


def test_a_run_past_the_warm_up_says_what_it_trained_with(tmp_path, caplog):
    tok = byt5_tokenizer()
    args = make_config(SeqRLConfig, tmp_path, max_steps=2, warmup_xe_steps=1)
    trainer = SCSTTrainer(model=tiny_model("t5"), args=args, reward_funcs="bleu", train_dataset=data(tok),
                          processing_class=tok)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "covers all" not in warnings_of(caplog)
    card, training = saved(trainer, tmp_path / "saved")
    assert "fine-tuned with **SCST**" in card and "- Reward: `bleu`" in card and "- Baseline: `greedy`" in card
    assert (training["algorithm"], training["method"], training["reward"], training["baseline"]) == (
        "scst", "SCST", "bleu", "greedy")
    assert training["steps"] == 2 and "cross_entropy_only" not in training


@pytest.mark.parametrize("causal", [False, True], ids=["seq2seq", "causal"])
def test_cross_entropy_trainer_trains_and_says_so(tmp_path, caplog, causal):
    tok = byt5_tokenizer()
    model = tiny_causal_model("llama") if causal else tiny_model("t5")
    train = prompt_completion_dataset(tok, n=8, task="copy", lengths=(2, 4)) if causal else data(tok)
    before = params(model)
    trainer = CrossEntropyTrainer(model=model, args=make_config(SeqRLBaseConfig, tmp_path, max_steps=2),
                                  train_dataset=train, processing_class=tok)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "covers all" not in warnings_of(caplog)
    assert any(not (before[k] == v).all() for k, v in params(trainer.model).items())
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(loss > 0 for loss in losses)
    card, training = saved(trainer, tmp_path / "saved")
    assert "fine-tuned with **Cross-entropy**" in card and "- Reward:" not in card and "never ran" not in card
    assert (training["trainer"], training["algorithm"], training["method"], training["reward"]) == (
        "CrossEntropyTrainer", "xe", "Cross-entropy", None)


def test_rl_weight_zero_without_kl_or_entropy_is_cross_entropy_too(tmp_path):
    tok = byt5_tokenizer()
    args = make_config(SeqRLConfig, tmp_path, max_steps=1, rl_weight=0.0)
    trainer = SCSTTrainer(model=tiny_model("t5"), args=args, reward_funcs="bleu", train_dataset=data(tok),
                          processing_class=tok)
    trainer.train()
    card, training = saved(trainer, tmp_path / "saved")
    assert "fine-tuned with **Cross-entropy**" in card and training["algorithm"] == "xe"
    assert "rl_weight=0, kl_coef=0 and entropy_coef=0" in training["cross_entropy_only"]


def test_resuming_with_another_algorithm_or_baseline_warns_naming_both(tmp_path, caplog):
    """A checkpoint records what trained it; resumed by SCST with the mean baseline, by MRT or by distillation, the
    trainer warns naming the checkpoint's algorithm and its own; resumed as it was trained, it does not."""
    tok = byt5_tokenizer()
    args = make_config(SeqRLConfig, tmp_path, max_steps=1, save_strategy="steps", save_steps=1)
    SCSTTrainer(model=tiny_model("t5"), args=args, reward_funcs="bleu", train_dataset=data(tok),
                processing_class=tok).train()
    checkpoint = tmp_path / "out" / "checkpoint-1"
    recorded = json.loads((checkpoint / STATE_FILE).read_text())[TRAINED_BY]
    assert recorded == {"trainer": "SCSTTrainer", "algorithm": "scst", "method": "SCST",
                        "objective": recorded["objective"], "baseline": "greedy"}

    def resume(trainer_class, config_class, **settings) -> str:
        caplog.clear()
        resumed = make_config(config_class, tmp_path / trainer_class.__name__, max_steps=2, **settings)
        extra = {"teacher_model": tiny_model("t5", seed=2)} if trainer_class is DistillationTrainer else \
            {"reward_funcs": "bleu"}
        trainer = trainer_class(model=tiny_model("t5"), args=resumed, train_dataset=data(tok), processing_class=tok,
                                **extra)
        with caplog.at_level(logging.WARNING):
            trainer.train(resume_from_checkpoint=str(checkpoint))
        return warnings_of(caplog)

    assert "was trained by" not in resume(SCSTTrainer, SeqRLConfig)
    mean = resume(SCSTTrainer, SeqRLConfig, baseline="mean", num_samples=2)
    assert f"{checkpoint} was trained by SCSTTrainer (SCST), and this run trains with REINFORCE with leave-one-out " \
           "baseline" in mean
    assert "baseline: 'greedy' → 'mean'" in mean
    assert "method: 'SCST' → 'REINFORCE with leave-one-out baseline'" in mean
    mrt = resume(MRTTrainer, MRTConfig, num_samples=2)
    assert "algorithm: 'scst' → 'mrt'" in mrt and "baseline: 'greedy' → None" in mrt
    distill = resume(DistillationTrainer, DistillationConfig)
    assert "algorithm: 'scst' → 'distill'" in distill and "this run trains with On-policy distillation" in distill
