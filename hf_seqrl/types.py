"""The types passed between the stages of a training step: what a rollout decodes (`Rollout`) and what the scoring
pass returns over it (`ScoredRollout`).

This is the lowest layer of the package: it imports torch and the standard library only, so every other module
(the model families, the trainers, the losses' callers) can name these types without importing a model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    """Sequences decoded for a batch of `B` sources.

    Attributes:
        sample_ids (`torch.LongTensor` of shape `(B*n, T)`): sampled tokens (decoder start token stripped),
            `pad_token_id` after EOS; the `n` samples of a source are contiguous.
        sample_mask (`torch.BoolTensor` of shape `(B*n, T)`): true up to and including each sample's EOS.
        greedy_ids (`torch.LongTensor` of shape `(B, T')` or None): greedy decode of each source.
        greedy_mask (`torch.BoolTensor` of shape `(B, T')` or None).
        num_samples (`int`): `n`.
    """

    sample_ids: torch.Tensor
    sample_mask: torch.Tensor
    greedy_ids: torch.Tensor | None
    greedy_mask: torch.Tensor | None
    num_samples: int

    def split(self, sources: list[int]) -> list["Rollout"]:
        """Returns the rollouts of consecutive parts of the batch, `sources[k]` sources each (summing to `B`), every
        part cut to the width of its longest sequence, greedy rows included (as a decode of that part alone returns
        it)."""
        parts, start, n = [], 0, self.num_samples
        for count in sources:
            rows = slice(start * n, (start + count) * n)
            sample_ids, sample_mask = self.sample_ids[rows], self.sample_mask[rows]
            width = _counted_width(sample_mask)
            greedy_ids = greedy_mask = None
            if self.greedy_ids is not None:
                greedy_ids, greedy_mask = self.greedy_ids[start:start + count], self.greedy_mask[start:start + count]
                width = max(width, _counted_width(greedy_mask))
                greedy_ids, greedy_mask = greedy_ids[:, :width], greedy_mask[:, :width]
            parts.append(Rollout(sample_ids[:, :width], sample_mask[:, :width], greedy_ids, greedy_mask, n))
            start += count
        if start * n != self.sample_ids.shape[0]:
            raise ValueError(f"Rollout.split: the parts hold {start} sources, the rollout {self.sample_ids.shape[0] // n}.")
        return parts


def _counted_width(mask: torch.Tensor) -> int:
    """Returns the number of columns up to the longest row's last counted token of `mask` `(N, T)` (at least 1)."""
    return max(int(mask.sum(dim=1).max()) if mask.numel() else 1, 1)


@dataclass
class ScoredRollout:
    """Output of the teacher-forced pass over a rollout.

    Attributes:
        sample_logits (`torch.Tensor` of shape `(B, n, T, V)`): decoder logits at the sampled positions (a view of
            the forward's logits, banned entries included; `sample_logits[b, j]` belongs to row `b * n + j` of the
            samples).
        token_logprobs (`torch.Tensor` of shape `(B*n, T)`): log-prob of each sampled token (with grad), under the
            distribution the samples were drawn from (banned tokens excluded).
        gold_logits (`torch.Tensor` of shape `(B, T_gold, V)` or None): logits of the gold rows (unmasked).
        gold_logprobs (`torch.Tensor` of shape `(B, T_gold)` or None): log-prob of each gold token at temperature 1
            (with grad; any value where the label is -100), from the same pass as `token_logprobs` and under the
            same bans. None where the family computes only `gold_logits`.
        banned (`torch.BoolTensor` of shape `(V,)` or `(T, V)`, or None): the entries of `sample_logits` outside the
            rollout distribution (`hf_seqrl.models.bans.TokenBans.mask`), for the entropy and KL kernels' `banned`
            argument.
    """

    sample_logits: torch.Tensor
    token_logprobs: torch.Tensor
    gold_logits: torch.Tensor | None
    gold_logprobs: torch.Tensor | None = None
    banned: torch.Tensor | None = None
