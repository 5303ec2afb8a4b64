"""Every field of `MRTConfig` and `MixerConfig` is one its trainer accepts (set to a valid non-default value, each
builds the trainer and steps it) or one it refuses with the reason (MIXER: the whole-sequence rollout fields); and
every trainer's `disable_dropout` does what it says."""

import dataclasses

import pytest
import torch
from datasets import Dataset
from transformers import Seq2SeqTrainingArguments

from helpers import byt5_tokenizer, params, tiny_causal_model, tiny_model, toy_pairs
from hf_seqrl import (DistillationConfig, DistillationTrainer, KStepRolloutConfig, KStepRolloutTrainer, MixerConfig, MixerTrainer, MRTConfig, MRTTrainer,
                      PrefixCorruptionConfig, PrefixCorruptionTrainer, ProfessorForcingConfig, ProfessorForcingTrainer,
                      ReinforceTrainer, SCSTTrainer, ScheduledSamplingConfig, ScheduledSamplingTrainer, SeqRLConfig)

BATCH, ACCUMULATION = 2, 2
# A valid value other than the default for every field hf-seqrl declares (by field name, for both configs).
SHARED = dict(warmup_xe_steps=1, disable_dropout=False, task="summarization", model_init_kwargs={"dtype": "float32"},
              max_new_tokens=6,
              reward_weights=[0.6, 0.4], nonfinite_rewards="drop", reward_workers=2, num_samples=3, temperature=0.9,
              top_k=5, top_p=0.95, epsilon_cutoff=0.001, rl_weight=0.8, entropy_coef=0.01, kl_coef=0.05,
              log_completions=True,
              num_completions_to_print=1, save_on_error=False, ds3_gather_for_generation=False,
              teacher_model_init_kwargs={"dtype": "float32"},
              generation_selection={"decode": "mbr", "candidates": "beam", "num_candidates": 2})
SEQ2SEQ_ONLY = dict(source_column="src", target_column="tgt", eval_target_column="tgt", max_source_length=24,
                    max_target_length=12)
CAUSAL_ONLY = dict(max_prompt_length=24, max_completion_length=12)
# Whole sequences drawn from the source alone: decoded ahead, scored by the mean; MIXER refuses them.
SEQUENCE = dict(steps_per_generation=ACCUMULATION, generation_batch_size=BATCH * ACCUMULATION, length_normalize=True)
MRT = dict(**SEQUENCE, mrt_candidates="sample+beam", mrt_beam_size=3, max_len_a=1.0, max_len_b=4, mrt_alpha=0.5,
           mrt_include_greedy=True, mrt_include_reference=True)
MIXER = dict(baseline="mean", baseline_ema_decay=0.5, center_advantages=True, scale_rewards="group",
             multi_objective_aggregation="normalize_then_sum", mask_truncated_completions=True, mixer_delta=1,
             mixer_increment_steps=1, token_reward_to_go=True)
INHERITED = {f.name for f in dataclasses.fields(Seq2SeqTrainingArguments)}


def own_fields(config_class) -> set[str]:
    return {f.name for f in dataclasses.fields(config_class) if f.init} - INHERITED


def length_reward(predictions, references, sources=None, **columns):
    return [min(len(p), 10) / 10 for p in predictions]


@pytest.mark.parametrize("config_class,own,refused", [(MRTConfig, MRT, {}), (MixerConfig, MIXER, SEQUENCE)])
def test_the_table_covers_every_field(config_class, own, refused):
    assert own_fields(config_class) == set(SHARED) | set(SEQ2SEQ_ONLY) | set(CAUSAL_ONLY) | set(own) | set(refused)
    defaults = config_class(output_dir="unused")
    for name, value in {**SHARED, **SEQ2SEQ_ONLY, **CAUSAL_ONLY, **own, **refused}.items():
        assert getattr(defaults, name) != value, name


def text_data(family: str) -> Dataset:
    sources, targets = toy_pairs(8, seed=3)
    if family == "seq2seq":
        return Dataset.from_dict({"src": sources, "tgt": targets})
    return Dataset.from_dict({"prompt": [f"copy: {s} =" for s in sources], "completion": targets})


@pytest.mark.parametrize("family", ["seq2seq", "causal"])
@pytest.mark.parametrize("trainer_class,config_class,own", [(MRTTrainer, MRTConfig, MRT),
                                                             (MixerTrainer, MixerConfig, MIXER)])
def test_every_field_set_builds_and_steps_the_trainer(tmp_path, family, trainer_class, config_class, own):
    fields = {**SHARED, **(SEQ2SEQ_ONLY if family == "seq2seq" else CAUSAL_ONLY), **own}
    args = config_class(output_dir=str(tmp_path), per_device_train_batch_size=BATCH,
                        gradient_accumulation_steps=ACCUMULATION, max_steps=2, learning_rate=1e-3, logging_steps=1,
                        report_to=[], save_strategy="no", disable_tqdm=True, dataloader_pin_memory=False, seed=0,
                        **fields)
    for name, value in fields.items():
        assert getattr(args, name) == value, name
    # The model comes as a folder, which `model_init_kwargs` loads; the teacher too (`teacher_model_init_kwargs`).
    (tiny_model("t5", dropout=0.1) if family == "seq2seq" else tiny_causal_model("llama")).save_pretrained(
        tmp_path / "base")
    trainer = trainer_class(model=str(tmp_path / "base"), args=args, reward_funcs=["chrf", length_reward],
                            train_dataset=text_data(family), processing_class=byt5_tokenizer(),
                            teacher_model=str(tmp_path / "base"))
    model = trainer.model
    before = params(model)
    trainer.train()
    phases = [h["rl/phase"] for h in trainer.state.log_history if "rl/phase" in h]
    assert phases == [0.0, 1.0]  # one warm-up step, then the trainer's own loss
    last = [h for h in trainer.state.log_history if h.get("rl/phase") == 1.0][-1]
    assert torch.isfinite(torch.tensor([last["loss"], last["rl/length_ratio"]])).all()
    if getattr(args, "mask_truncated_completions", False) and last["rl/frac_truncated"] == 1.0:
        # no sample left in the loss: nothing to measure
        assert "rl/kl" not in last and "rl/entropy" not in last and "rl/teacher_logprob" not in last
    else:
        assert torch.isfinite(torch.tensor([last["rl/kl"], last["rl/entropy"]])).all()
        assert last["rl/teacher_logprob"] < 0
    assert not trainer.frozen_models["teacher"].model.training
    rollout = trainer.rollout_config  # the sampling fields reach the decode
    assert (rollout.temperature, rollout.top_k, rollout.top_p, rollout.epsilon_cutoff) == (0.9, 5, 0.95, 0.001)
    assert (tmp_path / "completions" / "step-2.jsonl").is_file()
    after = params(model)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def dropout_probabilities(model) -> set[float]:
    return {module.p for module in model.modules() if isinstance(module, torch.nn.Dropout)}


# (trainer, config, its extra arguments, what disable_dropout=None means for it), one row per family of trainers.
FAMILIES = [
    (SCSTTrainer, SeqRLConfig, {"reward_funcs": "chrf"}, False),
    (ReinforceTrainer, SeqRLConfig, {"reward_funcs": "chrf"}, False),
    (MRTTrainer, MRTConfig, {"reward_funcs": "chrf"}, True),
    (MixerTrainer, MixerConfig, {"reward_funcs": "chrf"}, False),
    (DistillationTrainer, DistillationConfig, {"teacher_model": tiny_model("t5", seed=1)}, True),
    (ScheduledSamplingTrainer, ScheduledSamplingConfig, {}, False),
    (PrefixCorruptionTrainer, PrefixCorruptionConfig, {}, False),
    (KStepRolloutTrainer, KStepRolloutConfig, {}, False),
    (ProfessorForcingTrainer, ProfessorForcingConfig, {}, False),
]


@pytest.mark.parametrize("trainer_class,config_class,extra,by_default", FAMILIES,
                         ids=[row[0].__name__ for row in FAMILIES])
@pytest.mark.parametrize("setting", [None, True, False])
def test_disable_dropout_does_what_it_says_for_every_trainer(tmp_path, trainer_class, config_class, extra,
                                                             by_default, setting):
    model = tiny_model("t5", dropout=0.3)
    assert 0.3 in dropout_probabilities(model)
    args = config_class(output_dir=str(tmp_path), disable_dropout=setting, report_to=[])
    trainer_class(model=model, args=args, train_dataset=text_data("seq2seq").rename_columns(
        {"src": "source", "tgt": "target"}), processing_class=byt5_tokenizer(), **extra)
    disabled = by_default if setting is None else setting
    if disabled:
        assert dropout_probabilities(model) == {0.0}
    else:
        assert 0.3 in dropout_probabilities(model)
