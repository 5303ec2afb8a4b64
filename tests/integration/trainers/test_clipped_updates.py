"""Rollouts reused for `num_iterations` clipped optimizer steps, and `loss_normalization`, in the trainers."""

from functools import partial
import pytest
import torch

import hf_seqrl.trainers.base as base
from helpers import byt5_tokenizer, equal_length_dataset, make_config, overlap_reward, params, tiny_model
from hf_seqrl import ReinforceTrainer, SCSTTrainer, SeqRLConfig
from hf_seqrl.trainers.services.reuse import RepeatBlockSampler, RolloutReuse
from hf_seqrl.types import RolloutBatch

config = partial(make_config, SeqRLConfig)  # config(tmp_path, **overrides)


def count_rollouts(monkeypatch):
    from hf_seqrl.models import Seq2SeqFamily

    calls = []
    sample = Seq2SeqFamily.sample

    def counting(self, model, batch, *args, **kwargs):
        calls.append(batch["input_ids"].clone())
        return sample(self, model, batch, *args, **kwargs)

    monkeypatch.setattr(Seq2SeqFamily, "sample", counting)
    return calls


# ---- the pieces: sampler and rollout store ---------------------------------------------------------------------

def test_repeat_block_sampler_repeats_each_step_and_drops_the_incomplete_block():
    step = [0]
    sampler = RepeatBlockSampler(num_rows=10, block_size=4, repeats=3, seed=0, global_step=lambda: step[0])
    # 2 full blocks of 4 (rows 9 and 10 of the order are dropped), each drawn 3 times: 6 optimizer steps
    assert len(sampler) == 24 and sampler.steps_per_epoch == 6
    order = list(sampler)
    assert order[0:4] == order[4:8] == order[8:12] and order[12:16] == order[16:20] == order[20:24]
    assert len(set(order)) == 8
    assert list(sampler) == order  # same epoch, same order
    step[0] = 6  # the next epoch starts at step 6 and shuffles anew
    assert list(sampler) != order and len(list(sampler)) == 24
    with pytest.raises(ValueError, match="only 3 rows"):
        RepeatBlockSampler(num_rows=3, block_size=4, repeats=2, seed=0, global_step=lambda: 0)


def test_rollout_reuse_serves_a_cycle_and_survives_a_checkpoint(tmp_path):
    reuse = RolloutReuse(num_iterations=3)  # cycles: steps 0-2, 3-5, ...

    def batch(tag):
        return RolloutBatch(torch.tensor([[tag]]), torch.ones(1, 1, dtype=torch.bool), torch.tensor([float(tag)]),
                            {"rl/reward": float(tag)}, torch.tensor([[-float(tag)]]))

    for slot in (0, 1):  # step 0, two accumulation slots: nothing kept yet
        assert reuse.take(0, slot) is None
        reuse.keep(0, slot, batch(10 + slot))
    assert reuse.take(1, 0).advantages.item() == 10.0  # step 1 reuses both slots
    assert reuse.take(1, 1).advantages.item() == 11.0
    reuse.save(str(tmp_path), rank=0)  # a checkpoint after step 1, inside the cycle
    restored = RolloutReuse(num_iterations=3)
    restored.load(str(tmp_path), rank=0, device="cpu")
    got = restored.take(2, 0)
    assert got.metrics == {"rl/reward": 10.0} and got.old_token_logprobs.item() == -10.0
    assert restored.take(2, 1).advantages.item() == 11.0
    # step 2 is the cycle's last: its rollouts are freed, and step 3 starts a new cycle
    assert restored.slots == {} and restored.take(3, 0) is None
    restored.save(str(tmp_path), rank=0)  # nothing kept: no file
    assert not (tmp_path / "rollout_buffer_rank0.pt").exists()


def test_rollout_source_numbers_the_micro_batches_of_each_step_and_hands_out_what_was_decoded_ahead():
    from hf_seqrl.trainers.services.generation import RolloutSource

    source = RolloutSource()
    assert [source.next_slot(4) for _ in range(3)] == [0, 1, 2]
    assert source.next_slot(5) == 0  # a new optimizer step starts again at slot 0
    source.hold(6, ["a", "b"])
    assert source.take(5, 0) is None  # held for another step
    assert source.take(6, 1) == "b" and source.take(6, 1) is None and source.take(6, 0) == "a"


# ---- in the trainer ----------------------------------------------------------------------------------------------

def test_one_iteration_is_the_plain_policy_gradient(tmp_path, monkeypatch):
    tok = byt5_tokenizer()
    results = []
    for name, extra in (("default", {}), ("mu1", dict(num_iterations=1, epsilon=0.01, epsilon_high=0.02))):
        model = tiny_model("t5", seed=4)
        trainer = SCSTTrainer(model=model, args=config(tmp_path / name, max_steps=2, num_samples=2, **extra),
                              reward_funcs=overlap_reward, train_dataset=equal_length_dataset(tok),
                              processing_class=tok)
        assert trainer.reuse is None and not isinstance(trainer._get_train_sampler(), RepeatBlockSampler)
        if name == "mu1":
            monkeypatch.setattr(base.losses, "clipped_policy_objective", None)  # never called with num_iterations=1
        trainer.train()
        logs = [h for h in trainer.state.log_history if "rl/pg_loss" in h]
        assert len(logs) == 2 and not any("rl/clip_fraction" in h for h in logs)
        results.append((params(model), [h["rl/pg_loss"] for h in logs]))
    assert results[0][1] == results[1][1]
    for key in results[0][0]:
        assert torch.equal(results[0][0][key], results[1][0][key]), key


@pytest.mark.parametrize("normalization", ["sequence", "token"])
def test_each_rollout_serves_num_iterations_clipped_steps(tmp_path, monkeypatch, normalization):
    tok = byt5_tokenizer()
    rollouts = count_rollouts(monkeypatch)
    model = tiny_model("t5", seed=4)
    before = params(model)
    args = config(tmp_path, max_steps=6, num_iterations=3, num_samples=2, learning_rate=5e-3, baseline="mean",
                  loss_normalization=normalization, epsilon=0.1, epsilon_high=0.3)
    trainer = ReinforceTrainer(model=model, args=args, reward_funcs=overlap_reward,
                               train_dataset=equal_length_dataset(tok, n=16), processing_class=tok)
    trainer.train()
    # 6 steps of 3 iterations: 2 rollouts, each on one batch that the sampler drew 3 times in a row
    assert len(rollouts) == 2 and not torch.equal(rollouts[0], rollouts[1])
    logs = [h for h in trainer.state.log_history if "rl/pg_loss" in h]
    assert len(logs) == 6
    # a cycle's first step is on-policy (ratio exactly 1, nothing clipped); the next ones see the updated model
    assert [h["rl/ratio_mean"] == 1.0 for h in logs] == [True, False, False, True, False, False]
    assert all(h["rl/clip_fraction"] == 0.0 for h in logs[::3])
    assert all(0.0 <= h["rl/clip_fraction"] <= 1.0 for h in logs)
    # the reused rollout's measurements are logged at each of its steps
    assert logs[0]["rl/reward"] == logs[1]["rl/reward"] == logs[2]["rl/reward"]
    after = params(model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert trainer.reuse.slots == {}  # freed after each cycle's last step


def test_gradient_accumulation_with_reused_rollouts_matches_large_batch(tmp_path, monkeypatch):
    # Deterministic rollouts (top_k=1 samples the argmax) so both runs see the same samples.
    tok = byt5_tokenizer()
    rollouts = count_rollouts(monkeypatch)
    results = []
    for bs, ga in [(4, 1), (2, 2)]:
        rollouts.clear()
        model = tiny_model("t5", seed=1)
        args = config(tmp_path / f"{bs}-{ga}", max_steps=4, per_device_train_batch_size=bs,
                      gradient_accumulation_steps=ga, top_k=1, baseline="none", rl_weight=0.5, num_iterations=2,
                      epsilon=0.05, optim="sgd", learning_rate=2.0, max_grad_norm=0.0)
        trainer = SCSTTrainer(model=model, args=args, reward_funcs=overlap_reward,
                              train_dataset=equal_length_dataset(tok), processing_class=tok)
        trainer.train()
        assert len(rollouts) == 2 * ga  # one per micro-batch, for each of the 2 cycles
        clipped = [h["rl/clip_fraction"] for h in trainer.state.log_history if "rl/clip_fraction" in h]
        results.append((params(model), clipped))
    assert max(results[0][1]) > 0  # the learning rate is large enough for the band to bind
    assert results[0][1] == pytest.approx(results[1][1], abs=1e-6)
    for key in results[0][0]:
        torch.testing.assert_close(results[0][0][key], results[1][0][key], atol=2e-6, rtol=1e-5)


def test_reuse_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="num_iterations must be >= 1"):
        config(tmp_path, num_iterations=0)
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        config(tmp_path, epsilon=0.0)
    with pytest.raises(ValueError, match="epsilon_high must be > 0"):
        config(tmp_path, epsilon_high=-0.1)
    with pytest.raises(ValueError, match="loss_normalization='tokens' is not one of"):
        config(tmp_path, loss_normalization="tokens")
    with pytest.raises(ValueError, match="set length_normalize=False"):
        config(tmp_path, loss_normalization="token", length_normalize=True)
    from datasets import IterableDataset

    tok = byt5_tokenizer()
    rows = equal_length_dataset(tok)
    stream = IterableDataset.from_generator(lambda: iter(rows))
    with pytest.raises(ValueError, match="num_iterations=2 .* map-style dataset"):
        SCSTTrainer(model=tiny_model("t5"), args=config(tmp_path, num_iterations=2), reward_funcs="chrf",
                    train_dataset=stream, processing_class=tok)


def test_resume_from_a_checkpoint_inside_a_cycle(tmp_path):
    tok = byt5_tokenizer()
    data = equal_length_dataset(tok, n=16)

    def run(resume=None):
        model = tiny_model("t5", seed=2)
        # cycles of 2 steps: checkpoint-3 falls after the first step of cycle 1 (steps 2-3); 2 accumulation slots
        args = config(tmp_path, max_steps=6, num_iterations=2, num_samples=2, per_device_train_batch_size=2,
                      gradient_accumulation_steps=2, save_strategy="steps", save_steps=3, warmup_xe_steps=1)
        trainer = ReinforceTrainer(model=model, args=args, reward_funcs=overlap_reward, train_dataset=data,
                                   processing_class=tok)
        trainer.train(resume_from_checkpoint=resume)
        rewards = [h["rl/reward"] for h in trainer.state.log_history if "rl/reward" in h and h["step"] > 3]
        return params(model), rewards, trainer.baseline_ema

    full = run()
    checkpoint = tmp_path / "out" / "checkpoint-3"
    assert (checkpoint / "rollout_buffer_rank0.pt").exists()
    assert not (tmp_path / "out" / "checkpoint-6" / "rollout_buffer_rank0.pt").exists()  # a cycle ended there
    resumed = run(resume=str(checkpoint))
    for key in full[0]:
        assert torch.equal(resumed[0][key], full[0][key]), key
    assert resumed[1] == full[1] and resumed[2] == full[2]
    # Without the saved rollout, step 3 samples anew from the resumed model: a different run.
    (checkpoint / "rollout_buffer_rank0.pt").unlink()
    fresh = run(resume=str(checkpoint))
    assert any(not torch.equal(fresh[0][key], full[0][key]) for key in full[0])
