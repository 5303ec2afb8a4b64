"""The small pure terms of an RL step's tail, by hand: the entropy and KL regularizers, the sampled KL to another
model, and the advantage metrics."""

import math

import torch

from hf_seqrl import losses
from hf_seqrl.functional.advantages import advantage_metrics


def test_regularize_subtracts_the_entropy_and_adds_the_kl_over_counted_tokens():
    entropy = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    kl = torch.tensor([[0.2, 0.4], [0.6, 100.0]])
    mask = torch.tensor([[True, True], [True, False]])  # the last token does not count
    out = losses.regularize(torch.tensor(2.0), entropy, mask, 0.5, kl, 10.0)
    # H = (1 + 3 + 5) / 3 = 3, KL = (0.2 + 0.4 + 0.6) / 3 = 0.4: 2 - 0.5 * 3 + 10 * 0.4 = 4.5
    assert math.isclose(out.entropy.item(), 3.0) and math.isclose(out.kl.item(), 0.4, rel_tol=1e-6)
    assert math.isclose(out.loss.item(), 4.5, rel_tol=1e-6)
    plain = losses.regularize(torch.tensor(2.0), entropy, mask, 0.0)  # no coefficient: the loss as it is, no KL
    assert plain.loss.item() == 2.0 and plain.kl is None and math.isclose(plain.entropy.item(), 3.0)
    nothing = losses.regularize(torch.tensor(2.0), entropy, torch.zeros_like(mask), 0.5)
    assert nothing.entropy.item() == 0.0 and nothing.loss.item() == 2.0


def test_sampled_kl_is_the_mean_log_ratio_at_the_policys_tokens():
    policy = torch.tensor([[-0.5, -1.0], [-2.0, -9.0]], requires_grad=True)
    other = torch.tensor([[-1.0, -1.5], [-1.0, 0.0]])
    mask = torch.tensor([[True, True], [True, False]])
    estimate = losses.sampled_kl(policy, other, mask)
    assert math.isclose(estimate.item(), (0.5 + 0.5 - 1.0) / 3, abs_tol=1e-7) and not estimate.requires_grad


def test_advantage_metrics_read_the_kept_samples_only():
    adv = torch.tensor([0.5, -1.5, 0.0, 9.0])
    baselines = torch.tensor([0.2, 0.4, 0.6, 5.0])
    kept = torch.tensor([True, True, True, False])
    metrics = advantage_metrics(adv, baselines, kept)
    assert math.isclose(metrics["rl/baseline_reward"], 0.4, rel_tol=1e-6)
    assert math.isclose(metrics["rl/advantage_abs"], 2 / 3, rel_tol=1e-6)
    assert math.isclose(metrics["rl/advantage_mean"], -1 / 3, rel_tol=1e-6)
    assert math.isclose(metrics["rl/frac_zero_advantage"], 1 / 3, rel_tol=1e-6)
    assert advantage_metrics(adv, baselines, torch.zeros(4, dtype=torch.bool)) == {}
