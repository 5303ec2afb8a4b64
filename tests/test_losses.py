"""Unit tests of hf_seqrl.losses with hand-computed tensors."""

import math

import pytest
import torch

from hf_seqrl import losses


def test_masked_sum_and_mean():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    # row 0: 1 + 2 = 3, mean 1.5; row 1: nothing counts -> 0 (no division by zero)
    assert losses.masked_sum(x, mask).tolist() == [3.0, 0.0]
    assert losses.masked_mean(x, mask).tolist() == [1.5, 0.0]
    # over dim 0: column sums of kept entries [1, 2, 0]
    assert losses.masked_sum(x, mask, dim=0).tolist() == [1.0, 2.0, 0.0]


def test_advantages_detach_and_broadcast():
    r = torch.tensor([0.5, 1.0], requires_grad=True)
    adv = losses.advantages(r, torch.tensor([0.25, 0.25]))
    assert adv.tolist() == [0.25, 0.75]
    assert not adv.requires_grad
    assert losses.advantages(torch.tensor([1.0, 2.0]), 0.5).tolist() == [0.5, 1.5]


def test_leave_one_out_baseline():
    # source 0: [1, 2, 3] -> b = [(2+3)/2, (1+3)/2, (1+2)/2] = [2.5, 2, 1.5]; source 1: [0, 0, 6] -> [3, 3, 0]
    r = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 6.0])
    assert losses.leave_one_out_baseline(r, 3).tolist() == [2.5, 2.0, 1.5, 3.0, 3.0, 0.0]
    with pytest.raises(ValueError, match="num_samples >= 2"):
        losses.leave_one_out_baseline(r, 1)
    with pytest.raises(ValueError, match="multiple"):
        losses.leave_one_out_baseline(r, 4)


def test_scale_advantages():
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    # std (unbiased) = sqrt(4/3)
    torch.testing.assert_close(losses.scale_advantages(adv), adv / math.sqrt(4 / 3))
    const = torch.zeros(4)
    assert losses.scale_advantages(const).tolist() == [0.0] * 4  # no NaN from a zero std


def test_center_advantages():
    adv = torch.tensor([1.0, 2.0, 3.0, 6.0])
    assert losses.center_advantages(adv).tolist() == [-2.0, -1.0, 0.0, 3.0]
    # a left-out sample (non-finite reward, advantage 0) neither counts in the mean nor gets one
    keep = torch.tensor([True, True, False, True])
    assert losses.center_advantages(torch.tensor([1.0, 2.0, 0.0, 6.0]), keep).tolist() == [-2.0, -1.0, 0.0, 3.0]
    nothing = torch.zeros(3, dtype=torch.bool)
    assert losses.center_advantages(torch.zeros(3), nothing).tolist() == [0.0] * 3
    assert losses.center_advantages(torch.tensor([0.7])).tolist() == [0.0]


def test_moving_average():
    assert losses.moving_average(None, 0.4, 0.9) == 0.4
    assert losses.moving_average(0.5, 1.0, 0.9) == pytest.approx(0.55)


def test_policy_gradient_loss_value_and_gradient():
    lp = torch.tensor([[-1.0, -2.0, -5.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([2.0, -1.0])
    # sums: [-3, -1.5]; loss = -mean(2*-3, -1*-1.5) = -mean(-6, 1.5) = 2.25
    loss = losses.policy_gradient_loss(lp, mask, adv)
    assert loss.item() == pytest.approx(2.25)
    loss.backward()
    # d/dlp = -adv_i / 2 at kept positions, 0 at masked ones
    assert lp.grad.tolist() == [[-1.0, -1.0, 0.0], [0.5, 0.5, 0.5]]
    # length-normalized: means [-1.5, -0.5]; loss = -mean(-3, 0.5) = 1.25
    assert losses.policy_gradient_loss(lp, mask, adv, length_normalize=True).item() == pytest.approx(1.25)


def test_mix_losses():
    rl, xe = torch.tensor(2.0), torch.tensor(4.0)
    assert losses.mix_losses(rl, xe, 0.25).item() == pytest.approx(0.25 * 2 + 0.75 * 4)
    assert losses.mix_losses(rl, None, 1.0).item() == 2.0
    assert losses.mix_losses(rl, xe, 0.0).item() == 4.0
    with pytest.raises(ValueError, match="xe_loss"):
        losses.mix_losses(rl, None, 0.5)


def test_token_logprobs_entropy_kl():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]]))
    ids = torch.tensor([[0, 2]])
    torch.testing.assert_close(losses.token_logprobs_from_logits(logits, ids),
                               torch.log(torch.tensor([[0.5, 0.8]])))
    # temperature 2: softmax(log p / 2) ∝ sqrt(p): [sqrt(.5), sqrt(.25), sqrt(.25)] normalized
    s = torch.tensor([0.5, 0.25, 0.25]).sqrt()
    expected = torch.log(s[0] / s.sum())
    assert losses.token_logprobs_from_logits(logits, ids, temperature=2.0)[0, 0].item() == pytest.approx(
        expected.item(), abs=1e-6)
    # entropy of [.5,.25,.25] = 1.5 bits = 1.5 ln 2
    assert losses.token_entropy(logits)[0, 0].item() == pytest.approx(1.5 * math.log(2), abs=1e-6)
    # KL([.5,.25,.25] || uniform) = ln 3 - H
    uniform = torch.zeros_like(logits)
    assert losses.token_kl(logits, uniform)[0, 0].item() == pytest.approx(math.log(3) - 1.5 * math.log(2),
                                                                          abs=1e-6)
    assert losses.token_kl(logits, logits).abs().max().item() < 1e-6


def test_cross_entropy_ignores_padding():
    logits = torch.log(torch.tensor([[[0.5, 0.5], [0.9, 0.1]]]))
    labels = torch.tensor([[0, -100]])
    assert losses.cross_entropy(logits, labels).item() == pytest.approx(math.log(2))


def test_token_logprobs_equal_full_log_softmax_gather():
    # The lean path (gather - logsumexp) gives the same values and gradients as a full log-softmax.
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(6, 5, 50, generator=gen) * 4).requires_grad_(True)
    ids = torch.randint(0, 50, (6, 5), generator=gen)
    lean = losses.token_logprobs_from_logits(logits, ids, temperature=0.7)
    (g_lean,) = torch.autograd.grad(lean.sum(), logits)
    full = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    (g_full,) = torch.autograd.grad(full.sum(), logits)
    torch.testing.assert_close(lean, full, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(g_lean, g_full, atol=1e-6, rtol=1e-6)
