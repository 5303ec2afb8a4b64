"""The clipped surrogate at the sequence level (GSPO), with `delta` (two-sided clipping), and at ratio 1: hand-computed
values and autograd of the explicit objective."""

import math

import pytest
import torch

from hf_seqrl import losses


def example():
    # old log-probs -1; current token ratios
    #   row 0 (A = +2): [1.5, 1.0, 0.5]
    #   row 1 (A = -1): [0.5, 1.1, 1.5]
    ratios = torch.tensor([[1.5, 1.0, 0.5], [0.5, 1.1, 1.5]], dtype=torch.float64)
    old = torch.full((2, 3), -1.0, dtype=torch.float64)
    lp = (old + ratios.log()).requires_grad_(True)
    return lp, old, torch.ones(2, 3, dtype=torch.bool), torch.tensor([2.0, -1.0], dtype=torch.float64)


def test_sequence_ratio_by_hand():
    lp, old, mask, adv = example()
    # s_0 = exp((ln 1.5 + ln 1 + ln 0.5) / 3) = 0.75^(1/3) = 0.9086 (inside [0.8, 1.2]): term 2 * 0.9086
    # s_1 = exp((ln 0.5 + ln 1.1 + ln 1.5) / 3) = 0.825^(1/3) = 0.9379 (inside): term -0.9379
    s0, s1 = 0.75 ** (1 / 3), 0.825 ** (1 / 3)
    out = losses.clipped_policy_objective(lp, old, mask, adv, 0.2, importance_sampling_level="sequence")
    assert out.loss.item() == pytest.approx(-(2 * s0 - s1) / 2, abs=1e-12)
    assert out.clip_fraction.item() == 0.0
    assert out.ratio_mean.item() == pytest.approx((s0 + s1) / 2)
    assert (out.ratio_min.item(), out.ratio_max.item()) == (pytest.approx(s0), pytest.approx(s1))
    out.loss.backward()
    # d(-(2 s_0 - s_1)/2)/d lp_0t = -s_0 / 3 (each token of row 0: ds/dlp_t = s / 3); row 1: +s_1 / 6
    expected = torch.tensor([[-s0 / 3] * 3, [s1 / 6] * 3], dtype=torch.float64)
    torch.testing.assert_close(lp.grad, expected)


def test_sequence_ratio_is_clipped_per_sequence():
    lp, old, mask, adv = example()
    # epsilon 0.05: band [0.95, 1.05]; s_0 = 0.9086 < 0.95 with A > 0: min(s A, 0.95 A) = s A, not clipped;
    # s_1 = 0.9379 < 0.95 with A < 0: min(-s_1, -0.95) = -0.95, clipped (no gradient for row 1)
    s0 = 0.75 ** (1 / 3)
    out = losses.clipped_policy_objective(lp, old, mask, adv, 0.05, importance_sampling_level="sequence")
    assert out.loss.item() == pytest.approx(-(2 * s0 - 0.95) / 2)
    assert out.clip_fraction.item() == 0.5
    out.loss.backward()
    assert lp.grad[1].abs().max().item() == 0.0 and lp.grad[0].abs().min().item() > 0


def test_delta_caps_the_ratio_of_negative_advantages_token_level():
    lp, old, mask, adv = example()
    # band [0.8, 1.2], delta 1.4. Row 1 (A = -1): 0.5 -> -0.8 (clipped), 1.1 -> -1.1, 1.5 -> min(-1.4, -1.2) = -1.4
    # (capped: clipped, no gradient). Row 0 as without delta: 2.4 + 2 + 1 = 5.4. Loss -mean(5.4, -3.3) = -1.05.
    out = losses.clipped_policy_objective(lp, old, mask, adv, 0.2, delta=1.4)
    assert out.loss.item() == pytest.approx(-1.05)
    assert out.clip_fraction.item() == pytest.approx(3 / 6)
    out.loss.backward()
    assert lp.grad[1, 2].item() == 0.0 and lp.grad[1, 1].item() == pytest.approx(0.55)
    # without delta the 1.5 of row 1 keeps its gradient: -rho A / 2 = 0.75
    lp.grad = None
    losses.clipped_policy_objective(lp, old, mask, adv, 0.2).loss.backward()
    assert lp.grad[1, 2].item() == pytest.approx(0.75)


def test_delta_at_the_sequence_level():
    lp, old, mask, adv = example()
    # Row 1's ratios scaled by 2: s_1 = 2 * 0.9379 = 1.8758; with A = -1 the unclipped term -1.8758 is taken, capped at
    # delta 1.5: min(-1.5, -1.2) = -1.5 (clipped); row 0 unchanged.
    lp2 = (lp.detach() + torch.tensor([[0.0] * 3, [math.log(2)] * 3], dtype=torch.float64)).requires_grad_(True)
    s0 = 0.75 ** (1 / 3)
    out = losses.clipped_policy_objective(lp2, old, mask, adv, 0.2, importance_sampling_level="sequence", delta=1.5)
    assert out.loss.item() == pytest.approx(-(2 * s0 - 1.5) / 2)
    assert out.clip_fraction.item() == 0.5


def explicit_objective(lp, old, mask, adv, epsilon, level, delta=None):
    """The clipped objective written out sequence by sequence, token by token (no masking tricks)."""
    terms = []
    for i in range(lp.shape[0]):
        tokens = mask[i].nonzero().squeeze(1)
        if level == "sequence":
            ratio = torch.exp((lp[i, tokens] - old[i, tokens]).mean())
            capped = ratio if delta is None else torch.clamp(ratio, max=delta)
            terms.append(-torch.minimum(capped * adv[i], ratio.clamp(1 - epsilon, 1 + epsilon) * adv[i]))
        else:
            total = 0
            for t in tokens:
                ratio = torch.exp(lp[i, t] - old[i, t])
                capped = ratio if delta is None else torch.clamp(ratio, max=delta)
                total = total - torch.minimum(capped * adv[i], ratio.clamp(1 - epsilon, 1 + epsilon) * adv[i])
            terms.append(total)
    return torch.stack(terms).mean()


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("delta", [None, 1.3])
def test_loss_and_gradient_equal_autograd_of_the_explicit_objective(level, delta):
    generator = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 5, generator=generator, dtype=torch.float64) * 3
    lp = (old + torch.randn(6, 5, generator=generator, dtype=torch.float64) * 0.3).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0],
                         [1, 1, 1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0, 0.0, 1.5], dtype=torch.float64)
    out = losses.clipped_policy_objective(lp, old, mask, adv, 0.2, importance_sampling_level=level, delta=delta)
    (grad,) = torch.autograd.grad(out.loss, lp)
    lp2 = lp.detach().clone().requires_grad_(True)
    explicit = explicit_objective(lp2, old, mask, adv, 0.2, level, delta)
    (explicit_grad,) = torch.autograd.grad(explicit, lp2)
    torch.testing.assert_close(out.loss, explicit)
    torch.testing.assert_close(grad, explicit_grad)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_at_ratio_one_nothing_is_clipped_and_the_gradient_is_the_policy_gradients(level):
    # Learning rate 0: the current log-probs are the old ones.
    generator = torch.Generator().manual_seed(1)
    lp = (-torch.rand(4, 3, generator=generator, dtype=torch.float64) * 2).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0], dtype=torch.float64)
    out = losses.clipped_policy_objective(lp, lp.detach(), mask, adv, 0.2, importance_sampling_level=level,
                                          delta=1.5)
    assert out.clip_fraction.item() == 0.0
    assert out.ratio_mean.item() == out.ratio_min.item() == out.ratio_max.item() == 1.0
    (grad,) = torch.autograd.grad(out.loss, lp)
    # token level: the policy gradient's; sequence level: the length-normalized policy gradient's
    pg = losses.policy_gradient_loss(lp, mask, adv, length_normalize=level == "sequence")
    (pg_grad,) = torch.autograd.grad(pg, lp)
    torch.testing.assert_close(grad, pg_grad)


def test_sequence_level_refuses_token_normalization():
    lp, old, mask, adv = example()
    with pytest.raises(ValueError, match="loss_normalization='sequence' and length_normalize=False"):
        losses.clipped_policy_objective(lp, old, mask, adv, 0.2, loss_normalization="token",
                                        importance_sampling_level="sequence")
    with pytest.raises(ValueError, match="importance_sampling_level='word' is not one of"):
        losses.clipped_policy_objective(lp, old, mask, adv, 0.2, importance_sampling_level="word")
