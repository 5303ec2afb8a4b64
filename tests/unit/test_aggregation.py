"""`normalized_sum`: each reward's advantages normalized over a source's samples, then weighted (GDPO)."""

import math

import torch

from hf_seqrl.functional.advantages import normalized_sum


def test_normalized_sum_by_hand():
    # One source, three samples, two rewards of very different scales:
    #   reward a (BLEU-like, 0-1):     advantages [0.1, 0.0, -0.1] -> std 0.1 -> [1, 0, -1]
    #   reward b (length, 0-100):      advantages [-20, 10, 10]    -> std sqrt((400 + 100 + 100) / 2) = sqrt(300)
    # weights 0.5, 0.5: 0.5 * [1, 0, -1] + 0.5 * [-20, 10, 10] / 17.3205
    adv = torch.tensor([[0.1, 0.0, -0.1], [-20.0, 10.0, 10.0]], dtype=torch.float64)
    present = torch.ones(2, 3, dtype=torch.bool)
    out = normalized_sum(adv, torch.tensor([0.5, 0.5], dtype=torch.float64), 3, present)
    s = math.sqrt(300)
    torch.testing.assert_close(out, torch.tensor([0.5 - 10 / s, 5 / s, -0.5 + 5 / s], dtype=torch.float64))
    # Summed first, reward b alone orders the samples (1 and 2 tie at 5 and 4.95); normalized, reward a's preference
    # for sample 1 over sample 2 counts as much as b's
    assert out[1] > out[2]


def test_a_reward_without_a_value_adds_nothing_and_a_flat_one_is_left_unscaled():
    # Reward a gives no value to sample 2 (present false): its std is over samples 0 and 1 only:
    #   [0.2, -0.2] -> std sqrt(0.08) = 0.2828 -> [0.7071, -0.7071], sample 2 adds 0
    # Reward b is the same for every sample (advantages 0, std 0): left as 0.
    adv = torch.tensor([[0.2, -0.2, 5.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    present = torch.tensor([[True, True, False], [True, True, True]])
    out = normalized_sum(adv, torch.tensor([1.0, 3.0], dtype=torch.float64), 3, present)
    r = 0.2 / math.sqrt(0.08)
    torch.testing.assert_close(out, torch.tensor([r, -r, 0.0], dtype=torch.float64))


def test_sources_are_normalized_apart():
    # Two sources of two samples each; reward a's advantages [1, -1 | 10, -10] -> std sqrt(2), 10 sqrt(2):
    # both sources get [0.7071, -0.7071]
    adv = torch.tensor([[1.0, -1.0, 10.0, -10.0]], dtype=torch.float64)
    out = normalized_sum(adv, torch.tensor([1.0], dtype=torch.float64), 2, torch.ones(1, 4, dtype=torch.bool))
    r = 1 / math.sqrt(2)
    torch.testing.assert_close(out, torch.tensor([r, -r, r, -r], dtype=torch.float64))
