"""The distillation divergences by hand: forward KL, reverse KL and the generalized JSD between two distributions
over three tokens, with bans and temperature, and the on-policy reverse KL's per-token advantages."""

import math

import pytest
import torch

from hf_seqrl.functional.divergences import forward_kl, generalized_jsd, reverse_kl, reverse_kl_advantages
from hf_seqrl.functional.divergences import check_beta


def logits_of(probs):
    return torch.tensor(probs, dtype=torch.float64).log()


S, T = [0.5, 0.25, 0.25], [0.25, 0.25, 0.5]  # student, teacher


def kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q) if a > 0)


def test_forward_and_reverse_kl_by_hand():
    s, t = logits_of(S), logits_of(T)
    # KL(t || s) = .25 ln(.5) + .25 ln(1) + .5 ln(2) = .25 ln 2; KL(s || t) = .5 ln 2 + 0 + .25 ln(.5) = .25 ln 2
    assert math.isclose(forward_kl(s, t).item(), 0.25 * math.log(2), rel_tol=1e-12)
    assert math.isclose(reverse_kl(s, t).item(), 0.25 * math.log(2), rel_tol=1e-12)
    uneven = [0.7, 0.2, 0.1]
    assert math.isclose(forward_kl(logits_of(uneven), t).item(), kl(T, uneven), rel_tol=1e-12)
    assert math.isclose(reverse_kl(logits_of(uneven), t).item(), kl(uneven, T), rel_tol=1e-12)


def test_generalized_jsd_by_hand():
    s, t = logits_of(S), logits_of(T)
    beta = 0.25
    m = [(1 - beta) * a + beta * b for a, b in zip(S, T)]  # (1 - beta) p_s + beta p_t
    expected = beta * kl(T, m) + (1 - beta) * kl(S, m)
    assert math.isclose(generalized_jsd(s, t, beta).item(), expected, rel_tol=1e-12)
    # beta = 0.5: the symmetric Jensen-Shannon divergence
    m = [(a + b) / 2 for a, b in zip(S, T)]
    assert math.isclose(generalized_jsd(s, t, 0.5).item(), (kl(S, m) + kl(T, m)) / 2, rel_tol=1e-12)
    assert generalized_jsd(s, s, 0.3).abs().item() < 1e-15


def test_temperature_divides_both_logits_and_bans_renormalize():
    s = torch.tensor([[2.0, 0.0, 1.0]], dtype=torch.float64)
    t = torch.tensor([[0.0, 2.0, 1.0]], dtype=torch.float64)
    hot = reverse_kl(s, t, temperature=2.0)
    assert torch.allclose(hot, reverse_kl(s / 2, t / 2))
    banned = torch.tensor([False, False, True])
    # Token 2 out: p_s = softmax(2, 0) = (e^2, 1)/(e^2 + 1), p_t its mirror image
    a = math.exp(2) / (math.exp(2) + 1)
    assert math.isclose(reverse_kl(s, t, banned=banned).item(), kl([a, 1 - a], [1 - a, a]), rel_tol=1e-12)
    assert math.isclose(forward_kl(s, t, banned=banned).item(), kl([1 - a, a], [a, 1 - a]), rel_tol=1e-12)
    # JSD(0.5) with token 2 out: m = (1/2, 1/2), and both KLs to m are KL((a, 1-a) || (1/2, 1/2)) by symmetry
    half = kl([a, 1 - a], [0.5, 0.5])
    assert math.isclose(generalized_jsd(s, t, 0.5, banned=banned).item(), half, rel_tol=1e-12)
    # Distributions that are not mirror images, at temperature 2 with the ban: p_s = softmax(1, 0),
    # p_t = softmax(0.25, 0.75); beta 0.25 mixes m = (3/4) p_s + (1/4) p_t (beta and 1 - beta differ here)
    uneven = torch.tensor([[0.5, 1.5, 1.0]], dtype=torch.float64)
    ps = [math.exp(1) / (math.exp(1) + 1), 1 / (math.exp(1) + 1)]
    pt = [math.exp(0.25) / (math.exp(0.25) + math.exp(0.75)), math.exp(0.75) / (math.exp(0.25) + math.exp(0.75))]
    for beta in (0.25, 0.75):
        m = [(1 - beta) * x + beta * y for x, y in zip(ps, pt)]
        expected = beta * kl(pt, m) + (1 - beta) * kl(ps, m)
        value = generalized_jsd(s, uneven, beta, temperature=2.0, banned=banned).item()
        assert math.isclose(value, expected, rel_tol=1e-12), beta
    assert not math.isclose(generalized_jsd(s, uneven, 0.25, 2.0, banned).item(),
                            generalized_jsd(s, uneven, 0.75, 2.0, banned).item(), rel_tol=1e-3)


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_gradient_reaches_the_student_only_through_its_logits(beta):
    s = torch.tensor([[0.3, -1.0, 2.0], [1.0, 1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([[1.0, 0.0, 0.5], [0.0, 2.0, -1.0]], dtype=torch.float64)
    value = generalized_jsd(s, t, beta).sum()
    (grad,) = torch.autograd.grad(value, s)
    # A softmax's logits gradient sums to 0 per row; the divergence is 0 and stationary where s = t
    assert torch.allclose(grad.sum(-1), torch.zeros(2, dtype=torch.float64), atol=1e-12)
    same = t.clone().requires_grad_()
    (zero,) = torch.autograd.grad(generalized_jsd(same, t, beta).sum(), same)
    assert zero.abs().max().item() < 1e-12


def test_beta_outside_the_unit_interval_is_refused():
    with pytest.raises(ValueError, match="beta=1.5 must be in"):
        check_beta(1.5)


def test_reverse_kl_advantages_by_hand():
    student = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -0.2, -9.0]], requires_grad=True)
    teacher = torch.tensor([[-1.0, -0.5, -1.0], [-0.3, -0.2, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    # log-ratios: [0.5, -0.5, -1.0] and [0.2, 0.0, (out)]
    per_token = reverse_kl_advantages(student, teacher, mask)
    assert torch.allclose(per_token, torch.tensor([[-0.5, 0.5, 1.0], [-0.2, 0.0, 0.0]]))
    to_go = reverse_kl_advantages(student, teacher, mask, reward_to_go=True)
    # sums from each position to the end: [-1.0, -1.5, -1.0] and [0.2, 0.0]
    assert torch.allclose(to_go, torch.tensor([[1.0, 1.5, 1.0], [-0.2, 0.0, 0.0]]))
    assert not per_token.requires_grad and not to_go.requires_grad
