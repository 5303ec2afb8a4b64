"""The types passed between the stages of a training step: what a rollout decodes (`Rollout`), what the scoring
pass returns over it (`ScoredRollout`), the batch's text columns (`BatchText`), what the rewards give for decoded
sequences (`RewardValues`) and a scored rollout as the policy-gradient loss needs it (`RolloutBatch`).

This is the lowest layer of the package: it imports torch and the standard library only, so every other module
(the model families, the trainers, the losses' callers) can name these types without importing a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

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
        sample_cut (`torch.BoolTensor` of shape `(B*n,)`): true where a sample was cut at the length limit rather
            than ended by an EOS the model chose (`hf_seqrl.models.tokens.cut_at_limit`).
        greedy_cut (`torch.BoolTensor` of shape `(B,)` or None): the same for the greedy rows.
    """

    sample_ids: torch.Tensor
    sample_mask: torch.Tensor
    greedy_ids: torch.Tensor | None
    greedy_mask: torch.Tensor | None
    num_samples: int
    sample_cut: torch.Tensor
    greedy_cut: torch.Tensor | None = None

    def split(self, sources: list[int]) -> list["Rollout"]:
        """Returns the rollouts of consecutive parts of the batch, `sources[k]` sources each (summing to `B`), every
        part cut to the width of its longest sequence, greedy rows included (as a decode of that part alone returns
        it)."""
        parts, start, n = [], 0, self.num_samples
        for count in sources:
            rows = slice(start * n, (start + count) * n)
            sample_ids, sample_mask = self.sample_ids[rows], self.sample_mask[rows]
            width = _counted_width(sample_mask)
            greedy_ids = greedy_mask = greedy_cut = None
            if self.greedy_ids is not None:
                greedy_ids, greedy_mask = self.greedy_ids[start:start + count], self.greedy_mask[start:start + count]
                width = max(width, _counted_width(greedy_mask))
                greedy_ids, greedy_mask = greedy_ids[:, :width], greedy_mask[:, :width]
                greedy_cut = None if self.greedy_cut is None else self.greedy_cut[start:start + count]
            parts.append(Rollout(sample_ids[:, :width], sample_mask[:, :width], greedy_ids, greedy_mask, n,
                                 self.sample_cut[rows], greedy_cut))
            start += count
        if start * n != self.sample_ids.shape[0]:
            raise ValueError(f"Rollout.split: the parts hold {start} sources, the rollout {self.sample_ids.shape[0] // n}.")
        return parts


def _counted_width(mask: torch.Tensor) -> int:
    """Returns the number of columns up to the longest row's last counted token of `mask` `(N, T)` (at least 1)."""
    return max(int(mask.sum(dim=1).max()) if mask.numel() else 1, 1)


@dataclass
class ScoredRollout:
    """Output of the teacher-forced pass over a rollout: what the losses read, reduced over the vocabulary slice by
    slice (`hf_seqrl.functional.lm_head`; no tensor of every position's logits is kept).

    Attributes:
        token_logprobs (`torch.Tensor` of shape `(B*n, T)`): log-prob of each sampled token (with grad), under the
            distribution the samples were drawn from (at its temperature, banned tokens excluded).
        gold_logprobs (`torch.Tensor` of shape `(B, T_gold)` or None): log-prob of each gold token at temperature 1
            (with grad; any value where the label is -100), under the same bans.
        entropy (`torch.Tensor` of shape `(B*n, T)`): entropy of the temperature-1 distribution at each sampled
            position, bans applied (with grad only when the pass was asked for it).
        kl (`torch.Tensor` of shape `(B*n, T)` or None): `KL(policy || reference)` at each sampled position, when the
            pass was given a reference.
        plain_logprobs (`torch.Tensor` of shape `(B*n, T)` or None): the sampled tokens' log-probs at temperature 1,
            when asked.
        divergence (`torch.Tensor` of shape `(B*n, T)` or None): the divergence to a teacher's distribution at each
            sampled position (with grad), when the pass was given a teacher (`ScoreOptions.divergence`).
        raw_logprobs, raw_logprob_sums (`torch.Tensor` of shape `(B, T_gold)`, or `(B*n, T)` without gold rows, or
            None): label smoothing's terms, with no bans (`hf_seqrl.losses.label_smoothed_cross_entropy`), when asked.
        vocab_size (`int`): the width of the model's logits.
    """

    token_logprobs: torch.Tensor
    gold_logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    plain_logprobs: torch.Tensor | None = None
    divergence: torch.Tensor | None = None
    raw_logprobs: torch.Tensor | None = None
    raw_logprob_sums: torch.Tensor | None = None
    vocab_size: int = 0


class BatchText(NamedTuple):
    """The columns of a batch that stay out of the model: what rewards and evaluation read."""

    references: list[list[str]] | None
    sources: list[str] | None
    columns: dict[str, list]  # every other non-model column, one entry per row

    def select(self, rows: list[bool]) -> BatchText:
        """Returns the rows where `rows` is true."""
        return BatchText(_pick(self.references, rows), _pick(self.sources, rows),
                         {key: _pick(values, rows) for key, values in self.columns.items()})


def _pick(values: list | None, rows: list[bool]) -> list | None:
    """Returns the entries of `values` where `rows` is true (None stays None)."""
    return None if values is None else [value for value, keep in zip(values, rows) if keep]


def repeat_rows(text: BatchText, n: int) -> BatchText:
    """Returns `text` with each row repeated `n` times in place (the layout of `n` samples per source)."""
    def repeat(values):
        return None if values is None else [v for v in values for _ in range(n)]

    return BatchText(repeat(text.references), repeat(text.sources),
                     {key: repeat(values) for key, values in text.columns.items()})


class RewardValues(NamedTuple):
    """The rewards of `N` decoded sequences, one row of `BatchText` each, every reward function scored once."""

    predictions: list[str]  # the decoded sequences
    values: list[float | None]  # the reward of each, as the reward returned it (NaN / inf and None kept)
    parts: dict[str, list[float | None]]  # each reward function's values by name (a single reward: its own name)
    rewards: torch.Tensor  # `(N,)` float32, 0 where the sequence is left out
    left_out: torch.Tensor  # `(N,)` bool: no reward applies (None), or a non-finite one dropped
    # `(N, T)` float32: each token's value from token-level rewards (`hf_seqrl.rewards.spans`), 0 where none; None
    # when no reward returned any (or the tokens were not given to map them to)
    token_values: torch.Tensor | None = None

    def select(self, rows: torch.Tensor) -> RewardValues:
        """Returns the values of the sequences where the bool tensor `rows` `(N,)` is true."""
        keep = rows.tolist()
        return RewardValues(_pick(self.predictions, keep), _pick(self.values, keep),
                            {name: _pick(values, keep) for name, values in self.parts.items()}, self.rewards[rows],
                            self.left_out[rows], None if self.token_values is None else self.token_values[rows])

    def missing(self) -> int:
        """Returns how many sequences no reward applies to (`None`)."""
        return sum(value is None for value in self.values)

    def part_rewards(self) -> dict[str, torch.Tensor]:
        """Returns each part's values as a float32 tensor `(N,)`, NaN where that part gives no finite value (it
        returned None or NaN / inf) or the sequence is left out."""
        def number(value):  # a token-level value counts by its sentence score
            return float("nan") if value is None else getattr(value, "score", value) or 0.0

        return {name: torch.tensor([number(v) for v in values], dtype=torch.float32, device=self.rewards.device)
                .masked_fill(self.left_out, float("nan")) for name, values in self.parts.items()}


@dataclass
class RolloutBatch:
    """A micro-batch's rollout with its rewards and advantages: what the scoring pass and the algorithm's loss read
    (the stages of `RolloutTrainer.rl_loss`; `hf_seqrl.objectives`).

    Attributes:
        sample_ids (`torch.LongTensor` of shape `(B*n, T)`), sample_mask (`torch.BoolTensor` of shape `(B*n, T)`):
            the samples, as in `Rollout` (MRT: each source's `n` candidates).
        advantages (`torch.Tensor` of shape `(B*n,)` or `(B*n, T)`, or None): advantage of each sample, or of each
            of its tokens; None where the loss weighs the samples itself (MRT's risk).
        metrics (`dict[str, float]`): what the rollout measured (`rl/reward`, ...), logged at every use.
        old_token_logprobs (`torch.Tensor` of shape `(B*n, T)` or None): log-probs at rollout time (reused rollouts
            only).
        kept (`torch.BoolTensor` of shape `(B*n,)` or None): false for the samples left out of the loss (no usable
            reward); None keeps every sample.
        rng_state (`tuple` or None): the RNG state the scoring pass that gave `old_token_logprobs` drew from
            (`hf_seqrl.models.base.rng_state`), replayed by later passes over the same rollout so that, with dropout
            on, they thin the same units and the ratios move with the weights only.
        group (`int`): rows per source (`n`).
        rewards (`torch.Tensor` of shape `(B*n,)` or None): each sample's reward (0 where it has none).

    An objective whose stages pass on more subclasses it (a dataclass of its own module: MRT's `CandidateBatch`,
    MIXER's `MixerBatch`, distillation's `DistillationBatch`).
    """

    sample_ids: torch.Tensor
    sample_mask: torch.Tensor
    advantages: torch.Tensor | None
    metrics: dict = field(default_factory=dict)
    old_token_logprobs: torch.Tensor | None = None
    kept: torch.Tensor | None = None
    rng_state: tuple | None = None
    group: int = 1
    rewards: torch.Tensor | None = None

    @property
    def loss_mask(self) -> torch.Tensor:
        """Returns the tokens the policy-gradient term counts, `(B*n, T)`: `sample_mask` without the left-out rows."""
        return self.sample_mask if self.kept is None else self.sample_mask & self.kept.unsqueeze(1)
