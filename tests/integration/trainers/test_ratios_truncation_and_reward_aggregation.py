"""TRL's policy-update options on the policy-gradient trainers: `importance_sampling_level`, `delta` and
`mask_truncated_completions`."""

from functools import partial

import pytest
import torch

from helpers import byt5_tokenizer, make_config, params, step_context, tiny_model, toy_dataset, toy_pairs
from hf_seqrl import SCSTTrainer, SeqRLConfig
from hf_seqrl.models.tokens import cut_at_limit
from hf_seqrl.types import BatchText, Rollout

config = partial(make_config, SeqRLConfig, num_samples=2, baseline="mean")  # config(tmp_path, **overrides)


def length_reward(predictions, references, sources=None, **columns):
    return [min(len(p), 12) / 12 for p in predictions]


def trainer_for(tmp_path, reward=length_reward, **settings):
    tokenizer = byt5_tokenizer()
    src, tgt = toy_pairs(8, seed=2, alphabet="abcd", lengths=(3, 5))
    return SCSTTrainer(model=tiny_model("t5"), args=config(tmp_path, **settings), reward_funcs=reward,
                       processing_class=tokenizer, train_dataset=toy_dataset(tokenizer, src, tgt))


def test_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="importance_sampling_level='sequence' .* set loss_normalization='sequence'"):
        config(tmp_path, importance_sampling_level="sequence", loss_normalization="token")
    with pytest.raises(ValueError, match="importance_sampling_level='sequence' .* length_normalize=False"):
        config(tmp_path, importance_sampling_level="sequence", length_normalize=True)
    with pytest.raises(ValueError, match="importance_sampling_level='tokens' is not one of"):
        config(tmp_path, importance_sampling_level="tokens")
    with pytest.raises(ValueError, match=r"delta=1.1 must exceed 1 \+ epsilon_high = 1.3"):
        config(tmp_path, delta=1.1, epsilon_high=0.3)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_reused_rollouts_train_through_either_ratio_and_log_it(tmp_path, level):
    trainer = trainer_for(tmp_path, num_iterations=2, max_steps=4, learning_rate=1e-2,
                          importance_sampling_level=level, delta=2.0)
    before = params(trainer.model)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rl/ratio_mean" in h]
    assert len(logs) == 4
    for first, second in (logs[0:2], logs[2:4]):  # each rollout: ratio 1 on its first step, moved on its second
        assert first["rl/ratio_min"] == first["rl/ratio_max"] == 1.0 and first["rl/clip_fraction"] == 0.0
        assert second["rl/ratio_min"] < second["rl/ratio_max"]
    assert any(not torch.equal(before[k], v) for k, v in params(trainer.model).items())


def test_sequence_level_trains_on_a_rollout_used_once(tmp_path):
    # num_iterations=1: the sequence ratio is 1, its gradient the length-normalized policy gradient's.
    trainer = trainer_for(tmp_path, max_steps=2, learning_rate=1e-2, importance_sampling_level="sequence")
    before = params(trainer.model)
    trainer.train()
    assert any(not torch.equal(before[k], v) for k, v in params(trainer.model).items())


def test_truncated_samples_leave_the_loss_and_their_siblings_baselines(tmp_path):
    values = {"aa": 0.2, "bbb": 0.9, "c": 0.6}
    trainer = trainer_for(tmp_path, reward=lambda predictions, **kw: [values[p] for p in predictions],
                          num_samples=3, mask_truncated_completions=True)
    tokenizer = trainer.processing_class

    def row(text, ended):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if ended else [])
        return ids + [tokenizer.pad_token_id] * (4 - len(ids))

    # One source, three samples: "aa" ends with EOS, "bbb" is cut at the length limit (no EOS), "c" ends.
    ids = torch.tensor([row("aa", True), row("bbb", False), row("c", True)])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    text = BatchText([["ref"]], ["src"], {})
    cut = cut_at_limit(ids, mask, [tokenizer.eos_token_id], limit=4)
    assert cut.tolist() == [False, True, False]
    batch = trainer.sample_advantages(Rollout(ids, mask, None, None, 3, cut), step_context(trainer, text))
    # leave-one-out over the kept samples only: "aa" against "c" and back; the cut one gets no advantage
    torch.testing.assert_close(batch.advantages, torch.tensor([0.2 - 0.6, 0.0, 0.6 - 0.2]))
    assert batch.kept.tolist() == [True, False, True]
    assert batch.metrics["rl/frac_truncated"] == pytest.approx(1 / 3)  # still counted
    assert batch.loss_mask[1].sum().item() == 0


def test_when_every_sample_is_cut_nothing_trains(tmp_path):
    # Two new tokens for targets of 3-5 letters: every sample hits the limit. Masked, the policy loss has no sample,
    # and neither have the entropy bonus and the KL term (an entropy over the cut samples would still train).
    masked = trainer_for(tmp_path, max_steps=2, learning_rate=1e-2, max_new_tokens=2, mask_truncated_completions=True,
                         entropy_coef=0.05, kl_coef=0.1)
    before = params(masked.model)
    masked.train()
    logs = [h for h in masked.state.log_history if "rl/frac_truncated" in h]
    assert all(h["rl/frac_truncated"] == 1.0 and h["rl/pg_loss"] == 0.0 for h in logs)
    assert not any("rl/entropy" in h or "rl/kl" in h for h in logs)  # nothing measured, nothing logged
    assert all(torch.equal(before[k], v) for k, v in params(masked.model).items())
    kept = trainer_for(tmp_path / "kept", max_steps=2, learning_rate=1e-2, max_new_tokens=2)
    before = params(kept.model)
    kept.train()
    assert any(not torch.equal(before[k], v) for k, v in params(kept.model).items())


def test_normalize_then_sum_weighs_each_reward_by_its_own_spread(tmp_path):
    small = {"aa": 0.1, "bbb": 0.0, "c": -0.1}  # a BLEU-like reward
    large = {"aa": -20.0, "bbb": 10.0, "c": 10.0}  # a length-like one, 200 times the spread
    rewards = [lambda predictions, **kw: [small[p] for p in predictions],
               lambda predictions, **kw: [large[p] for p in predictions]]
    trainer = trainer_for(tmp_path, reward=rewards, num_samples=3, baseline="none",
                          multi_objective_aggregation="normalize_then_sum")
    tokenizer = trainer.processing_class
    ids = torch.tensor([tokenizer(t)["input_ids"] + [0] * (4 - len(t) - 1) for t in ("aa", "bbb", "c")])
    batch = trainer.sample_advantages(Rollout(ids, ids != 0, None, None, 3, torch.zeros(ids.shape[0], dtype=torch.bool)), step_context(trainer, BatchText([["ref"]], ["src"], {})))
    # baseline none: the advantages are the values; normalized per reward over the 3 samples (unbiased std) and
    # weighted 1/2 each: 0.5 * [0.1, 0, -0.1] / 0.1 + 0.5 * [-20, 10, 10] / sqrt(300)
    s = 300 ** 0.5
    torch.testing.assert_close(batch.advantages, torch.tensor([0.5 - 10 / s, 5 / s, -0.5 + 5 / s]))
    with pytest.raises(ValueError, match="normalize_then_sum.*needs num_samples >= 2"):
        config(tmp_path, num_samples=1, baseline="none", multi_objective_aggregation="normalize_then_sum")
    with pytest.raises(ValueError, match="normalize_then_sum.*the baseline is 'moving_average' \\(the trainer's default"):
        from hf_seqrl import ReinforceTrainer

        ReinforceTrainer(model=tiny_model("t5"), args=config(tmp_path, baseline=None,
                                                             multi_objective_aggregation="normalize_then_sum"),
                         reward_funcs=rewards, processing_class=tokenizer,
                         train_dataset=toy_dataset(tokenizer, ["ab"] * 4, ["ba"] * 4))


def test_length_ratio_is_logged_against_the_closest_reference(tmp_path):
    trainer = trainer_for(tmp_path, reward=lambda predictions, **kw: [0.5] * len(predictions), num_samples=3)
    tokenizer = trainer.processing_class
    texts = ("a a", "b", "c c c c c c")
    width = max(len(t) for t in texts) + 1
    ids = torch.tensor([tokenizer(t)["input_ids"] + [0] * (width - len(t) - 1) for t in texts])
    # references of 2 and 5 words: "a a" (2) -> 2/2 = 1, "b" (1) -> 1/2 (2 is closest), 6 words -> 6/5 = 1.2
    text = BatchText([["one two", "one two three four five"]], ["src"], {})
    batch = trainer.sample_advantages(Rollout(ids, ids != 0, None, None, 3, torch.zeros(ids.shape[0], dtype=torch.bool)), step_context(trainer, text))
    assert batch.metrics["rl/length_ratio"] == pytest.approx((1 + 0.5 + 1.2) / 3)


def test_the_logged_ratio_range_is_the_windows_extremes(tmp_path, monkeypatch):
    import hf_seqrl.objectives.policy_gradient as policy_gradient

    seen, objective = [], policy_gradient.losses.clipped_policy_objective

    def recording(*args, **kwargs):
        out = objective(*args, **kwargs)
        seen.append((out.ratio_min.item(), out.ratio_max.item()))
        return out

    monkeypatch.setattr(policy_gradient.losses, "clipped_policy_objective", recording)
    # A window of 2 steps = one rollout's two updates: ratios exactly 1 on the first, moved on the second.
    trainer = trainer_for(tmp_path, num_iterations=2, max_steps=4, learning_rate=5e-2, logging_steps=2)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rl/ratio_min" in h]
    assert len(logs) == 2 and len(seen) == 4
    for log, window in zip(logs, (seen[0:2], seen[2:4])):
        assert log["rl/ratio_min"] == min(low for low, _ in window) < 1.0  # the mean would sit between
        assert log["rl/ratio_max"] == max(high for _, high in window) > 1.0


def test_normalize_then_sum_normalizes_a_single_reward_too(tmp_path):
    values = {"aa": 0.3, "bbb": 0.0, "c": 0.0}
    tokenizer = byt5_tokenizer()
    ids = torch.tensor([tokenizer(t)["input_ids"] + [0] * (4 - len(t) - 1) for t in ("aa", "bbb", "c")])
    text = BatchText([["ref"]], ["src"], {})
    for weights, scale in ((None, 1.0), ([2.0], 2.0)):
        trainer = trainer_for(tmp_path, reward=lambda predictions, **kw: [values[p] for p in predictions],
                              num_samples=3, baseline="none", multi_objective_aggregation="normalize_then_sum",
                              reward_weights=weights)
        batch = trainer.sample_advantages(Rollout(ids, ids != 0, None, None, 3, torch.zeros(ids.shape[0], dtype=torch.bool)), step_context(trainer, text))
        # [0.3, 0, 0] over its unbiased std over the 3 samples, sqrt(0.03), times the weight
        expected = scale * torch.tensor([0.3, 0.0, 0.0]) / 0.03 ** 0.5
        torch.testing.assert_close(batch.advantages, expected)
