"""Unit tests of hf_seqrl.losses with hand-computed tensors."""

import math

import pytest
import torch

from hf_seqrl import losses
from hf_seqrl.functional.advantages import center_advantages, group_std, moments, moving_average, scale_advantages, std_from_moments
from hf_seqrl.functional.logprobs import token_entropy, token_kl, token_logprobs_from_logits
from hf_seqrl.functional import logprobs
from hf_seqrl.functional.risk import candidate_distribution, first_occurrence_mask


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


def test_leave_one_out_baseline_leaves_out_the_samples_without_a_reward():
    # source 0: [1, (none), 3, 5] -> kept {1, 3, 5}: b = [(3+5)/2, (1+3+5)/3, (1+5)/2, (1+3)/2] = [4, 3, 3, 2]
    # source 1: [(none), 7, (none), (none)] -> sample 1 has no kept sibling: its own reward (advantage 0); the
    # samples left out get the kept ones' mean (their advantage is not used)
    r = torch.tensor([1.0, 0.0, 3.0, 5.0, 0.0, 7.0, 0.0, 0.0])
    keep = torch.tensor([True, False, True, True, False, True, False, False])
    assert losses.leave_one_out_baseline(r, 4, keep).tolist() == [4.0, 3.0, 3.0, 2.0, 7.0, 7.0, 7.0, 7.0]
    assert losses.leave_one_out_baseline(r, 4, torch.ones(8, dtype=torch.bool)).tolist() == \
        losses.leave_one_out_baseline(r, 4).tolist()


def test_a_row_without_counted_tokens_is_out_of_the_loss_and_its_mean():
    # rows' summed log-probs [-1, -2, -4], advantages [1, 2, 3]; row 2 left out (no counted token):
    # loss = -(1 * -1 + 2 * -2) / 2 = 2.5, not / 3
    token_logprobs = torch.tensor([[-1.0, 0.0], [-1.5, -0.5], [-2.0, -2.0]])
    mask = torch.tensor([[True, False], [True, True], [False, False]])
    adv = torch.tensor([1.0, 2.0, 3.0])
    assert losses.policy_gradient_loss(token_logprobs, mask, adv).item() == pytest.approx(2.5)
    # ratio 1: the surrogate is A per counted token: -(1 * 1 token + 2 * 2 tokens) / 2 rows = -2.5
    old = token_logprobs.clone()
    assert losses.clipped_policy_objective(token_logprobs, old, mask, adv, 0.2).loss.item() == pytest.approx(-2.5)
    assert losses.mean_over_counted(torch.tensor([1.0, 2.0]), torch.zeros(2, 3, dtype=torch.bool)).item() == 0.0


def test_scale_advantages():
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    # moments [4, 0, 4]: std (unbiased) = sqrt((4 - 0/4) / 3) = sqrt(4/3)
    assert moments(adv).tolist() == [4.0, 0.0, 4.0]
    std = std_from_moments(moments(adv))
    torch.testing.assert_close(std.item(), math.sqrt(4 / 3))
    torch.testing.assert_close(scale_advantages(adv, std), adv / math.sqrt(4 / 3))
    const = torch.zeros(4)
    assert scale_advantages(const, 0.0).tolist() == [0.0] * 4  # no NaN from a zero std
    # kept [2, 4] only: moments [2, 6, 20], std sqrt((20 - 36/2) / 1) = sqrt(2); one value: NaN, left unscaled
    keep = torch.tensor([False, True, True, False])
    assert moments(torch.tensor([9.0, 2.0, 4.0, 9.0]), keep).tolist() == [2.0, 6.0, 20.0]
    assert math.isnan(std_from_moments(moments(adv[:1])).item())
    assert scale_advantages(adv, float("nan")).tolist() == adv.tolist()
    # moments of two processes add up: [1, 2] and [3] -> [3, 6, 14], std sqrt((14 - 12) / 2) = 1
    both = moments(torch.tensor([1.0, 2.0])) + moments(torch.tensor([3.0]))
    assert std_from_moments(both).item() == 1.0


def test_group_std_per_source_over_the_kept_samples():
    # source 0: [1, 3] -> std sqrt(2); source 1: [2, (left out), 2, 8] -> kept [2, 2, 8]: mean 4,
    # squares 4 + 4 + 16 = 24, std sqrt(24 / 2) = sqrt(12); source 2: one kept sample -> NaN
    adv = torch.tensor([1.0, 3.0, 0.0, 0.0, 2.0, 5.0, 2.0, 8.0, 1.0, 0.0, 0.0, 0.0])
    keep = torch.tensor([True, True, False, False, True, False, True, True, True, False, False, False])
    # without a mask, pairs: [1, 3] -> sqrt(2); [0, 0] -> 0
    torch.testing.assert_close(group_std(adv[:4], 2), torch.tensor([math.sqrt(2), math.sqrt(2), 0.0, 0.0]))
    std = group_std(adv, 4, keep)
    torch.testing.assert_close(std[:8], torch.tensor([math.sqrt(2)] * 4 + [math.sqrt(12)] * 4))
    assert torch.isnan(std[8:]).all()
    scaled = scale_advantages(adv, std)
    torch.testing.assert_close(scaled[4:8], adv[4:8] / math.sqrt(12))
    assert scaled[8:].tolist() == adv[8:].tolist()


def test_center_advantages():
    adv = torch.tensor([1.0, 2.0, 3.0, 6.0])
    assert center_advantages(adv).tolist() == [-2.0, -1.0, 0.0, 3.0]
    # a left-out sample (non-finite reward, advantage 0) neither counts in the mean nor gets one
    keep = torch.tensor([True, True, False, True])
    assert center_advantages(torch.tensor([1.0, 2.0, 0.0, 6.0]), keep).tolist() == [-2.0, -1.0, 0.0, 3.0]
    nothing = torch.zeros(3, dtype=torch.bool)
    assert center_advantages(torch.zeros(3), nothing).tolist() == [0.0] * 3
    assert center_advantages(torch.tensor([0.7])).tolist() == [0.0]


def test_moving_average():
    assert moving_average(None, 0.4, 0.9) == 0.4
    assert moving_average(0.5, 1.0, 0.9) == pytest.approx(0.55)


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
    torch.testing.assert_close(token_logprobs_from_logits(logits, ids),
                               torch.log(torch.tensor([[0.5, 0.8]])))
    # temperature 2: softmax(log p / 2) ∝ sqrt(p): [sqrt(.5), sqrt(.25), sqrt(.25)] normalized
    s = torch.tensor([0.5, 0.25, 0.25]).sqrt()
    expected = torch.log(s[0] / s.sum())
    assert token_logprobs_from_logits(logits, ids, temperature=2.0)[0, 0].item() == pytest.approx(
        expected.item(), abs=1e-6)
    # entropy of [.5,.25,.25] = 1.5 bits = 1.5 ln 2
    assert token_entropy(logits)[0, 0].item() == pytest.approx(1.5 * math.log(2), abs=1e-6)
    # KL([.5,.25,.25] || uniform) = ln 3 - H
    uniform = torch.zeros_like(logits)
    assert token_kl(logits, uniform)[0, 0].item() == pytest.approx(math.log(3) - 1.5 * math.log(2),
                                                                          abs=1e-6)
    assert token_kl(logits, logits).abs().max().item() < 1e-6


def test_cross_entropy_ignores_padding():
    logits = torch.log(torch.tensor([[[0.5, 0.5], [0.9, 0.1]]]))
    labels = torch.tensor([[0, -100]])
    assert losses.cross_entropy(logits, labels).item() == pytest.approx(math.log(2))
    # From the labels' log-probs: -(log 0.5 + log 0.25) / 2 over the two counted positions; none counted -> 0.
    logprobs = torch.log(torch.tensor([[0.5, 0.25, 0.125]]))
    assert losses.cross_entropy_from_logprobs(logprobs, torch.tensor([[3, 4, -100]])).item() == pytest.approx(
        1.5 * math.log(2))
    assert losses.cross_entropy_from_logprobs(logprobs, torch.full((1, 3), -100)).item() == 0.0


def test_token_logprobs_with_one_temperature_per_row():
    # Row 0 at temperature 2 (softmax of log p / 2 is proportional to sqrt(p)), row 1 at temperature 1.
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25]], [[0.1, 0.1, 0.8]]]))
    ids = torch.tensor([[0], [2]])
    s = torch.tensor([0.5, 0.25, 0.25]).sqrt()
    got = token_logprobs_from_logits(logits, ids, torch.tensor([[2.0], [1.0]]))
    torch.testing.assert_close(got, torch.stack([torch.log(s[0] / s.sum()), torch.log(torch.tensor(0.8))]).view(2, 1))
    # Gradient: the same as the whole-tensor formula with the per-row division.
    x = (torch.randn(2, 3, 11, dtype=torch.float64) * 2).requires_grad_(True)
    temps = torch.tensor([[0.5], [1.0]], dtype=torch.float64)
    ids = torch.randint(0, 11, (2, 3))
    assert torch.autograd.gradcheck(lambda x: token_logprobs_from_logits(x, ids, temps), (x,))
    whole = torch.log_softmax(x / temps.unsqueeze(-1), dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(token_logprobs_from_logits(x, ids, temps), whole)
    with pytest.MonkeyPatch.context() as patch:  # the whole-tensor path other devices take
        patch.setattr(logprobs, "BLOCKWISE_DEVICES", ())
        torch.testing.assert_close(token_logprobs_from_logits(x, ids, temps), whole)


def test_token_logprobs_equal_full_log_softmax_gather():
    # The lean path (gather - logsumexp) gives the same values and gradients as a full log-softmax.
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(6, 5, 50, generator=gen) * 4).requires_grad_(True)
    ids = torch.randint(0, 50, (6, 5), generator=gen)
    lean = token_logprobs_from_logits(logits, ids, temperature=0.7)
    (g_lean,) = torch.autograd.grad(lean.sum(), logits)
    full = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    (g_full,) = torch.autograd.grad(full.sum(), logits)
    torch.testing.assert_close(lean, full, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(g_lean, g_full, atol=1e-6, rtol=1e-6)



@pytest.mark.parametrize("temperature", [1.0, 0.7])
# Blocks of 1 and 60 elements take ~30 s each (thousands of blocks): the slow tier.
@pytest.mark.parametrize("block_elements", [pytest.param(1, marks=pytest.mark.slow),
                                            pytest.param(60, marks=pytest.mark.slow), 1 << 18, None])
def test_blockwise_token_logprobs_on_a_strided_view(monkeypatch, temperature, block_elements):
    # The scoring pass hands a slice of a larger (B, rows per source, T, V) logits tensor: the sample rows of each
    # source and their first T positions. Values and the gradient reaching the whole tensor equal those of a full
    # log-softmax of a copy; blocks of 1 row, of a few rows (60 // 25 = 2, not dividing T = 5), of every row, and
    # (None) the whole-tensor path other devices take.
    if block_elements is None:
        monkeypatch.setattr(logprobs, "BLOCKWISE_DEVICES", ())
    else:
        monkeypatch.setattr(logprobs, "CPU_BLOCK_ELEMENTS", block_elements)
    gen = torch.Generator().manual_seed(1)
    whole = (torch.randn(3, 4, 7, 25, generator=gen, dtype=torch.float64) * 3).requires_grad_(True)
    ids = torch.randint(0, 25, (3 * 3, 5), generator=gen)
    ids[0, 4] = -100  # masked positions may hold -100: any value is allowed there
    view = whole[:, :3, :5]
    assert not view.is_contiguous()
    lean = token_logprobs_from_logits(view, ids, temperature)
    assert lean.shape == ids.shape
    weights = torch.randn(ids.shape, generator=gen, dtype=torch.float64)
    (g_lean,) = torch.autograd.grad((lean * weights).sum(), whole)
    copy = view.flatten(0, 1)
    full = torch.log_softmax(copy / temperature, dim=-1).gather(-1, ids.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    (g_full,) = torch.autograd.grad((full * weights).sum(), whole)
    torch.testing.assert_close(lean, full)
    torch.testing.assert_close(g_lean, g_full)
    assert g_lean[:, 3].abs().max().item() == 0.0 and g_lean[:, :, 5:].abs().max().item() == 0.0
    probe = whole.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: token_logprobs_from_logits(x[:, :3, :5], ids, temperature),
                                    (probe,))


def test_blockwise_token_logprobs_of_bf16_logits():
    # bf16 logits: computed in float32 (as the whole-tensor path does), gradient returned in bf16.
    gen = torch.Generator().manual_seed(2)
    logits = (torch.randn(4, 6, 30, generator=gen) * 5).to(torch.bfloat16).requires_grad_(True)
    ids = torch.randint(0, 30, (4, 6), generator=gen)
    lean = token_logprobs_from_logits(logits, ids, 0.7)
    assert lean.dtype == torch.float32
    (g_lean,) = torch.autograd.grad(lean.sum(), logits)
    assert g_lean.dtype == torch.bfloat16
    full = torch.log_softmax(logits.float() / 0.7, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    (g_full,) = torch.autograd.grad(full.sum(), logits)
    torch.testing.assert_close(lean, full)
    torch.testing.assert_close(g_lean, g_full)


@pytest.mark.parametrize("block_elements", [1, 60, 1 << 18, None])
def test_blockwise_entropy_equals_whole_tensor(monkeypatch, block_elements):
    if block_elements is None:  # the whole-tensor path other devices take
        monkeypatch.setattr(logprobs, "BLOCKWISE_DEVICES", ())
    else:
        monkeypatch.setattr(logprobs, "CPU_BLOCK_ELEMENTS", block_elements)
    gen = torch.Generator().manual_seed(3)
    whole = torch.randn(2, 3, 6, 25, generator=gen) * 3
    view = whole[:, :2, :5]
    logp = torch.log_softmax(view, dim=-1)
    expected = -(logp.exp() * logp).sum(-1)
    torch.testing.assert_close(token_entropy(view), expected)  # no autograd: the blockwise path
    # With a gradient wanted it takes the whole-tensor path and gives the same values.
    grad_view = whole.clone().requires_grad_(True)[:, :2, :5]
    torch.testing.assert_close(token_entropy(grad_view).detach(), expected)

# ---- loss normalization, clipped updates, minimum risk ----------------------------------------------------------

def test_token_loss_normalization_by_hand():
    lp = torch.tensor([[-1.0, -2.0, -5.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([2.0, -1.0])
    # 5 counted tokens: -(2*-1 + 2*-2 + -1*-0.5*3) / 5 = -(-2 - 4 + 1.5) / 5 = 0.9
    loss = losses.policy_gradient_loss(lp, mask, adv, loss_normalization="token")
    assert loss.item() == pytest.approx(0.9)
    loss.backward()
    # d/dlp = -adv_i / 5 at counted positions: the long row weighs 3/5 of the loss, not 1/2
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.4, -0.4, 0.0], [0.2, 0.2, 0.2]]))
    # "sequence" is the mean over rows of per-row sums (2.25, as above)
    assert losses.policy_gradient_loss(lp, mask, adv, loss_normalization="sequence").item() == pytest.approx(2.25)
    with pytest.raises(ValueError, match="loss_normalization='tokens' is not one of"):
        losses.policy_gradient_loss(lp, mask, adv, loss_normalization="tokens")
    with pytest.raises(ValueError, match="set length_normalize=False"):
        losses.policy_gradient_loss(lp, mask, adv, length_normalize=True, loss_normalization="token")


def clipping_example():
    # old log-probs -1; current ones chosen so that the token ratios are
    #   row 0 (A = +2): [1.5 above the band, 1.0 inside, 0.5 below]
    #   row 1 (A = -1): [0.5 below the band, 1.1 inside, 1.5 above]
    ratios = torch.tensor([[1.5, 1.0, 0.5], [0.5, 1.1, 1.5]])
    old = torch.full((2, 3), -1.0)
    lp = (old + ratios.log()).requires_grad_(True)
    return lp, old, torch.ones(2, 3, dtype=torch.bool), torch.tensor([2.0, -1.0])


def test_clipped_policy_loss_by_hand():
    lp, old, mask, adv = clipping_example()
    # epsilon 0.2: band [0.8, 1.2]; per token min(rho A, clip(rho) A)
    #   row 0: min(3, 2.4) = 2.4 (clipped), 2.0, min(1.0, 1.6) = 1.0 (below the band but A > 0: not clipped)
    #   row 1: min(-0.5, -0.8) = -0.8 (clipped), -1.1, min(-1.5, -1.2) = -1.5 (above but A < 0: not clipped)
    # sequence sums 5.4 and -3.4; loss = -mean(5.4, -3.4) = -1.0
    loss = losses.clipped_policy_objective(lp, old, mask, adv, epsilon=0.2).loss
    assert loss.item() == pytest.approx(-1.0, abs=1e-6)
    loss.backward()
    # d(-rho A / 2)/dlp = -rho A / 2 where not clipped, 0 where clipped
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, -1.0, -0.5], [0.0, 0.55, 0.75]]))
    # token normalization: -(5.4 - 3.4) / 6 = -1/3, gradients / 6
    lp.grad = None
    loss = losses.clipped_policy_objective(lp, old, mask, adv, epsilon=0.2, loss_normalization="token").loss
    assert loss.item() == pytest.approx(-1 / 3, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, -2.0, -1.0], [0.0, 1.1, 1.5]]) / 6)
    # length_normalize: row means 1.8 and -3.4/3; loss = -mean(1.8, -1.1333) = -0.3333
    assert losses.clipped_policy_objective(lp, old, mask, adv, 0.2, length_normalize=True).loss.item() == pytest.approx(
        -(1.8 - 3.4 / 3) / 2, abs=1e-6)
    # 2 of the 6 tokens are clipped; mean ratio (1.5 + 1 + 0.5 + 0.5 + 1.1 + 1.5) / 6
    _, clip_fraction, ratio_mean, _, _ = losses.clipped_policy_objective(lp, old, mask, adv, epsilon=0.2)
    assert clip_fraction.item() == pytest.approx(2 / 6)
    assert ratio_mean.item() == pytest.approx(6.1 / 6, abs=1e-6)


def test_clipped_policy_loss_epsilon_high_and_masking():
    lp, old, mask, adv = clipping_example()
    # epsilon_high 0.6: band [0.8, 1.6]; row 0's 1.5 is now inside: row 0 sums 3 + 2 + 1 = 6, loss -mean(6, -3.4)
    loss = losses.clipped_policy_objective(lp, old, mask, adv, epsilon=0.2, epsilon_high=0.6).loss
    assert loss.item() == pytest.approx(-1.3, abs=1e-6)
    assert losses.clipped_policy_objective(lp, old, mask, adv, 0.2, 0.6).clip_fraction.item() == pytest.approx(1 / 6)
    # a masked position neither counts nor overflows, whatever log-prob it holds (exp(100) is inf in float32)
    far = lp.detach().clone()
    far[1, 2] = 100.0
    masked = mask.clone()
    masked[1, 2] = False
    # row 1 without its last token sums -0.8 - 1.1 = -1.9: loss -mean(5.4, -1.9) = -1.75
    loss = losses.clipped_policy_objective(far.requires_grad_(True), old, masked, adv, epsilon=0.2).loss
    assert loss.item() == pytest.approx(-1.75, abs=1e-6)
    assert torch.isfinite(torch.autograd.grad(loss, far)[0]).all()


@pytest.mark.parametrize("length_normalize,normalization", [(False, "sequence"), (True, "sequence"),
                                                            (False, "token")])
def test_clipped_loss_at_the_rollout_has_the_policy_gradient(length_normalize, normalization):
    # The first update of a cycle (p_old = p_theta, ratio 1) follows exactly the policy gradient.
    gen = torch.Generator().manual_seed(0)
    lp = (-torch.rand(4, 5, generator=gen) * 3).requires_grad_(True)
    mask = torch.rand(4, 5, generator=gen) > 0.3
    adv = torch.randn(4, generator=gen)
    pg = losses.policy_gradient_loss(lp, mask, adv, length_normalize, normalization)
    clipped = losses.clipped_policy_objective(lp, lp.detach(), mask, adv, 0.2, None, length_normalize, normalization).loss
    torch.testing.assert_close(torch.autograd.grad(clipped, lp)[0], torch.autograd.grad(pg, lp)[0])


def test_minimum_risk_loss_two_sources_by_hand():
    # source 0: p = [0.6, 0.2], rewards [1.0, 0.2]; source 1: p = [0.1, 0.1], rewards [0.5, 0.0]
    seq_lp = torch.tensor([0.6, 0.2, 0.1, 0.1]).log().requires_grad_(True)
    rewards = torch.tensor([1.0, 0.2, 0.5, 0.0], requires_grad=True)
    # alpha 1: Q0 = [0.75, 0.25], risk0 = 0.25 * 0.8 = 0.2; Q1 = [0.5, 0.5], risk1 = 0.5 * 0.5 + 0.5 * 1 = 0.75
    q = candidate_distribution(seq_lp, 2, alpha=1.0)
    torch.testing.assert_close(q, torch.tensor([[0.75, 0.25], [0.5, 0.5]]))
    loss = losses.minimum_risk_loss(seq_lp, rewards, 2, alpha=1.0)
    assert loss.item() == pytest.approx((0.2 + 0.75) / 2)
    loss.backward()
    # d risk / d log p(y) = alpha Q(y) (cost(y) - risk), halved by the mean over 2 sources:
    # source 0: [0.75 (0 - 0.2), 0.25 (0.8 - 0.2)] / 2; source 1: [0.5 (0.5 - 0.75), 0.5 (1 - 0.75)] / 2
    torch.testing.assert_close(seq_lp.grad, torch.tensor([-0.075, 0.075, -0.0625, 0.0625]))
    assert rewards.grad is None  # rewards are constants
    # alpha 0.5: Q0 ∝ sqrt([0.6, 0.2]) = [1, 1/sqrt(3)] -> Q0 = [0.63397, 0.36603], risk0 = 0.36603 * 0.8 = 0.29282
    assert losses.minimum_risk_loss(seq_lp, rewards, 2, alpha=0.5).item() == pytest.approx(
        (0.29282 + 0.75) / 2, abs=1e-5)


def test_minimum_risk_loss_duplicates_count_once():
    # Candidates as token rows (one pad after EOS = 1): source 0 is [A, B, A], source 1 is [C, C, D].
    A, B, C, D = [5, 1, 0], [6, 7, 1], [8, 1, 0], [9, 1, 0]
    ids = torch.tensor([A, B, A, C, C, D])
    keep = first_occurrence_mask(ids, 3)
    assert keep.tolist() == [True, True, False, True, False, True]
    # log p of a sequence is a parameter per distinct sequence, so duplicates share it (as under a real policy)
    theta = torch.tensor([-1.0, -2.0, -0.5, -3.0], requires_grad=True)  # A, B, C, D
    reward = {0: 0.9, 1: 0.1, 2: 0.4, 3: 0.7}
    rows = [0, 1, 0, 2, 2, 3]
    with_dups = losses.minimum_risk_loss(theta[rows], torch.tensor([reward[r] for r in rows]), 3, 0.5, keep)
    (grad_dups,) = torch.autograd.grad(with_dups, theta)
    distinct = [0, 1, 2, 3]  # source 0: [A, B], source 1: [C, D]
    without = losses.minimum_risk_loss(theta[distinct], torch.tensor([reward[r] for r in distinct]), 2, 0.5)
    (grad_without,) = torch.autograd.grad(without, theta)
    assert with_dups.item() == pytest.approx(without.item(), abs=1e-7)
    torch.testing.assert_close(grad_dups, grad_without)
    # counted twice instead, A would take more of Q in source 0: a different loss
    assert losses.minimum_risk_loss(theta[rows], torch.tensor([reward[r] for r in rows]), 3, 0.5).item() != \
        pytest.approx(without.item(), abs=1e-4)


def test_minimum_risk_loss_source_with_no_candidate_left():
    seq_lp = torch.tensor([0.6, 0.2, 0.1, 0.1]).log().requires_grad_(True)
    rewards = torch.tensor([1.0, 0.2, 0.5, 0.0])
    keep = torch.tensor([True, True, False, False])  # e.g. both rewards of source 1 were NaN and dropped
    q = candidate_distribution(seq_lp, 2, 1.0, keep)
    torch.testing.assert_close(q, torch.tensor([[0.75, 0.25], [0.0, 0.0]]))
    loss = losses.minimum_risk_loss(seq_lp, rewards, 2, 1.0, keep)
    assert loss.item() == pytest.approx(0.2)  # the mean over the one source left
    (grad,) = torch.autograd.grad(loss, seq_lp)
    torch.testing.assert_close(grad, torch.tensor([-0.15, 0.15, 0.0, 0.0]))
