"""Baselines and advantages: the rewards' side of the policy gradient, pure tensor math (torch only).

Shapes: `B` sources, `n` samples per source (a source's samples are contiguous rows). A `keep` mask is false for the
samples left out (a reward that does not apply, or a dropped non-finite one): they count in no other sample's
baseline, mean or scale. `hf_seqrl.losses` re-exports every function.
"""

from __future__ import annotations

import torch


def advantages(rewards: torch.Tensor, baseline: torch.Tensor | float) -> torch.Tensor:
    """Returns `rewards - baseline`, with no gradient through either.

    Args:
        rewards (`torch.Tensor` of shape `(B*n,)`): reward of each sampled sequence.
        baseline (`torch.Tensor` of shape `(B*n,)` or a float): baseline of each sample.
    """
    baseline = torch.as_tensor(baseline, dtype=rewards.dtype, device=rewards.device)
    return (rewards - baseline).detach()


def center_advantages(adv: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Returns `adv - mean(adv)` over the kept samples; the others stay 0.

    The greedy baseline of SCST sits above the mean reward of the samples whenever the greedy decode is better
    than a typical sample, so most advantages share one sign. That offset adds zero-mean noise to the gradient
    (`offset * grad log p(y)`), which grows with the length of the samples; centering removes it.

    Args:
        adv (`torch.Tensor` of shape `(B*n,)`): advantages.
        keep (`torch.Tensor` of shape `(B*n,)`, *optional*): false for samples left out (non-finite rewards).
    """
    if keep is None:
        keep = torch.ones_like(adv, dtype=torch.bool)
    if not keep.any():
        return adv
    mean = adv[keep].mean()
    return torch.where(keep, adv - mean, torch.zeros_like(adv))


def scale_advantages(adv: torch.Tensor, std: torch.Tensor | float | None = None, eps: float = 1e-6) -> torch.Tensor:
    """Returns `adv / std`, leaving unchanged each advantage whose `std` is below `eps` or not finite (a source or a
    batch whose rewards are all equal, or one value only).

    Args:
        adv (`torch.Tensor` of shape `(B*n,)`): advantages.
        std (`torch.Tensor` of shape `(B*n,)` or `()`, or a float, *optional*): the scale of each advantage
            (`group_std`, `std_from_moments`); None takes the unbiased std of `adv`.
    """
    if std is None:
        std = std_from_moments(moments(adv))
    std = torch.as_tensor(std, dtype=adv.dtype, device=adv.device).expand_as(adv)
    usable = torch.isfinite(std) & (std >= eps)
    return torch.where(usable, adv / torch.where(usable, std, torch.ones_like(std)), adv)


def moments(values: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Returns `[count, sum, sum of squares]` (float64, shape `(3,)`) of the kept `values` `(N,)`: what processes add up
    (all-reduce) before `std_from_moments`."""
    values = values.double()
    if keep is not None:
        values = values[keep]
    return torch.stack([torch.tensor(float(values.numel()), dtype=torch.float64, device=values.device),
                        values.sum(), (values * values).sum()])


def std_from_moments(totals: torch.Tensor) -> torch.Tensor:
    """Returns the unbiased standard deviation `sqrt((Σx² − (Σx)²/k) / (k − 1))` of `moments` `[k, Σx, Σx²]`
    (NaN when k < 2)."""
    count, total, squares = totals.unbind()
    if count < 2:
        return torch.tensor(float("nan"), dtype=torch.float64, device=totals.device)
    return ((squares - total * total / count).clamp(min=0.0) / (count - 1)).sqrt()


def group_std(adv: torch.Tensor, num_samples: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Returns, for each sample, the unbiased standard deviation of the kept advantages of its source's `n` samples
    (NaN where fewer than 2 are kept).

    Args:
        adv (`torch.Tensor` of shape `(B*n,)`): advantages, the samples of a source contiguous.
        keep (`torch.Tensor` of shape `(B*n,)`, *optional*): false for samples left out.
    """
    grouped = adv.view(-1, num_samples).double()
    kept = torch.ones_like(grouped, dtype=torch.bool) if keep is None else keep.view(-1, num_samples)
    count = kept.sum(dim=1, keepdim=True).double()
    mean = torch.where(kept, grouped, 0.0).sum(dim=1, keepdim=True) / count.clamp(min=1)
    squares = torch.where(kept, (grouped - mean) ** 2, 0.0).sum(dim=1, keepdim=True)
    std = torch.where(count >= 2, (squares / (count - 1).clamp(min=1)).sqrt(), float("nan"))
    return std.expand_as(grouped).reshape(-1).to(adv.dtype)


def normalized_sum(part_advantages: torch.Tensor, weights: torch.Tensor, num_samples: int,
                   present: torch.Tensor) -> torch.Tensor:
    """Returns `sum_k w_k A_k / std_k`: each reward's advantages divided by their standard deviation over its source's
    samples, then weighted and summed (GDPO's "normalize, then sum"), so that each reward weighs what its weight
    says whatever its scale. An advantage where its reward gives no value (`present` false) adds 0, and a source whose
    advantages of one reward are all equal (std ~0) or single adds them unscaled (`scale_advantages`).

    Args:
        part_advantages (`torch.Tensor` of shape `(K, B*n)`): each reward's advantages (its values minus its baseline).
        weights (`torch.Tensor` of shape `(K,)`): the rewards' weights.
        num_samples (`int`): `n`, the samples of a source contiguous.
        present (`torch.Tensor` of shape `(K, B*n)`): false where a reward gives no value or the sample is left out.
    """
    total = torch.zeros_like(part_advantages[0])
    for adv, weight, keep in zip(part_advantages, weights, present):
        adv = torch.where(keep, adv, torch.zeros_like(adv))
        total = total + weight * scale_advantages(adv, group_std(adv, num_samples, keep))
    return total


def leave_one_out_baseline(rewards: torch.Tensor, num_samples: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Returns, for each sample, the mean reward of the *other* samples of its source.

    `b_i = (sum_j r_j - r_i) / (n - 1)` (Kool et al., 2019). The baseline of a sample does not depend on its
    own reward, so the policy gradient stays unbiased. With `keep`, the samples left out (a reward that does not
    apply, or a dropped non-finite one) are out of their siblings' means, `b_i = mean_{j != i, keep_j} r_j`; a
    sample with no kept sibling gets its own reward (advantage 0).

    Args:
        rewards (`torch.Tensor` of shape `(B*n,)`): rewards, the `n` samples of a source contiguous.
        num_samples (`int`): `n`, at least 2.
        keep (`torch.Tensor` of shape `(B*n,)`, *optional*): false for the samples left out (any reward there).
    """
    if num_samples < 2:
        raise ValueError(f"leave_one_out_baseline needs num_samples >= 2, got {num_samples}.")
    if rewards.numel() % num_samples:
        raise ValueError(f"rewards has {rewards.numel()} entries, not a multiple of num_samples={num_samples}.")
    grouped = rewards.view(-1, num_samples)
    if keep is None:
        totals = grouped.sum(dim=1, keepdim=True)
        return ((totals - grouped) / (num_samples - 1)).reshape(-1)
    kept = keep.view(-1, num_samples)
    values = torch.where(kept, grouped, torch.zeros_like(grouped))
    others = values.sum(dim=1, keepdim=True) - values
    count = kept.sum(dim=1, keepdim=True) - kept.long()
    return torch.where(count > 0, others / count.clamp(min=1), grouped).reshape(-1)


def moving_average(previous: float | None, batch_mean: float, decay: float) -> float:
    """Returns the updated exponential moving average `decay * previous + (1 - decay) * batch_mean`.

    The first call (`previous is None`) returns `batch_mean`.
    """
    if previous is None:
        return float(batch_mean)
    return decay * float(previous) + (1.0 - decay) * float(batch_mean)
