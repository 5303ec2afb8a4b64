"""Datasets of sources (or prompts) alone, no target: on-policy distillation and the policy gradients with a
reference-free reward train from them on both model families; a setting that reads targets is refused when the
trainer is built, named (`hf_seqrl.trainers.services.references`)."""

import json

import pytest
import torch
from datasets import Dataset

from helpers import byt5_tokenizer, make_config, params, tiny_causal_model, tiny_model, toy_pairs
from hf_seqrl import (DistillationConfig, DistillationTrainer, MixerConfig, MixerTrainer, MRTConfig, MRTTrainer,
                      SCSTTrainer, SeqRLConfig, SeqRLTrainer)

SEEN: list[tuple] = []


def source_reward(predictions, references, sources, **columns):
    """A reference-free reward of the sources alone (shared letters, plus a little length); records what it got."""
    SEEN.append((references, sources))
    return [len(set(p) & set(s)) / max(len(set(p) | set(s)), 1) + len(p) / 20 for p, s in zip(predictions, sources)]


def sources_only(causal: bool, n: int = 8, seed: int = 0) -> Dataset:
    """Returns the toy task's sources alone: a `source` column (encoder-decoder) or a `prompt` one (decoder-only)."""
    sources, _ = toy_pairs(n, seed=seed, alphabet="abcd", lengths=(2, 5))
    return Dataset.from_dict({"prompt": [s + "=" for s in sources]} if causal else {"source": sources})


def student(causal: bool, seed: int = 1):
    """A tiny model of either family with dropout on."""
    return tiny_causal_model("llama", seed=seed, dropout=0.1) if causal else tiny_model("t5", seed=seed, dropout=0.1)


def moved(before: dict, model) -> bool:
    return any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("causal", [False, True], ids=["t5", "llama"])
def test_on_policy_distillation_trains_from_sources_alone(tmp_path, causal):
    model = student(causal)
    teacher = tiny_causal_model("llama", seed=2) if causal else tiny_model("t5", seed=2)
    before = params(model)
    args = make_config(DistillationConfig, tmp_path, max_steps=3, lmbda=1.0, rl_weight=1.0, disable_dropout=False,
                       predict_with_generate=True, eval_strategy="steps", eval_steps=3)
    trainer = DistillationTrainer(model=model, args=args, processing_class=byt5_tokenizer(), teacher_model=teacher,
                                  train_dataset=sources_only(causal), eval_dataset=sources_only(causal, 4, seed=5))
    assert {"labels", "references"}.isdisjoint(trainer.train_dataset.column_names)
    trainer.train()
    assert moved(before, trainer.model)
    assert all("distill/divergence" in h for h in trainer.state.log_history if "loss" in h)
    evaluations = [h for h in trainer.state.log_history if "eval_runtime" in h]
    assert evaluations and "eval_loss" not in evaluations[0]  # no targets: no loss to report


@pytest.mark.parametrize("causal", [False, True], ids=["t5", "llama"])
@pytest.mark.parametrize("trainer_class,config_class,settings", [
    (SCSTTrainer, SeqRLConfig, {}), (SeqRLTrainer, SeqRLConfig, dict(baseline="mean")), (MRTTrainer, MRTConfig, {})],
    ids=["scst", "leave-one-out", "mrt"])
def test_rewarded_trainers_train_from_sources_alone_with_a_reference_free_reward(tmp_path, causal, trainer_class,
                                                                                 config_class, settings):
    SEEN.clear()
    model = student(causal)
    before = params(model)
    args = make_config(config_class, tmp_path, max_steps=3, num_samples=2, disable_dropout=False,
                       log_completions=True, num_completions_to_print=0, **settings)
    trainer = trainer_class(model=model, args=args, processing_class=byt5_tokenizer(), reward_funcs=source_reward,
                            train_dataset=sources_only(causal))
    trainer.train()
    assert moved(before, trainer.model)
    logged = [json.loads(line) for line in (tmp_path / "out" / "completions" / "step-3.jsonl").open()]
    assert logged and all(row["references"] == [] and row["source"].strip() for row in logged)  # the sample log
    references, sources = SEEN[0]
    assert references == [[]] * len(sources) and all(s.strip() for s in sources)  # empty references, real sources
    assert all("rl/reward" in h for h in trainer.state.log_history if "loss" in h)
    SEEN.clear()  # predictions of sources alone are scored by the reward too
    trainer.args.predict_with_generate = True
    trainer.predict(trainer.train_dataset)
    assert SEEN and SEEN[0][0] == [[]] * len(SEEN[0][1])


def build(trainer_class, config_class, tmp_path, causal=False, **kwargs):
    fields = {k: v for k, v in kwargs.items() if k in config_class.__dataclass_fields__}
    rest = {k: v for k, v in kwargs.items() if k not in fields}
    rest.setdefault("reward_funcs", source_reward)
    return trainer_class(model=student(causal), args=make_config(config_class, tmp_path, **fields),
                         processing_class=byt5_tokenizer(), train_dataset=sources_only(causal), **rest)


@pytest.mark.parametrize("trainer_class,config_class,kwargs,named", [
    (SCSTTrainer, SeqRLConfig, dict(rl_weight=0.5), r"SeqRLConfig\.rl_weight=0\.5 mixes in cross-entropy"),
    (SCSTTrainer, SeqRLConfig, dict(warmup_xe_steps=2), r"SeqRLConfig\.warmup_xe_steps=2"),
    (SCSTTrainer, SeqRLConfig, dict(reward_funcs="bleu"), r"reward_funcs \['bleu'\] scores the samples against"),
    (SCSTTrainer, SeqRLConfig, dict(reward_funcs=["chrf", "repetition"]), r"reward_funcs \['chrf'\]"),
    (MRTTrainer, MRTConfig, dict(num_samples=2, mrt_include_reference=True), r"MRTConfig\.mrt_include_reference"),
    (MixerTrainer, MixerConfig, dict(num_samples=2, mixer_delta=1), r"MixerTrainer samples continuations of the gold"),
    (DistillationTrainer, DistillationConfig, dict(lmbda=0.5, reward_funcs=None, teacher_model=tiny_model("t5")),
     r"DistillationConfig\.lmbda=0\.5 trains the off-policy steps on the gold targets"),
    (DistillationTrainer, DistillationConfig, dict(rl_weight=0.8, reward_funcs=None, teacher_model=tiny_model("t5")),
     r"DistillationConfig\.rl_weight=0\.8"),
], ids=["rl_weight", "warmup", "bleu", "chrf-in-a-list", "mrt-reference", "mixer", "distill-lmbda", "distill-xe"])
def test_a_setting_that_reads_targets_is_refused_by_name(tmp_path, trainer_class, config_class, kwargs, named):
    with pytest.raises(ValueError, match=named) as error:
        build(trainer_class, config_class, tmp_path, **kwargs)
    assert "has sources and no targets" in str(error.value) and "'target'" in str(error.value)


def test_sequence_level_kd_and_a_quality_estimate_need_no_target(tmp_path):
    """Off-policy steps on the teacher's beams (`seq_kd`) read no target either."""
    trainer = build(DistillationTrainer, DistillationConfig, tmp_path, lmbda=0.5, seq_kd=True, max_steps=2,
                    teacher_model=tiny_model("t5", seed=2))
    trainer.train()
    assert trainer.state.global_step == 2


def test_an_evaluation_split_without_targets_is_refused_for_compute_metrics(tmp_path):
    with pytest.raises(ValueError, match=r"eval_dataset has sources and no targets.*compute_metrics compares"):
        build(SCSTTrainer, SeqRLConfig, tmp_path, eval_dataset=sources_only(False, 4),
              compute_metrics=lambda prediction: {})


def test_a_pre_tokenized_dataset_without_targets_trains_and_is_refused_alike(tmp_path):
    tokenizer = byt5_tokenizer()
    data = sources_only(False).map(lambda row: tokenizer(row["source"])).rename_column("source", "sources")
    trainer = build(SCSTTrainer, SeqRLConfig, tmp_path, max_steps=1)
    trainer = SCSTTrainer(model=student(False), args=trainer.args, processing_class=tokenizer,
                          reward_funcs=source_reward, train_dataset=data)
    trainer.train()
    with pytest.raises(ValueError, match=r"train_dataset has sources and no targets.*rl_weight=0\.5"):
        SCSTTrainer(model=student(False), args=make_config(SeqRLConfig, tmp_path, rl_weight=0.5),
                    processing_class=tokenizer, reward_funcs=source_reward, train_dataset=data)
