"""What the decoder is fed: pure tensor functions behind the input-schedule trainers. Imports torch only.

Layout: `labels` of shape `(B, T)` hold the gold targets (-100 at padding); the teacher-forced decoder input at
position `t` is the start token for `t = 0` and `labels[t - 1]` after it, and position `t` is trained to predict
`labels[t]`. So "replacing the input at `t`" means feeding something else in place of the target `t - 1`, and the
model's own token for position `t` is its prediction at position `t - 1`.

Scheduled sampling, prefix corruption, noise-level forcing and k-step rollout differ only in which inputs they
replace and by what; the loss is always the cross-entropy of the gold targets.
"""

from __future__ import annotations

import torch


def replaceable_positions(labels: torch.Tensor) -> torch.Tensor:
    """Returns a bool mask of the decoder inputs that may be replaced: true at `t >= 1` where `labels[t-1]` is real.

    The start token (position 0) and inputs that stand for padding are never replaced.

    Args:
        labels (`torch.LongTensor` of shape `(B, T)`): gold targets, -100 at padding.
    """
    replaceable = torch.zeros_like(labels, dtype=torch.bool)
    replaceable[:, 1:] = labels[:, :-1] != -100
    return replaceable


def feed_back(decoder_inputs: torch.Tensor, predicted_tokens: torch.Tensor, feed: torch.Tensor) -> torch.Tensor:
    """Returns `decoder_inputs` with the input at each position `t` where `feed` is true set to `predicted_tokens[t-1]`.

    Args:
        decoder_inputs (`torch.LongTensor` of shape `(N, T)`): current decoder inputs.
        predicted_tokens (`torch.LongTensor` of shape `(N, T')`, `T' <= T`): the model's token at each position
            of a pass over `decoder_inputs[:, :T']`.
        feed (`torch.BoolTensor` of shape `(N, T)`): where to feed the model's token; false at position 0 and at
            every `t > T'`.
    """
    shifted = decoder_inputs.clone()
    length = predicted_tokens.shape[1]
    shifted[:, 1: length + 1] = predicted_tokens[:, : decoder_inputs.shape[1] - 1]
    return torch.where(feed, shifted, decoder_inputs)


def corruption_mask(
    labels: torch.Tensor,
    rate: float,
    per_token_levels: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Returns a bool mask `(B, T)` of the replaceable decoder inputs drawn for replacement.

    With `per_token_levels=False` every replaceable input is drawn with probability `rate`. With
    `per_token_levels=True` (noise-level forcing) every position first draws its own level σ_t ~ U(0, rate),
    independently per sequence and position, and is then drawn with probability σ_t: marginally each input is
    replaced with probability E[σ_t] = rate / 2, independently of the others.

    Args:
        labels (`torch.LongTensor` of shape `(B, T)`): gold targets, -100 at padding.
        rate (`float`): the probability in [0, 1], or the upper end of the levels' range.
        generator (`torch.Generator`, *optional*): source of the draws; `None` uses the global RNG.
    """
    draws = torch.rand(labels.shape, generator=generator, device=labels.device)
    threshold = torch.full(labels.shape, float(rate), device=labels.device)
    if per_token_levels:
        threshold = torch.rand(labels.shape, generator=generator, device=labels.device) * rate
    return replaceable_positions(labels) & (draws < threshold)


def replacement_vocabulary(vocab_size: int, special_ids: list[int] | set[int]) -> torch.Tensor:
    """Returns the token ids a random replacement is drawn from: `0 .. vocab_size-1` minus `special_ids`.

    Args:
        vocab_size (`int`): number of token ids the model embeds and the tokenizer knows.
        special_ids: pad, EOS, the decoder start token and the tokenizer's special tokens.
    """
    keep = torch.ones(vocab_size, dtype=torch.bool)
    specials = [i for i in special_ids if i is not None and 0 <= i < vocab_size]
    keep[specials] = False
    if not keep.any():
        raise ValueError(f"Every one of the {vocab_size} token ids is a special token: nothing to draw from.")
    return keep.nonzero().squeeze(1)


def random_tokens(shape: torch.Size | tuple[int, ...], vocabulary: torch.Tensor,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Returns token ids of `shape` drawn uniformly from `vocabulary` (on its device).

    Args:
        vocabulary (`torch.LongTensor` of shape `(V',)`): from `replacement_vocabulary`.
    """
    index = torch.randint(len(vocabulary), tuple(shape), generator=generator, device=vocabulary.device)
    return vocabulary[index]


# ---- k-step rollout ------------------------------------------------------------------------------------------

def anchor_labels(labels: torch.Tensor, rollout_steps: int) -> torch.Tensor:
    """Returns `labels` kept at the anchor positions `t = 0, k, 2k, ...` and -100 elsewhere.

    Anchors are predicted from the gold prefix, so their loss is taken on the gold (teacher-forced) row.

    Args:
        labels (`torch.LongTensor` of shape `(B, T)`), rollout_steps (`int`): k.
    """
    positions = torch.arange(labels.shape[1], device=labels.device)
    return labels.masked_fill((positions % rollout_steps != 0).unsqueeze(0), -100)


def rollout_rows(labels: torch.Tensor, rollout_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns `(row_source, row_anchor)`, both `(R,)`: one decoder row per anchor whose chunk has a real target.

    The chunk of anchor `a` is positions `a+1 .. a+k-1`: they are predicted after 1 .. k-1 of the model's own
    tokens. Anchors whose chunk holds only padding need no row. Rows are ordered by source, then anchor.

    Args:
        labels (`torch.LongTensor` of shape `(B, T)`), rollout_steps (`int`): k >= 2.
    """
    batch, length = labels.shape
    anchors = torch.arange(0, length, rollout_steps, device=labels.device)  # (A,)
    offsets = torch.arange(1, rollout_steps, device=labels.device)  # (k-1,)
    positions = anchors.unsqueeze(1) + offsets.unsqueeze(0)  # (A, k-1)
    inside = positions < length
    real = labels[:, positions.clamp(max=length - 1)] != -100  # (B, A, k-1)
    keep = (real & inside.unsqueeze(0)).any(dim=2)  # (B, A)
    row_source, anchor_index = keep.nonzero(as_tuple=True)
    return row_source, anchors[anchor_index]


def offset_positions(row_anchor: torch.Tensor, offset: int, length: int) -> torch.Tensor:
    """Returns a bool mask `(R, length)`, true at position `row_anchor[r] + offset` of each row r (if inside).

    Args:
        row_anchor (`torch.LongTensor` of shape `(R,)`): the anchor of each row.
    """
    positions = torch.arange(length, device=row_anchor.device)
    return positions.unsqueeze(0) == (row_anchor + offset).unsqueeze(1)


def chunk_labels(labels: torch.Tensor, row_source: torch.Tensor, row_anchor: torch.Tensor,
                 rollout_steps: int) -> torch.Tensor:
    """Returns the labels each rollout row trains: its source's labels at `a+1 .. a+k-1`, -100 elsewhere.

    Args:
        labels (`torch.LongTensor` of shape `(B, T)`), row_source, row_anchor (`torch.LongTensor` of shape `(R,)`).
    """
    positions = torch.arange(labels.shape[1], device=labels.device).unsqueeze(0)
    offset = positions - row_anchor.unsqueeze(1)
    in_chunk = (offset >= 1) & (offset < rollout_steps)
    return labels[row_source].masked_fill(~in_chunk, -100)


def chunk_offset_positions(labels: torch.Tensor, rollout_steps: int, offset: int) -> torch.Tensor:
    """Returns a bool mask `(B, T)` of the replaceable inputs at `offset` in every chunk: `t % k == offset`.

    Used by the shared-row variant, where one row per source carries every chunk.

    Args:
        labels (`torch.LongTensor` of shape `(B, T)`), rollout_steps (`int`): k, offset (`int`): 1 .. k-1.
    """
    positions = torch.arange(labels.shape[1], device=labels.device)
    return replaceable_positions(labels) & (positions % rollout_steps == offset).unsqueeze(0)
