"""The vocabulary kernels with banned entries (`banned=`): hand-computed log-probs, gradients, entropy and KL of the
renormalized distribution, block by block and over the whole tensor alike."""

import math

import pytest
import torch

from hf_seqrl.functional import logprobs
from hf_seqrl.functional.logprobs import token_entropy, token_kl, token_logprobs_from_logits

# One position, probabilities proportional to 1, 2, 3, 4; the last token banned: p = [1/6, 2/6, 3/6, 0].
LOGITS = torch.tensor([[[0.0, math.log(2), math.log(3), math.log(4)]]], dtype=torch.float64)
BANNED = torch.tensor([False, False, False, True])


@pytest.fixture(params=["blockwise", "whole tensor"])
def path(request, monkeypatch):
    if request.param == "whole tensor":
        monkeypatch.setattr(logprobs, "BLOCKWISE_DEVICES", ())
    return request.param


def test_token_logprobs_of_the_renormalized_distribution(path):
    logits = LOGITS.clone().requires_grad_(True)
    out = token_logprobs_from_logits(logits, torch.tensor([[1]]), banned=BANNED)
    torch.testing.assert_close(out, torch.tensor([[math.log(2 / 6)]], dtype=torch.float64))
    (grad,) = torch.autograd.grad(out.sum(), logits)
    # onehot(1) - p = [0 - 1/6, 1 - 2/6, 0 - 3/6, 0 - 0]: the banned logit gets no gradient
    torch.testing.assert_close(grad, torch.tensor([[[-1 / 6, 4 / 6, -3 / 6, 0.0]]], dtype=torch.float64))
    # a banned token (a pad after EOS) gets its logit against the allowed normalizer: log 4 - log 6, finite
    banned_value = token_logprobs_from_logits(LOGITS, torch.tensor([[3]]), banned=BANNED)
    torch.testing.assert_close(banned_value, torch.tensor([[math.log(4 / 6)]], dtype=torch.float64))


def test_banned_entries_are_masked_after_the_temperature(path):
    # logits / 2 = log sqrt([1, 2, 3, 4]); allowed: p proportional to 1, sqrt 2, sqrt 3
    out = token_logprobs_from_logits(LOGITS, torch.tensor([[2]]), temperature=2.0, banned=BANNED)
    expected = math.log(math.sqrt(3) / (1 + math.sqrt(2) + math.sqrt(3)))
    torch.testing.assert_close(out, torch.tensor([[expected]], dtype=torch.float64))


def test_one_mask_per_position(path):
    # (T, V) = (2, 4): position 0 bans token 0, position 1 bans token 3.
    logits = LOGITS.expand(1, 2, 4).clone()
    banned = torch.tensor([[True, False, False, False], [False, False, False, True]])
    out = token_logprobs_from_logits(logits, torch.tensor([[1, 1]]), banned=banned)
    torch.testing.assert_close(out, torch.tensor([[math.log(2 / 9), math.log(2 / 6)]], dtype=torch.float64))


def test_entropy_and_kl_of_the_renormalized_distributions(path):
    logits = LOGITS.clone().requires_grad_(True)
    entropy = token_entropy(logits, BANNED)
    # H([1/6, 1/3, 1/2])
    expected = -(1 / 6 * math.log(1 / 6) + 1 / 3 * math.log(1 / 3) + 1 / 2 * math.log(1 / 2))
    torch.testing.assert_close(entropy, torch.tensor([[expected]], dtype=torch.float64))
    (grad,) = torch.autograd.grad(entropy.sum(), logits)
    assert torch.isfinite(grad).all() and grad[0, 0, 3] == 0  # 0 * log 0 stays 0: no NaN
    with torch.no_grad():
        assert torch.allclose(token_entropy(LOGITS, BANNED), entropy)  # the no-grad (blockwise on CPU) branch
    # q from logits [0, 0, 0, log 100], its last token banned too: q = [1/3, 1/3, 1/3, 0]
    ref = torch.tensor([[[0.0, 0.0, 0.0, math.log(100)]]], dtype=torch.float64)
    kl = token_kl(logits, ref, BANNED)
    expected_kl = 1 / 6 * math.log(0.5) + 1 / 3 * math.log(1.0) + 1 / 2 * math.log(1.5)
    torch.testing.assert_close(kl.double(), torch.tensor([[expected_kl]], dtype=torch.float64))
    (grad,) = torch.autograd.grad(kl.sum(), logits)
    assert torch.isfinite(grad).all()
    assert token_kl(LOGITS, LOGITS, BANNED).abs().max() < 1e-7


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_blockwise_equals_whole_tensor_with_masks(monkeypatch, temperature):
    generator = torch.Generator().manual_seed(0)
    full = torch.randn(3, 4, 7, 50, generator=generator)
    ids = torch.randint(0, 50, (3, 2, 7), generator=generator)
    row_temperature = torch.tensor([[temperature], [1.0]])
    banned = torch.zeros(7, 50, dtype=torch.bool)
    banned[:, [0, 9]] = True
    banned[0, 3] = True  # a begin ban
    results = []
    for blockwise in (True, False):
        monkeypatch.setattr(logprobs, "BLOCKWISE_DEVICES", ("cpu",) if blockwise else ())
        monkeypatch.setattr(logprobs, "CPU_BLOCK_ELEMENTS", 150)  # 3 rows per block: several blocks per row
        leaf = full.clone().requires_grad_(True)
        view = leaf[:, 1:3]  # a strided view of a larger tensor
        before = view.detach().clone()
        out = token_logprobs_from_logits(view, ids, row_temperature, banned)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        (grad,) = torch.autograd.grad((out * weights).sum(), leaf)
        assert torch.equal(view.detach(), before)  # the logits are never masked in place
        results.append((out, grad))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])
    # the banned logits get no gradient unless they are the token
    grad = results[0][1][:, 1:3]
    chosen = torch.nn.functional.one_hot(ids, 50).bool()
    assert (grad[banned.expand_as(grad) & ~chosen] == 0).all()
