"""Pure tensor math of sequence-level training. Imports torch only.

Shapes: `B` sources in a batch, `n` samples per source (samples of one source are contiguous rows),
`T` decoded positions, `V` vocabulary size.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .functional import advantages as _advantage_math
from .functional import risk as _risk_math


def advantages(rewards: torch.Tensor, baseline: torch.Tensor | float) -> torch.Tensor:
    """Returns `rewards - baseline` `(B*n,)`, with no gradient through either (a baseline tensor `(B*n,)` or a float):
    the public form of `hf_seqrl.functional.advantages.advantages`, which the trainers' advantage math calls."""
    return _advantage_math.advantages(rewards, baseline)


def leave_one_out_baseline(rewards: torch.Tensor, num_samples: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Returns, for each sample of `rewards` `(B*n,)` (a source's `num_samples` contiguous), the mean reward of the
    other (kept) samples of its source: the public form of `hf_seqrl.functional.advantages.leave_one_out_baseline`,
    which documents `keep` and the errors."""
    return _advantage_math.leave_one_out_baseline(rewards, num_samples, keep)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Returns the sum of `x` over `dim`, counting only positions where `mask` is true.

    Args:
        x (`torch.Tensor` of shape `(..., T)`): values.
        mask (`torch.Tensor` of shape `(..., T)`, bool or 0/1): which positions count.
    """
    return (x * mask.to(x.dtype)).sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Returns the mean of `x` over `dim` at the positions where `mask` is true (0 where none is).

    Args:
        x (`torch.Tensor` of shape `(..., T)`): values.
        mask (`torch.Tensor` of shape `(..., T)`, bool or 0/1): which positions count.
    """
    count = mask.to(x.dtype).sum(dim=dim)
    return masked_sum(x, mask, dim=dim) / count.clamp(min=1.0)


def sequence_logprobs(
    token_logprobs: torch.Tensor, token_mask: torch.Tensor, length_normalize: bool = False
) -> torch.Tensor:
    """Returns the log-probability of each sequence: sum (or mean) of its token log-probs.

    Args:
        token_logprobs (`torch.Tensor` of shape `(B*n, T)`): log-prob of each sampled token.
        token_mask (`torch.Tensor` of shape `(B*n, T)`): true up to and including the EOS of each sample.
    """
    if length_normalize:
        return masked_mean(token_logprobs, token_mask)
    return masked_sum(token_logprobs, token_mask)


LOSS_NORMALIZATIONS = ("sequence", "token")


def check_loss_normalization(loss_normalization: str, length_normalize: bool, importance_sampling_level: str = "token",
                             owner: str = "") -> None:
    """Raises a ValueError unless the normalization settings go together: `loss_normalization` is known, `"token"`
    goes without `length_normalize`, and the sequence-level ratio with `"sequence"` and no `length_normalize`. The
    messages name the fields as `owner.field` (a config's class name) when `owner` is given."""
    field = f"{owner}." if owner else ""
    if loss_normalization not in LOSS_NORMALIZATIONS:
        raise ValueError(f"{field}loss_normalization={loss_normalization!r} is not one of {LOSS_NORMALIZATIONS}.")
    if importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(f"{field}importance_sampling_level={importance_sampling_level!r} is not one of "
                         f"{IMPORTANCE_SAMPLING_LEVELS}.")
    if loss_normalization == "token" and length_normalize:
        raise ValueError(
            f"{field}loss_normalization='token' already divides by the token count: set length_normalize=False, or "
            "loss_normalization='sequence' for per-sequence means.")
    if importance_sampling_level == "sequence" and (loss_normalization != "sequence" or length_normalize):
        raise ValueError(
            f"{field}importance_sampling_level='sequence' gives each sample one ratio, already a mean over its "
            "tokens, and averages the clipped terms over samples: set loss_normalization='sequence' and "
            "length_normalize=False (a token-level sum would weigh samples by their length).")


def reduce_token_losses(
    token_losses: torch.Tensor,
    token_mask: torch.Tensor,
    length_normalize: bool = False,
    loss_normalization: str = "sequence",
) -> torch.Tensor:
    """Returns the scalar loss of per-token losses: a mean over sequences, or over every counted token.

    `"sequence"`: `mean_i sum_t m_it l_it` (`mean_t` instead of `sum_t` with `length_normalize`), every sequence
    weighing alike. `"token"`: `sum_it m_it l_it / sum_it m_it`, every sampled token weighing alike.

    Args:
        token_losses (`torch.Tensor` of shape `(B*n, T)`): loss of each token.
        token_mask (`torch.Tensor` of shape `(B*n, T)`): true up to and including the EOS of each sample.
    """
    check_loss_normalization(loss_normalization, length_normalize)
    if loss_normalization == "token":
        return masked_sum(token_losses.flatten(), token_mask.flatten(), 0) / token_mask.sum().clamp(min=1)
    per_sequence = masked_mean(token_losses, token_mask) if length_normalize else masked_sum(token_losses, token_mask)
    return mean_over_counted(per_sequence, token_mask)


def mean_over_counted(per_sequence: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """Returns the mean of `per_sequence` `(N,)` over the sequences with at least one counted token in `token_mask`
    `(N, T)` (a sequence left out of the loss has none; 0 when none is counted)."""
    counted = token_mask.any(dim=-1)
    total = torch.where(counted, per_sequence, torch.zeros_like(per_sequence)).sum()
    return total / counted.sum().clamp(min=1)


def token_advantages(advantages: torch.Tensor, token_logprobs: torch.Tensor) -> torch.Tensor:
    """Returns the advantages as a `(N, T)` tensor of constants in the dtype of `token_logprobs` `(N, T)`: a
    per-sample `(N,)` advantage repeated over the sample's tokens, a per-token `(N, T)` one as it is.

    Raises:
        ValueError: `advantages` is neither `(N,)` nor `(N, T)`.
    """
    adv = advantages.detach().to(token_logprobs.dtype)
    if adv.dim() == 1 and adv.shape[0] == token_logprobs.shape[0]:
        return adv.unsqueeze(-1).expand_as(token_logprobs)
    if adv.shape == token_logprobs.shape:
        return adv
    raise ValueError(f"advantages has shape {tuple(advantages.shape)}: give one per sample {tuple(token_logprobs.shape[:1])} "
                     f"or one per token {tuple(token_logprobs.shape)}.")


def policy_gradient_loss(
    token_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    advantages: torch.Tensor,
    length_normalize: bool = False,
    loss_normalization: str = "sequence",
) -> torch.Tensor:
    """Returns the REINFORCE loss `-mean_i A_i * log p(y_i | x_i)`, a scalar; the mean runs over the sequences with
    a counted token (a row of `token_mask` that is all false is left out of the loss).

    Its gradient is the score-function estimate of `-grad E[reward]` when `A_i = r_i - b_i` with a baseline
    `b_i` that does not depend on `y_i`. With `loss_normalization="token"` it is
    `-sum_it m_it A_i log p(y_it | ...) / sum_it m_it` instead: long samples weigh more. Per-token advantages
    `A_it` (token-level rewards, a teacher's log-ratios) take the place of `A_i` at each token:
    `-mean_i sum_t m_it A_it log p(y_it | ...)`; with `A_it = A_i` that is the per-sample loss.

    Args:
        token_logprobs (`torch.Tensor` of shape `(B*n, T)`): log-prob of each sampled token, with grad.
        token_mask (`torch.Tensor` of shape `(B*n, T)`): true up to and including the EOS of each sample.
        advantages (`torch.Tensor` of shape `(B*n,)` or `(B*n, T)`): advantage of each sample, or of each token
            (treated as a constant).
        length_normalize (`bool`): use the mean instead of the sum of token log-probs.
        loss_normalization (`str`): `"sequence"` or `"token"` (see `reduce_token_losses`).
    """
    if loss_normalization != "sequence" or advantages.dim() == 2:
        adv = token_advantages(advantages, token_logprobs)
        return reduce_token_losses(-adv * token_logprobs, token_mask, length_normalize, loss_normalization)
    seq_logprobs = sequence_logprobs(token_logprobs, token_mask, length_normalize)
    return -mean_over_counted(advantages.detach().to(seq_logprobs.dtype) * seq_logprobs, token_mask)


IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


class ClippedPolicyLoss(NamedTuple):
    """The clipped surrogate loss and what is logged of its importance ratios, all from one ratio computation (per
    token, or per sequence)."""

    loss: torch.Tensor  # scalar, with grad
    clip_fraction: torch.Tensor  # scalar, no grad: share of counted ratios whose clipped term is taken
    ratio_mean: torch.Tensor  # scalar, no grad: mean of the counted ratios
    ratio_min: torch.Tensor  # scalar, no grad
    ratio_max: torch.Tensor  # scalar, no grad


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, epsilon: float, epsilon_high: float | None = None,
                      delta: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns `(surrogate, clipped)` of importance ratios `ratio` and their advantages (same shape, or broadcast):
    `min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A)`, with `r` capped at `delta` in the first term when given
    (a two-sided clip for negative advantages, as INTELLECT-2 does), and whether the taken term is a clipped one (no
    gradient through `r` there).

    Args:
        ratio (`torch.Tensor`): importance ratios `p_theta / p_old`, with grad.
        advantages (`torch.Tensor`): advantage of each ratio (treated as a constant).
        epsilon (`float`), epsilon_high (`float`, *optional*): the band `[1 - epsilon, 1 + epsilon_high]`
            (`epsilon_high=None` takes `epsilon`).
        delta (`float`, *optional*): the cap of the unclipped ratio, `> 1 + epsilon_high`; None: no cap.
    """
    high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages.detach().to(ratio.dtype)
    unclipped = ratio if delta is None else ratio.clamp(max=delta)
    surrogate = torch.minimum(unclipped * adv, ratio.clamp(1.0 - epsilon, 1.0 + high) * adv)
    with torch.no_grad():
        clipped = ((ratio < 1.0 - epsilon) & (adv < 0)) | ((ratio > 1.0 + high) & (adv > 0))
        if delta is not None:
            clipped |= (ratio > delta) & (adv < 0)
    return surrogate, clipped


def clipped_policy_objective(
    token_logprobs: torch.Tensor,
    old_token_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    advantages: torch.Tensor,
    epsilon: float,
    epsilon_high: float | None = None,
    length_normalize: bool = False,
    loss_normalization: str = "sequence",
    importance_sampling_level: str = "token",
    delta: float | None = None,
) -> ClippedPolicyLoss:
    """Returns the clipped surrogate loss (PPO, Schulman et al., 2017; GRPO; GSPO) with its clip fraction and ratios.

    `importance_sampling_level="token"`: per token, `l_it = -min(rho_it A_i, clip(rho_it) A_i)` with the token
    ratio `rho_it = p_theta(y_it | ...) / p_old(y_it | ...)`, reduced like `policy_gradient_loss` (sum or mean over a
    sequence's tokens, mean over sequences; or mean over all tokens). `"sequence"` (GSPO, Zheng et al., 2025): one
    ratio per sequence, `s_i = exp(mean_t log(p_theta / p_old))` over its counted tokens, `l_i = -min(s_i A_i,
    clip(s_i) A_i)`, the mean over sequences; its gradient reaches every token of the sequence through the mean. At
    ratio 1 the token level's gradient equals the policy gradient's, the sequence level's that of the length-normalized
    policy gradient. A ratio that left the band in the direction its advantage pushes gets no gradient; those
    ratios' share of the counted ones is `clip_fraction` (`clipped_surrogate`; `delta` caps the ratio of negative
    advantages).

    Per-token advantages `A_it` replace `A_i` at each token. At the sequence level they take GSPO-token's ratio
    `s_it = sg[s_i] p_theta(y_it) / sg[p_theta(y_it)]` (equal to `s_i` in value, its gradient that of `log p(y_it)`
    scaled by `s_i`): `l_i = -mean_t min(s_it A_it, clip(s_it) A_it)`, which is GSPO's loss when `A_it = A_i`; a
    sequence counts as clipped when any of its tokens is.

    Args:
        token_logprobs (`torch.Tensor` of shape `(B*n, T)`): log-prob of each sampled token under the current
            model, with grad.
        old_token_logprobs (`torch.Tensor` of shape `(B*n, T)`): the same when the rollout was taken (no grad).
        token_mask (`torch.Tensor` of shape `(B*n, T)`): true up to and including the EOS of each sample.
        advantages (`torch.Tensor` of shape `(B*n,)` or `(B*n, T)`): advantage of each sample, or of each token
            (treated as a constant).
        epsilon (`float`): lower clipping range, `> 0`.
        epsilon_high (`float`, *optional*): upper clipping range; `None` takes `epsilon`.
        length_normalize (`bool`), loss_normalization (`str`): as in `policy_gradient_loss` (token level only: the
            sequence level's loss is a mean over sequences of a ratio that is already a per-token mean).
        importance_sampling_level (`str`): `"token"` or `"sequence"`.
        delta (`float`, *optional*): see `clipped_surrogate`.
    """
    check_loss_normalization(loss_normalization, length_normalize, importance_sampling_level)
    mask = token_mask.bool()
    # Masked positions (padding after EOS) may hold any log-prob; zero them so that exp never overflows there.
    log_ratio = (token_logprobs - old_token_logprobs.detach()).masked_fill(~mask, 0.0)
    if importance_sampling_level == "sequence":
        ratio = masked_mean(log_ratio, mask).exp()  # (B*n,)
        counted = mask.any(dim=-1)
        if advantages.dim() == 2:  # GSPO-token: s_it = sg[s_i] p_theta(y_it) / sg[p_theta(y_it)], equal in value to s_i
            token_ratio = ratio.detach().unsqueeze(-1) * (token_logprobs - token_logprobs.detach()).exp()
            surrogate, token_clipped = clipped_surrogate(token_ratio, token_advantages(advantages, token_logprobs),
                                                         epsilon, epsilon_high, delta)
            loss = mean_over_counted(-masked_mean(surrogate, mask), mask)
            with torch.no_grad():
                clipped = (token_clipped & mask).any(dim=-1)
        else:
            surrogate, clipped = clipped_surrogate(ratio, advantages, epsilon, epsilon_high, delta)
            loss = mean_over_counted(-surrogate, mask)
    else:
        ratio = log_ratio.exp()
        surrogate, clipped = clipped_surrogate(ratio, token_advantages(advantages, token_logprobs), epsilon,
                                               epsilon_high, delta)
        loss = reduce_token_losses(-surrogate, mask, length_normalize, loss_normalization)
        counted = mask
    with torch.no_grad():
        kept = ratio.detach()[counted]
        if not kept.numel():
            kept = ratio.new_ones(1)
        return ClippedPolicyLoss(loss, clipped[counted].float().mean() if counted.any() else ratio.new_zeros(()),
                                 kept.mean(), kept.min(), kept.max())


def minimum_risk_loss(
    sequence_logprobs: torch.Tensor,
    rewards: torch.Tensor,
    num_candidates: int,
    alpha: float,
    candidate_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Returns the minimum risk training loss, a scalar: the mean over sources of `sum_{y in S} Q(y) (1 - r(y))`
    (`hf_seqrl.functional.risk.minimum_risk`, which documents the arguments and returns `Q` too)."""
    return _risk_math.minimum_risk(sequence_logprobs, rewards, num_candidates, alpha, candidate_mask).loss


class Regularized(NamedTuple):
    """What `regularize` returns."""

    loss: torch.Tensor
    entropy: torch.Tensor  # mean token entropy over the counted tokens (0 without any)
    kl: torch.Tensor | None  # mean token KL over them, None without a KL term


def regularize(loss: torch.Tensor, entropy: torch.Tensor, token_mask: torch.Tensor, entropy_coef: float,
               kl: torch.Tensor | None = None, kl_coef: float = 0.0) -> Regularized:
    """Returns `loss - entropy_coef * H + kl_coef * KL`, `H` and `KL` the means of the per-token `entropy` and `kl`
    `(N, T)` over the counted tokens `token_mask` (0 where none counts); the KL term only with `kl_coef > 0`."""
    mask = token_mask.flatten()
    mean_entropy = masked_mean(entropy.flatten(), mask, 0)
    if entropy_coef > 0:
        loss = loss - entropy_coef * mean_entropy
    mean_kl = None
    if kl_coef > 0:
        mean_kl = masked_mean(kl.flatten(), mask, 0)
        loss = loss + kl_coef * mean_kl
    return Regularized(loss, mean_entropy, mean_kl)


def sampled_kl(policy_logprobs: torch.Tensor, other_logprobs: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """Returns the sampled estimate of `KL(policy || other)` per token: the mean of `log p - log q` at the policy's
    own sampled tokens `(N, T)`, over `token_mask` (no grad)."""
    gap = policy_logprobs.detach() - other_logprobs.detach()
    return masked_mean(gap.flatten(), token_mask.flatten(), 0)


def mix_losses(rl_loss: torch.Tensor, xe_loss: torch.Tensor | None, rl_weight: float) -> torch.Tensor:
    """Returns `rl_weight * rl_loss + (1 - rl_weight) * xe_loss` (Paulus et al., 2017).

    `xe_loss` may be None only when `rl_weight == 1`.
    """
    if rl_weight >= 1.0:
        return rl_loss
    if xe_loss is None:
        raise ValueError(f"mix_losses needs xe_loss when rl_weight={rl_weight} < 1.")
    if rl_weight <= 0.0:
        return xe_loss
    return rl_weight * rl_loss + (1.0 - rl_weight) * xe_loss


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Returns the mean token cross-entropy over positions where `labels != ignore_index`.

    Args:
        logits (`torch.Tensor` of shape `(N, T, V)`), labels (`torch.Tensor` of shape `(N, T)`).
    """
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=ignore_index)


def cross_entropy_from_logprobs(token_logprobs: torch.Tensor, labels: torch.Tensor,
                                ignore_index: int = -100) -> torch.Tensor:
    """Returns the mean of `-token_logprobs` over positions where `labels != ignore_index` (0 where none is):
    `cross_entropy` from the gold tokens' log-probs when a pass has computed them already.

    Args:
        token_logprobs (`torch.Tensor` of shape `(N, T)`): log-prob of each label (any value where ignored).
        labels (`torch.Tensor` of shape `(N, T)`).
    """
    return -masked_mean(token_logprobs.flatten(), (labels != ignore_index).flatten(), 0)


def label_smoothed_cross_entropy(raw_logprobs: torch.Tensor, raw_logprob_sums: torch.Tensor, labels: torch.Tensor,
                                 epsilon: float, vocab_size: int, ignore_index: int = -100) -> torch.Tensor:
    """Returns `(1 - epsilon) * NLL + epsilon * mean over positions and tokens of -log p`: transformers' label
    smoothing over the positions where `labels != ignore_index`, from the log-probs a chunked pass reduced.

    Args:
        raw_logprobs (`torch.Tensor` of shape `(N, T)`): `log p(label)` at each position (any value where ignored).
        raw_logprob_sums (`torch.Tensor` of shape `(N, T)`): `sum_v log p(v)` at each position.
        labels (`torch.Tensor` of shape `(N, T)`). vocab_size (`int`): `V`, the number of tokens summed over.
    """
    active = labels != ignore_index
    count = active.sum()
    nll = -torch.where(active, raw_logprobs, 0.0).sum() / count
    smoothed = -torch.where(active, raw_logprob_sums, 0.0).sum() / (count * vocab_size)
    return (1 - epsilon) * nll + epsilon * smoothed


def mixer_loss(
    token_logprobs: torch.Tensor,
    prefix_mask: torch.Tensor,
    continuation_mask: torch.Tensor,
    advantages: torch.Tensor,
    prefix_logprobs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Returns MIXER's loss, `mean_i [ -Σ_{t<P_i} log p(y*_t) - A_i Σ_{t>=P_i} log p(ŷ_t) ]`, a scalar.

    Cross-entropy on the gold prefix of each row and REINFORCE on the sampled continuation (Ranzato et al., 2016).
    With empty prefixes it is exactly `policy_gradient_loss` (sums over tokens).

    Args:
        token_logprobs (`torch.Tensor` of shape `(B*n, T)`): log-prob of each token of prefix + continuation.
        prefix_mask (`torch.Tensor` of shape `(B*n, T)`): the gold prefix positions.
        continuation_mask (`torch.Tensor` of shape `(B*n, T)`): the sampled positions, up to and including EOS.
        advantages (`torch.Tensor` of shape `(B*n,)` or `(B*n, T)`): advantage of each row, or of each token (a
            constant; `-Σ_{t>=P_i} A_it log p(ŷ_t)` then).
        prefix_logprobs (`torch.Tensor` of shape `(B*n, T)`, *optional*): log-probs for the cross-entropy part when
            they differ from `token_logprobs` (taken at temperature 1 while samples were drawn at another).
    """
    prefix_logprobs = token_logprobs if prefix_logprobs is None else prefix_logprobs
    xe = -masked_sum(prefix_logprobs, prefix_mask)
    if advantages.dim() == 2:
        pg = -masked_sum(token_advantages(advantages, token_logprobs) * token_logprobs, continuation_mask)
    else:
        pg = -advantages.detach().to(token_logprobs.dtype) * masked_sum(token_logprobs, continuation_mask)
    return (xe + pg).mean()
