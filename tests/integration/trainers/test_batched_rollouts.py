"""Batched rollouts (`steps_per_generation` / `generation_batch_size`): one decode serves several micro-batches of an
optimizer step, with the samples and gradients of the per-micro-batch path.

Every sample row draws from its own key (seed, process, optimizer step, row), so which rows share a decode does not
change the draws. The models keep dropout 0.1 as checkpoints ship it (the policy gradients keep it by default, MRT
turns it off) and the sources differ in length, so that joining micro-batches pads them.
"""

from functools import partial

import pytest
import torch
from transformers import TrainerCallback

from helpers import byt5_tokenizer, make_config, overlap_reward, prompt_completion_dataset, tiny_causal_model, tiny_model, toy_dataset, toy_pairs
from hf_seqrl import MRTConfig, MRTTrainer, SCSTTrainer, SeqRLConfig
from hf_seqrl.configs import MixerConfig


class GradientRecorder(TrainerCallback):
    """Keeps the accumulated gradients of every optimizer step, just before the step."""

    def __init__(self):
        self.steps = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.steps.append({name: p.grad.detach().clone() for name, p in model.named_parameters()
                           if p.grad is not None})


def train(trainer_class, config_class, model, dataset, tmp_path, **overrides):
    """Trains (by default) 2 optimizer steps of 4 micro-batches of 2 sources; returns (samples of each micro-batch in
    training order, gradients of each step, the sources of each decode)."""
    args = make_config(config_class, tmp_path, **{"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4,
                                                  "max_steps": 2, "num_samples": 2, "learning_rate": 1e-2,
                                                  **overrides})
    recorder = GradientRecorder()
    trainer = trainer_class(model=model, args=args, train_dataset=dataset, processing_class=byt5_tokenizer(),
                            reward_funcs=overlap_reward, callbacks=[recorder])
    samples, decodes = [], []
    take_rollout, sample = trainer.take_rollout, trainer.family.sample

    def record_take_rollout(*a, **k):
        rollout = take_rollout(*a, **k)
        samples.append(rollout.sample_ids.clone())
        return rollout

    def record_decode(model, batch, *a, **k):
        decodes.append(batch["input_ids"].shape[0])
        return sample(model, batch, *a, **k)

    trainer.take_rollout, trainer.family.sample = record_take_rollout, record_decode
    try:
        trainer.train()
    finally:
        del trainer.family.sample  # the family object is shared by every trainer of its kind
    return samples, recorder.steps, decodes


def seq2seq_data(n=24):
    sources, targets = toy_pairs(n, seed=3, lengths=(2, 9))
    return toy_dataset(byt5_tokenizer(), sources, targets)


CASES = {
    "t5-scst": (SCSTTrainer, SeqRLConfig, lambda: tiny_model("t5", dropout=0.1), seq2seq_data, {}),
    "bart-leave-one-out": (SCSTTrainer, SeqRLConfig, lambda: tiny_model("bart", dropout=0.1), seq2seq_data,
                           {"baseline": "mean"}),
    "marian-mrt": (MRTTrainer, MRTConfig, lambda: tiny_model("marian", dropout=0.1), seq2seq_data,
                   {"mrt_include_greedy": True}),
    "llama-scst": (SCSTTrainer, SeqRLConfig, lambda: tiny_causal_model("llama"),
                   lambda: prompt_completion_dataset(byt5_tokenizer(), n=24, lengths=(1, 7)), {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_batched_rollouts_equal_the_per_micro_batch_path(case, tmp_path):
    trainer_class, config_class, build, data, extra = CASES[case]
    runs = {}
    for steps in (1, 4):  # (2 is in the warm-up test below)
        torch.manual_seed(0)
        runs[steps] = train(trainer_class, config_class, build(), data(), tmp_path / str(steps),
                            steps_per_generation=steps, **extra)
    one_by_one = runs[1]
    assert one_by_one[2] == [2] * 8  # 8 micro-batches of 2 sources, each decoded on its own
    assert runs[4][2] == [8] * 2  # one decode per optimizer step of 4 micro-batches
    for steps in (4,):
        samples, gradients, _ = runs[steps]
        assert len(samples) == 8
        for mine, theirs in zip(samples, one_by_one[0]):
            assert torch.equal(mine, theirs)
        assert len(gradients) == 2 and gradients[0].keys() == one_by_one[1][0].keys()
        for step, reference in zip(gradients, one_by_one[1]):
            for name, grad in reference.items():
                torch.testing.assert_close(step[name], grad, rtol=1e-5, atol=1e-7)
    # The samples differ between the steps and between the micro-batches of a step (fresh keys, not one draw reused).
    assert any(not torch.equal(a, b) for a, b in zip(one_by_one[0][:4], one_by_one[0][4:]))


def test_batched_rollouts_with_clipped_reuse(tmp_path):
    """With num_iterations=2 the cycle's first step decodes ahead; the second reuses the kept rollouts (no decode)."""
    runs = {}
    for steps in (1, 4):
        torch.manual_seed(0)
        runs[steps] = train(SCSTTrainer, SeqRLConfig, tiny_model("t5", dropout=0.1), seq2seq_data(), tmp_path / str(steps),
                            steps_per_generation=steps, num_iterations=2)
    assert runs[4][2] == [8]  # the second step of the cycle decodes nothing
    assert len(runs[4][0]) == len(runs[1][0]) == 4
    for mine, theirs in zip(runs[4][0], runs[1][0]):
        assert torch.equal(mine, theirs)
    for step, reference in zip(runs[4][1], runs[1][1]):
        for name, grad in reference.items():
            torch.testing.assert_close(step[name], grad, rtol=1e-5, atol=1e-7)


def test_batched_rollouts_after_a_warm_up_and_on_a_short_last_step(tmp_path):
    """20 rows, 2 per micro-batch, 4 micro-batches per step: steps of 4, 4 and 2 micro-batches, the first a
    teacher-forced warm-up (no decode); the short last step decodes its 2 micro-batches together."""
    runs = {}
    for steps in (1, 2, 4):
        torch.manual_seed(0)
        runs[steps] = train(SCSTTrainer, SeqRLConfig, tiny_model("t5", dropout=0.1), seq2seq_data(20),
                            tmp_path / str(steps), steps_per_generation=steps, max_steps=-1, num_train_epochs=1,
                            warmup_xe_steps=1)
    assert runs[1][2] == [2] * 6 and runs[2][2] == [4] * 3 and runs[4][2] == [8, 4]
    for steps in (2, 4):
        samples, gradients, _ = runs[steps]
        assert len(samples) == 6 and all(torch.equal(a, b) for a, b in zip(samples, runs[1][0]))
        assert len(gradients) == 3
        for step, reference in zip(gradients, runs[1][1]):
            for name, grad in reference.items():
                torch.testing.assert_close(step[name], grad, rtol=1e-5, atol=1e-7)


def test_generation_batch_size_and_steps_per_generation(tmp_path):
    config = partial(make_config, SeqRLConfig, tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=4)
    assert config().generation_steps == 1  # default: every micro-batch decodes on its own
    derived = config(generation_batch_size=8)
    assert derived.generation_steps == 4 and derived.steps_per_generation is None  # the fields stay as given
    assert config(steps_per_generation=2).generation_steps == 2
    assert config(steps_per_generation=2, generation_batch_size=4).generation_steps == 2  # agreeing: accepted
    with pytest.raises(ValueError, match="steps_per_generation=3 must divide gradient_accumulation_steps=4"):
        config(steps_per_generation=3)
    with pytest.raises(ValueError, match="generation_batch_size=5 must be a multiple of"):
        config(generation_batch_size=5)
    with pytest.raises(ValueError, match="set only one of the two"):
        config(steps_per_generation=2, generation_batch_size=8)
    # MIXER decodes each micro-batch's continuations when it trains: decoding ahead is refused, with the reason
    with pytest.raises(ValueError, match="MixerConfig.steps_per_generation=2: MIXER continues"):
        make_config(MixerConfig, tmp_path, gradient_accumulation_steps=2, steps_per_generation=2)
    with pytest.raises(ValueError, match="MixerConfig.length_normalize=True"):
        make_config(MixerConfig, tmp_path, length_normalize=True)
