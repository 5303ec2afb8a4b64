"""Baselines and advantages: the rewards' side of the policy gradient, pure tensor math (torch only).

Shapes: `B` sources, `n` samples per source (a source's samples are contiguous rows). A `keep` mask is false for the
samples left out (a reward that does not apply, or a dropped non-finite one): they count in no other sample's
baseline, mean or scale. `hf_seqrl.losses` also offers `advantages` and `leave_one_out_baseline`
(its public API).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

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


BASELINES = ("greedy", "mean", "moving_average", "none")
SCALINGS = ("none", "group", "batch")
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


class AdvantageSettings(NamedTuple):
    """How rewards become advantages (the fields of `BaselineConfig`, read by `sample_advantages`)."""

    baseline: str = "none"  # one of BASELINES
    center: bool = False  # `center_advantages`
    scale: str = "none"  # `scale_rewards`: one of SCALINGS
    aggregation: str = "sum_then_normalize"  # `multi_objective_aggregation`: one of AGGREGATIONS
    mask_truncated: bool = False  # `mask_truncated_completions`


class Advantages(NamedTuple):
    """What `sample_advantages` returns: shapes `(B*n,)`."""

    advantages: torch.Tensor  # 0 where not kept
    baselines: torch.Tensor  # the baseline each sample's reward was measured against
    kept: torch.Tensor  # bool: false for the samples left out of the loss


def sample_advantages(rewards: torch.Tensor, left_out: torch.Tensor, num_samples: int, settings: AdvantageSettings, *,
                      truncated: torch.Tensor | None = None, greedy: torch.Tensor | None = None,
                      greedy_left_out: torch.Tensor | None = None, parts: torch.Tensor | None = None,
                      greedy_parts: torch.Tensor | None = None, weights: torch.Tensor | None = None,
                      moving_average: float | None = None,
                      add_up: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Advantages:
    """Returns the advantages of a micro-batch's samples from their rewards, in the order every rewarded trainer
    applies: leave out the samples with no usable reward (and, with `mask_truncated`, those cut at the length limit,
    and with the greedy baseline those whose source's greedy reward is missing); subtract the baseline
    (`settings.baseline`: the greedy decode's reward, the leave-one-out mean, the moving average, or none), or with
    `aggregation="normalize_then_sum"` each reward's own baseline, normalized over the source's samples, weighted
    and summed (`normalized_sum`); center over the kept samples; divide by the std of the source's (`"group"`) or the
    batch's (`"batch"`) kept advantages.

    Args:
        rewards (`torch.Tensor` of shape `(B*n,)`): each sample's (combined) reward, any value where left out.
        left_out (`torch.BoolTensor` of shape `(B*n,)`): samples with no usable reward.
        num_samples (`int`): `n`, the samples of a source contiguous.
        settings (`AdvantageSettings`).
        truncated (`torch.BoolTensor` of shape `(B*n,)`, *optional*): samples cut at the length limit.
        greedy, greedy_left_out (`(B,)`, *optional*): the greedy decodes' rewards (the greedy baseline).
        parts (`torch.Tensor` of shape `(K, B*n)`, *optional*): each reward's values (NaN where it gives none), with
            `weights` `(K,)` and, for the greedy baseline, `greedy_parts` `(K, B)`: `normalize_then_sum` only.
        moving_average (`float`, *optional*): the moving-average baseline so far (None: this batch's kept mean).
        add_up (*optional*): sums a `moments` tensor over processes for `scale="batch"` (default: this process).
    """
    n, bad = num_samples, left_out
    if settings.mask_truncated and truncated is not None:  # an unfinished output's reward judges what it did not write
        bad = bad | truncated
    if settings.baseline == "greedy":
        baselines = greedy.repeat_interleave(n)
        bad = bad | greedy_left_out.repeat_interleave(n)
    elif settings.baseline == "mean":
        baselines = leave_one_out_baseline(rewards, n, ~bad)
    elif settings.baseline == "moving_average":
        good = rewards[~bad]
        current = moving_average if moving_average is not None else (good.mean().item() if good.numel() else 0.0)
        baselines = torch.full_like(rewards, current)
    else:
        baselines = torch.zeros_like(rewards)
    if settings.aggregation == "normalize_then_sum":
        adv = _normalized_parts(parts, weights, n, bad, settings.baseline, greedy_parts)
    else:
        adv = advantages(rewards, baselines).masked_fill(bad, 0.0)
    if settings.center:
        adv = center_advantages(adv, ~bad)
    if settings.scale == "group":
        adv = scale_advantages(adv, group_std(adv, n, ~bad))
    elif settings.scale == "batch":
        totals = moments(adv, ~bad)
        adv = scale_advantages(adv, std_from_moments(totals if add_up is None else add_up(totals)))
    return Advantages(adv, baselines, ~bad)


def token_level_advantages(sample_advantages: torch.Tensor, token_values: torch.Tensor, token_mask: torch.Tensor,
                           reward_to_go: bool = False) -> torch.Tensor:
    """Returns per-token advantages `(N, T)`: each sample's sentence advantage `(N,)` (its reward over its baseline) on
    every one of its tokens, plus each token's own value `token_values` `(N, T)` (a token-level reward's), or with
    `reward_to_go` the sum of the values from that token to the end of the sample; 0 outside `token_mask` `(N, T)`.

    With `reward_to_go`, a reward that is a sum of per-token terms has the policy gradient over these advantages as
    an unbiased estimate of the gradient of its expectation (a token's log-prob moves the tokens after it, not the
    ones before); each token's own value alone credits the token and holds the rest of the sample fixed."""
    mask = token_mask.to(token_values.dtype)
    values = token_values * mask
    if reward_to_go:
        values = values.flip(-1).cumsum(-1).flip(-1) * mask
    return (sample_advantages.unsqueeze(-1).to(values.dtype) + values) * mask


def advantage_metrics(adv: torch.Tensor, baselines: torch.Tensor, kept: torch.Tensor) -> dict[str, float]:
    """Returns what the loss sees of the advantages `(N,)` and baselines `(N,)` of the kept samples `(N,)` bool:
    `rl/baseline_reward`, `rl/advantage_abs`, `rl/advantage_mean` and `rl/frac_zero_advantage` (an advantage under
    1e-8 in size); nothing when no sample is kept."""
    if not kept.any():
        return {}
    adv = adv[kept]
    return {"rl/baseline_reward": baselines[kept].mean().item(), "rl/advantage_abs": adv.abs().mean().item(),
            "rl/advantage_mean": adv.mean().item(), "rl/frac_zero_advantage": (adv.abs() < 1e-8).float().mean().item()}


def _normalized_parts(parts: torch.Tensor, weights: torch.Tensor, num_samples: int, bad: torch.Tensor, baseline: str,
                      greedy_parts: torch.Tensor | None) -> torch.Tensor:
    """The advantages of `normalize_then_sum`: each reward's values minus that reward's own baseline (greedy,
    leave-one-out mean or none), then `normalized_sum`."""
    part_advantages, present = [], []
    for k, values in enumerate(parts):
        keep = torch.isfinite(values) & ~bad
        values = values.nan_to_num(0.0)
        if baseline == "greedy":
            base = greedy_parts[k].repeat_interleave(num_samples)
            keep &= torch.isfinite(base)
            base = base.nan_to_num(0.0)
        elif baseline == "mean":
            base = leave_one_out_baseline(values, num_samples, keep)
        else:
            base = torch.zeros_like(values)
        part_advantages.append(advantages(values, base))
        present.append(keep)
    return normalized_sum(torch.stack(part_advantages), weights.to(parts.dtype), num_samples, torch.stack(present))
