"""Per-token advantages `(N, T)` through every loss, against hand-computed values; per-sample `(N,)` unchanged."""

import pytest
import torch

from hf_seqrl import losses

LP = [[-1.0, -2.0, -3.0], [-0.5, -1.5, 0.0]]
MASK = torch.tensor([[True, True, True], [True, True, False]])
ADV = torch.tensor([[1.0, 0.0, 2.0], [-1.0, 3.0, 5.0]])  # the last entry sits past row 1's end: never counted


def logprobs():
    return torch.tensor(LP, requires_grad=True)


def test_policy_gradient_with_token_advantages_by_hand():
    lp = logprobs()
    # row 0: -(1 * -1 + 0 * -2 + 2 * -3) = 7; row 1: -(-1 * -0.5 + 3 * -1.5) = 4
    loss = losses.policy_gradient_loss(lp, MASK, ADV)
    assert loss.item() == pytest.approx(5.5)
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-0.5, 0.0, -1.0], [0.5, -1.5, 0.0]]))
    assert losses.policy_gradient_loss(logprobs(), MASK, ADV, loss_normalization="token").item() == pytest.approx(11 / 5)
    assert losses.policy_gradient_loss(logprobs(), MASK, ADV, length_normalize=True).item() == pytest.approx(
        (7 / 3 + 4 / 2) / 2)


@pytest.mark.parametrize("options", [{}, {"length_normalize": True}, {"loss_normalization": "token"}])
def test_a_token_advantage_equal_along_the_sample_is_the_per_sample_loss(options):
    per_sample = torch.tensor([2.0, -0.5])
    a, b = logprobs(), logprobs()
    losses.policy_gradient_loss(a, MASK, per_sample, **options).backward()
    losses.policy_gradient_loss(b, MASK, per_sample.unsqueeze(-1).expand(2, 3).clone(), **options).backward()
    assert torch.allclose(a.grad, b.grad)
    for level in ("token", "sequence"):
        if level == "sequence" and options:
            continue
        old = torch.tensor(LP) + torch.tensor([[0.3, -0.1, 0.2], [-0.4, 0.1, 0.0]])
        a, b = logprobs(), logprobs()
        one = losses.clipped_policy_objective(a, old, MASK, per_sample, 0.2, importance_sampling_level=level, **options)
        many = losses.clipped_policy_objective(b, old, MASK, per_sample.unsqueeze(-1).expand(2, 3).clone(), 0.2,
                                               importance_sampling_level=level, **options)
        one.loss.backward()
        many.loss.backward()
        assert one.loss.item() == pytest.approx(many.loss.item())
        assert torch.allclose(a.grad, b.grad, atol=1e-6)
        assert one.clip_fraction.item() == many.clip_fraction.item()


def test_clipped_token_level_with_token_advantages_by_hand():
    lp = logprobs()
    ratios = torch.tensor([[1.5, 1.0, 0.5], [1.0, 1.0, 1.0]])
    old = torch.tensor(LP) - ratios.log()
    out = losses.clipped_policy_objective(lp, old, MASK, ADV, epsilon=0.2)
    # row 0: min(1.5, 1.2) * 1 + 0 + min(0.5 * 2, 0.8 * 2) = 2.2; row 1: -1 + 3 = 2
    assert out.loss.item() == pytest.approx(-(2.2 + 2.0) / 2)
    assert out.clip_fraction.item() == pytest.approx(1 / 5)  # row 0's first token only
    out.loss.backward()
    # d/d lp of -r A / 2 is -r A / 2 where the term is unclipped, 0 where it is clipped
    assert torch.allclose(lp.grad, torch.tensor([[0.0, 0.0, -0.5], [0.5, -1.5, 0.0]]))


def test_gspo_token_with_token_advantages_by_hand():
    lp = logprobs()
    out = losses.clipped_policy_objective(lp, lp.detach(), MASK, ADV, 0.2, importance_sampling_level="sequence")
    # s_it = 1: l_0 = -(1 + 0 + 2) / 3, l_1 = -(-1 + 3) / 2
    assert out.loss.item() == pytest.approx(-1.0)
    out.loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-1 / 6, 0.0, -2 / 6], [1 / 4, -3 / 4, 0.0]]))


def test_mixer_continuation_with_token_advantages_by_hand():
    lp = logprobs()
    prefix = torch.tensor([[True, False, False], [False, False, False]])
    continuation = MASK & ~prefix
    # row 0: cross-entropy 1 on the prefix, -(0 * -2 + 2 * -3) = 6 on the continuation; row 1: 4
    loss = losses.mixer_loss(lp, prefix, continuation, ADV)
    assert loss.item() == pytest.approx((7 + 4) / 2)
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-0.5, 0.0, -1.0], [0.5, -1.5, 0.0]]))
    per_sample = torch.tensor([2.0, -0.5])
    assert losses.mixer_loss(logprobs(), prefix, continuation, per_sample).item() == pytest.approx(
        losses.mixer_loss(logprobs(), prefix, continuation, per_sample.unsqueeze(-1).expand(2, 3)).item())


def test_advantages_of_another_shape_are_refused_with_both_shapes():
    with pytest.raises(ValueError, match=r"shape \(2, 2\).*\(2,\).*\(2, 3\)"):
        losses.policy_gradient_loss(logprobs(), MASK, torch.zeros(2, 2))
