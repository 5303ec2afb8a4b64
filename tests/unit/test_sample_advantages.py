"""`sample_advantages`: rewards to advantages, by hand (baselines, left-out samples, centering, scaling)."""

import math

import pytest
import torch

from hf_seqrl.functional.advantages import AdvantageSettings, sample_advantages

REWARDS = torch.tensor([0.5, 0.2, 0.9, 0.1])  # two sources, two samples each
LEFT_OUT = torch.tensor([False, False, False, True])


def close(tensor, values):
    return torch.allclose(tensor, torch.tensor(values), atol=1e-6)


def test_leave_one_out_mean_leaves_out_the_sample_without_a_reward():
    adv, base, kept = sample_advantages(REWARDS, LEFT_OUT, 2, AdvantageSettings("mean"))
    # source 0: 0.5 - 0.2, 0.2 - 0.5; source 1: the one kept sample has no kept sibling (its own reward, advantage 0)
    assert close(adv, [0.3, -0.3, 0.0, 0.0]) and close(base[:3], [0.2, 0.5, 0.9])
    assert kept.tolist() == [True, True, True, False]


def test_greedy_baseline_leaves_out_the_samples_of_a_source_without_a_greedy_reward_then_centers():
    greedy, greedy_out = torch.tensor([0.4, 0.6]), torch.tensor([False, True])
    adv, _, kept = sample_advantages(REWARDS, LEFT_OUT, 2, AdvantageSettings("greedy"), greedy=greedy,
                                     greedy_left_out=greedy_out)
    assert close(adv, [0.1, -0.2, 0.0, 0.0]) and kept.tolist() == [True, True, False, False]
    adv, _, _ = sample_advantages(REWARDS, LEFT_OUT, 2, AdvantageSettings("greedy", center=True), greedy=greedy,
                                  greedy_left_out=greedy_out)
    assert close(adv, [0.15, -0.15, 0.0, 0.0])  # the kept mean, -0.05, taken off


def test_moving_average_takes_the_state_or_this_batchs_kept_mean():
    adv, base, _ = sample_advantages(REWARDS, LEFT_OUT, 2, AdvantageSettings("moving_average"), moving_average=0.3)
    assert close(adv, [0.2, -0.1, 0.6, 0.0]) and close(base, [0.3] * 4)
    adv, _, _ = sample_advantages(REWARDS, LEFT_OUT, 2, AdvantageSettings("moving_average"))
    mean = (0.5 + 0.2 + 0.9) / 3
    assert close(adv, [0.5 - mean, 0.2 - mean, 0.9 - mean, 0.0])


def test_truncated_samples_are_left_out_only_when_asked():
    cut = torch.tensor([False, True, False, False])
    none = torch.zeros(4, dtype=torch.bool)
    adv, _, kept = sample_advantages(REWARDS, none, 2, AdvantageSettings("none", mask_truncated=True), truncated=cut)
    assert close(adv, [0.5, 0.0, 0.9, 0.1]) and kept.tolist() == [True, False, True, True]
    adv, _, kept = sample_advantages(REWARDS, none, 2, AdvantageSettings("none"), truncated=cut)
    assert kept.all() and close(adv, REWARDS.tolist())


def test_group_and_batch_scaling():
    rewards, none = torch.tensor([1.0, 3.0, 2.0, 2.0]), torch.zeros(4, dtype=torch.bool)
    adv, _, _ = sample_advantages(rewards, none, 2, AdvantageSettings("none", scale="group"))
    # source 0: std sqrt(2); source 1: std 0, left as it is
    assert close(adv, [1 / math.sqrt(2), 3 / math.sqrt(2), 2.0, 2.0])
    # the batch's moments summed over two processes holding the same values: std of the 8 values, sqrt(4 / 7)
    adv, _, _ = sample_advantages(rewards, none, 2, AdvantageSettings("none", scale="batch"), add_up=lambda t: 2 * t)
    assert close(adv, (rewards / math.sqrt(4 / 7)).tolist())


def test_normalize_then_sum_scales_each_reward_over_its_source():
    parts = torch.tensor([[1.0, 3.0, 0.0, 2.0], [10.0, 10.0, float("nan"), 40.0]])
    weights = torch.tensor([1.0, 0.5])
    none = torch.zeros(4, dtype=torch.bool)
    adv, _, _ = sample_advantages(parts.nan_to_num(0).sum(0), none, 2,
                                  AdvantageSettings("none", aggregation="normalize_then_sum"), parts=parts,
                                  weights=weights)
    # reward 0: source 0 std sqrt(2), source 1 std sqrt(2); reward 1: source 0 std 0 (unscaled), source 1 one value
    s = math.sqrt(2)
    assert close(adv, [1 / s + 0.5 * 10, 3 / s + 0.5 * 10, 0.0, 2 / s + 0.5 * 40])
