"""The one scoring pass both model families share: a teacher-forced forward over a source's samples (and its gold
row), its output layer's inputs reduced a slice of the vocabulary at a time (`hf_seqrl.functional.lm_head`) into the
samples' log-probs, entropy, KL and divergence (`ScoreOptions`), and the frozen model's positions a later pass's KL
reads. A family supplies the forward (`ModelFamily.target_forward`); `ModelFamily.score` runs `score_targets`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..functional.lm_head import Divergence, position_stats
from ..functional.output_layer import Positions
from ..types import ScoredRollout
from .bans import TokenBans
from .heads import handing_hidden
from .tokens import right_pad


@dataclass(frozen=True)
class ScoreOptions:
    """What a scoring pass computes besides the token log-probs (each costs one more reduction per chunk).

    Attributes:
        reference (`Positions`, *optional*): a frozen model's output-layer inputs at the sampled positions
            (`ModelFamily.reference_positions`); gives `ScoredRollout.kl`.
        entropy_grad (`bool`): the entropy carries grad (an entropy bonus), else it is a detached metric.
        plain (`bool`): the samples' log-probs at temperature 1 too. raw (`bool`): label smoothing's terms.
        divergence (`Divergence`, *optional*): a teacher's output-layer inputs at the sampled positions, the
            interpolation and temperature of the divergence to it; gives `ScoredRollout.divergence`.
    """

    reference: Positions | None = None
    entropy_grad: bool = False
    plain: bool = False
    raw: bool = False
    divergence: Divergence | None = None


def _flat_positions(batch: int, group: int, length: int, rows: range, width: int, device) -> tuple:
    """Returns the flat indices `(batch*len(rows)*width,)` of rows `rows` of each group, positions `< width`, in a
    `(batch, group, length)` layout, and each one's position."""
    b = torch.arange(batch, device=device).view(-1, 1, 1) * group * length
    r = torch.arange(rows.start, rows.stop, device=device).view(1, -1, 1) * length
    t = torch.arange(width, device=device).view(1, 1, -1)
    return (b + r + t).flatten(), t.expand(batch, len(rows), width).flatten()


def score_targets(forward, model, sample_ids: torch.Tensor, num_samples: int, gold: torch.Tensor | None, pad: int,
                  temperature: float = 1.0, bans: TokenBans | None = None,
                  options: ScoreOptions = ScoreOptions()) -> ScoredRollout:
    """Returns the scoring pass over the `n` samples of every source and, with `gold`, its gold row: one forward
    over all of them, the output layer's inputs reduced a slice of the vocabulary at a time (`position_stats`, inside
    the forward) into the samples' log-probs (at `temperature`), entropy (and KL, ...: `options`) and the gold tokens'
    log-probs (at temperature 1), all under `bans` (banned tokens out of the softmax).

    Args:
        forward: `forward(targets, group)` runs the teacher-forced pass of `targets` `(B*group, L)` (-100 read as
            pad), `group` rows per source, and returns its output (a family's `target_forward`).
        model: the unwrapped model `forward` runs (its output layer, `hf_seqrl.models.heads`).
        sample_ids (`torch.LongTensor` of shape `(B*n, T)`): sampled tokens, pad after EOS.
        gold (`torch.LongTensor` of shape `(B, T_gold)`, -100 after each row's last token, *optional*): gold targets;
            the returned gold log-probs `(B, T_gold)` are aligned with them.
    """
    batch, t_sample = sample_ids.shape[0] // num_samples, sample_ids.shape[1]
    rows, group = sample_ids.view(batch, num_samples, t_sample), num_samples
    if gold is not None:
        length = max(t_sample, gold.shape[1])
        rows = right_pad(rows.flatten(0, 1), length, pad).view(batch, num_samples, length)
        rows = torch.cat([rows, right_pad(gold, length, -100).unsqueeze(1)], dim=1)
        group += 1
    length, device = rows.shape[2], sample_ids.device
    out = {}

    def reduce(positions: Positions):
        banned = None if bans is None else bans.mask(length, positions.vocab_size, device)
        where, at = _flat_positions(batch, group, length, range(num_samples), t_sample, device)
        samples = position_stats(positions.take(where), sample_ids.flatten(), temperature, banned, at,
                                 reference=options.reference, entropy=True, entropy_grad=options.entropy_grad,
                                 plain=options.plain, raw=options.raw and gold is None, divergence=options.divergence)
        out["samples"], out["vocab_size"] = samples, positions.vocab_size
        if gold is not None:
            where, at = _flat_positions(batch, group, length, range(num_samples, group), gold.shape[1], device)
            out["gold"] = position_stats(positions.take(where), gold.flatten(), 1.0, banned, at, raw=options.raw)

    def receive(hidden, layer):  # inside the forward: a sharded model holds its output layer gathered here
        reduce(Positions(hidden.reshape(-1, hidden.shape[-1]), layer))
        return out["samples"].logprobs[:1].sum()

    with handing_hidden(model, receive) as known:
        output = forward(rows.flatten(0, 1), group)
    tie = 0.0
    if not known:
        reduce(Positions(logits=output.logits.reshape(-1, output.logits.shape[-1])))
    elif output.logits.requires_grad:
        # The forward's placeholder logits join the loss (times 0), so that a backward passes through the output
        # module's output: ZeRO-3 gathers the module's weight there, before the chunks' backward reads it.
        tie = output.logits.sum() * 0
    samples, gold_stats = out["samples"], out.get("gold")
    shape = sample_ids.shape
    view = (lambda x, like=shape: None if x is None else x.view(like))
    raw = gold_stats if gold is not None else samples
    raw_shape = shape if gold is None else gold.shape
    return ScoredRollout(
        token_logprobs=samples.logprobs.view(shape) + tie, entropy=samples.entropy.view(shape), kl=view(samples.kl),
        plain_logprobs=view(samples.plain_logprobs), divergence=view(samples.divergence),
        gold_logprobs=None if gold_stats is None else gold_stats.logprobs.view(gold.shape),
        raw_logprobs=view(raw.raw_logprobs, raw_shape), raw_logprob_sums=view(raw.raw_logprob_sums, raw_shape),
        vocab_size=out["vocab_size"])


def label_logprobs(forward, model, labels: torch.Tensor, rows: slice | None = None):
    """Returns `(output, logprobs, logprob_sums, vocab_size)`: the output of `forward()` (a teacher-forced pass whose
    `logits[:, t]` score `labels[:, t]`), the log-probs at temperature 1 of `labels` `(N', T)` (any value where -100)
    at its rows `rows` (all by default), and their `sum_v log p(v)` (label smoothing's term), no bans: the
    cross-entropy's terms, reduced chunk by chunk (`position_stats`) as the scoring pass does."""
    out = {}

    def reduce(positions: Positions, width: int):
        grid = torch.arange(len(positions), device=labels.device).view(-1, width)
        where = (grid if rows is None else grid[rows])[:, :labels.shape[1]].flatten()
        stats = position_stats(positions.take(where), labels.flatten(), raw=True)
        out["stats"], out["vocab_size"] = stats, positions.vocab_size
        return stats.raw_logprobs[:1].sum()

    with handing_hidden(model, lambda hidden, layer: reduce(
            Positions(hidden.reshape(-1, hidden.shape[-1]), layer), hidden.shape[-2])) as known:
        output = forward()
    tie = 0.0
    if not known:
        logits = output.logits
        reduce(Positions(logits=logits.reshape(-1, logits.shape[-1])), logits.shape[-2])
    elif output.logits.requires_grad:
        tie = output.logits.sum() * 0  # as in `score_targets`: the backward passes the output module's output
    stats = out["stats"]
    return (output, stats.raw_logprobs.view(labels.shape) + tie, stats.raw_logprob_sums.view(labels.shape),
            out["vocab_size"])


def target_positions(forward, model, sample_ids: torch.Tensor, num_samples: int, copy: bool) -> Positions:
    """Returns a frozen model's output-layer inputs at every position of `sample_ids` `(B*n, T)` (`B*n*T` of them,
    row-major): one teacher-forced pass (`forward(targets, group)`), for the KL of a later scoring pass; with `copy`,
    the output layer's tensors are copied (a sharded model frees its gathered weights after the forward)."""
    out = {}

    def receive(hidden, layer):
        out["positions"] = Positions(hidden.reshape(-1, hidden.shape[-1]).detach(), layer.frozen(copy))

    with handing_hidden(model, receive) as known:
        output = forward(sample_ids, num_samples)
    if not known:
        return Positions(logits=output.logits.reshape(-1, output.logits.shape[-1]).detach())
    return out["positions"]
