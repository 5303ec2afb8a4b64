"""The math of minimum risk training (Shen et al., 2016; Edunov et al., 2018) over a candidate set per source:
which candidates are first of their kind (`first_occurrence_mask`), the distribution `Q` over a source's kept
candidates (`candidate_distribution`) and the expected cost under it (`minimum_risk`, with `Q`). Torch only;
`hf_seqrl.losses.minimum_risk_loss` is the public loss.

Shapes: `B` sources, `k` candidates per source (the candidates of one source are contiguous rows), `T` positions.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def first_occurrence_mask(token_ids: torch.Tensor, num_candidates: int) -> torch.Tensor:
    """Returns, for each candidate, whether no earlier candidate of its source has the same tokens.

    Args:
        token_ids (`torch.LongTensor` of shape `(B*k, T)`): candidates, the `k` of a source contiguous, padded
            with one pad id after their EOS (so that equal sequences are equal rows).
        num_candidates (`int`): `k`.

    Returns: `torch.BoolTensor` of shape `(B*k,)`.
    """
    groups = token_ids.view(-1, num_candidates, token_ids.shape[-1])
    same = (groups.unsqueeze(2) == groups.unsqueeze(1)).all(dim=-1)  # (B, k, k): candidate i equals candidate j
    earlier = torch.ones(num_candidates, num_candidates, dtype=torch.bool, device=token_ids.device).tril(-1)
    return ~(same & earlier).any(dim=-1).reshape(-1)


def candidate_distribution(
    sequence_logprobs: torch.Tensor,
    num_candidates: int,
    alpha: float,
    candidate_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Returns `Q(y) = p(y|x)^alpha / sum_{y' in S} p(y'|x)^alpha` over each source's candidate set `S`.

    That is a softmax of `alpha * log p` over the source's kept candidates; candidates left out get `Q = 0`, and so
    does every candidate of a source with none kept.

    Args:
        sequence_logprobs (`torch.Tensor` of shape `(B*k,)`): `log p(y|x)` of each candidate, with grad.
        num_candidates (`int`): `k`, the candidates of a source being contiguous.
        alpha (`float`): sharpness, `> 0` (Shen et al., 2016).
        candidate_mask (`torch.Tensor` of shape `(B*k,)`, *optional*): false for candidates left out.

    Returns: `torch.Tensor` of shape `(B, k)`.
    """
    scores = alpha * sequence_logprobs.float().view(-1, num_candidates)
    if candidate_mask is None:
        return torch.softmax(scores, dim=-1)
    keep = candidate_mask.view(-1, num_candidates).bool()
    any_kept = keep.any(dim=-1, keepdim=True)
    # A source with nothing kept would softmax over -inf only (NaN): give it finite scores and zero it after.
    scores = scores.masked_fill(~keep, float("-inf")).masked_fill(~any_kept, 0.0)
    return torch.softmax(scores, dim=-1) * any_kept


class MinimumRisk(NamedTuple):
    """The minimum risk training loss and the distribution `Q` it was computed over."""

    loss: torch.Tensor  # scalar, with grad
    q: torch.Tensor  # `(B, k)`, with grad: `candidate_distribution` of the candidates


def minimum_risk(
    sequence_logprobs: torch.Tensor,
    rewards: torch.Tensor,
    num_candidates: int,
    alpha: float,
    candidate_mask: torch.Tensor | None = None,
) -> MinimumRisk:
    """Returns the minimum risk training loss, the mean over sources of `sum_{y in S} Q(y) (1 - r(y))`, with `Q`.

    `Q` is `candidate_distribution` (Shen et al., 2016; Edunov et al., 2018). Rewards are constants: the gradient
    flows through `Q` only, `d risk / d log p(y) = alpha Q(y) (cost(y) - risk)`. Sources with no kept candidate are
    left out of the mean.

    Args:
        sequence_logprobs (`torch.Tensor` of shape `(B*k,)`): `log p(y|x)` of each candidate, with grad.
        rewards (`torch.Tensor` of shape `(B*k,)`): reward of each candidate; its cost is `1 - reward`.
        num_candidates (`int`): `k`, the candidates of a source being contiguous.
        alpha (`float`): sharpness of `Q`, `> 0`.
        candidate_mask (`torch.Tensor` of shape `(B*k,)`, *optional*): false for candidates left out (duplicates
            of an earlier candidate of the source, non-finite rewards).
    """
    q = candidate_distribution(sequence_logprobs, num_candidates, alpha, candidate_mask)
    cost = (1.0 - rewards.detach().to(q.dtype)).view_as(q)
    if candidate_mask is None:
        return MinimumRisk((q * cost).sum(dim=-1).mean(), q)
    keep = candidate_mask.view_as(q).bool()
    risk = (q * torch.where(keep, cost, torch.zeros_like(cost))).sum(dim=-1)
    return MinimumRisk(risk.sum() / keep.any(dim=-1).sum().clamp(min=1), q)
