"""A model's structural token ids (EOS, pad, decoder start) and the masks and padding of target rows: where a
decoded row ends, whether it was cut at its length limit, pad after its EOS, decoder inputs shifted from labels.

Rows are in target coordinates (`hf_seqrl.models.base`): `token_ids[:, t]` is the t-th token the model writes.
"""

from __future__ import annotations

import torch


def pad_columns(x: torch.Tensor, length: int, value: int, side: str) -> torch.Tensor:
    """Returns `x` `(N, T)` padded with `value` to `(N, length)` on the `"left"` or `"right"`."""
    if side not in ("left", "right"):
        raise ValueError(f"pad_columns: side={side!r} is not 'left' or 'right'.")
    if x.shape[1] >= length:
        return x
    width = length - x.shape[1]
    return torch.nn.functional.pad(x, (width, 0) if side == "left" else (0, width), value=value)


def eos_ids(model) -> list[int]:
    """Returns the EOS token ids of a model's generation config (a list, possibly empty)."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    if eos is None:
        return []
    return list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]


def completion_mask(token_ids: torch.Tensor, eos_token_ids: list[int]) -> torch.Tensor:
    """Returns a bool mask, true up to and including the first EOS of each row (all true if no EOS).

    Args:
        token_ids (`torch.LongTensor` of shape `(N, T)`): decoded tokens without the decoder start token.
    """
    if not eos_token_ids:
        return torch.ones_like(token_ids, dtype=torch.bool)
    is_eos = torch.isin(token_ids, torch.tensor(eos_token_ids, device=token_ids.device))
    eos_before = is_eos.long().cumsum(dim=-1) - is_eos.long()
    return eos_before == 0


def ended_with_eos(token_ids: torch.Tensor, mask: torch.Tensor, eos_token_ids: list[int]) -> torch.Tensor:
    """Returns a bool per row: whether its last counted token is an EOS (false when it hit the length limit).

    Args:
        token_ids (`torch.LongTensor` of shape `(N, T)`), mask (`torch.BoolTensor` of shape `(N, T)`).
    """
    if not eos_token_ids:
        return torch.zeros(token_ids.shape[0], dtype=torch.bool, device=token_ids.device)
    last = (mask.long().sum(dim=1) - 1).clamp(min=0)
    last_tokens = token_ids.gather(1, last.unsqueeze(1)).squeeze(1)
    return torch.isin(last_tokens, torch.tensor(eos_token_ids, device=token_ids.device))


def cut_at_limit(token_ids: torch.Tensor, mask: torch.Tensor, eos_token_ids: list[int], limit: int | torch.Tensor,
                 forced_eos_id: int | None = None) -> torch.Tensor:
    """Returns a bool per row: true where the row was cut at its length limit, false where the model chose EOS before
    it. A row is cut when none of its counted tokens is an EOS, or when the model forces EOS at the limit
    (`forced_eos_id`, as BART's and some Marian configs do) and the row's EOS is that forced last token: its
    `limit`-th. The one definition of a cut sample: `rl/frac_truncated`, `mask_truncated_completions`, the sample
    logs and the MRT candidates read it.

    Args:
        token_ids (`torch.LongTensor` of shape `(N, T)`), mask (`torch.BoolTensor` of shape `(N, T)`): decoded rows,
            the mask true up to and including each row's EOS.
        limit (`int` or `torch.LongTensor` of shape `(N,)`): the tokens each row could write, EOS included.
        forced_eos_id (`int`, *optional*): the EOS token the decode forces as the `limit`-th token.
    """
    ended = ended_with_eos(token_ids, mask, eos_token_ids)
    if forced_eos_id is not None:
        limit = torch.as_tensor(limit, device=token_ids.device)
        ended = ended & (mask.long().sum(dim=1) < limit)
    return ~ended


def pad_after_eos(token_ids: torch.Tensor, eos_token_ids: list[int], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns `(ids, mask)`: `token_ids` `(N, T)` with `pad` after each row's first EOS, and their
    `completion_mask`."""
    mask = completion_mask(token_ids, eos_token_ids)
    return token_ids.masked_fill(~mask, pad), mask


def generated_targets(sequences: torch.Tensor, offset: int, model) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns `(ids (N, max(T, 1)), mask)` of `generate` output `(N, offset + T)` in target coordinates: the
    `offset` columns before the first generated token (the decoder start token, or the left-padded prompt) dropped,
    pad after each row's first EOS."""
    ids = sequences[:, offset:]
    if ids.shape[1] == 0:
        ids = sequences.new_full((sequences.shape[0], 1), pad_id(model))
    return pad_after_eos(ids, eos_ids(model), pad_id(model))


def decoder_start_id(model) -> int:
    """Returns the decoder start token id of an encoder-decoder model, or raises a clear error."""
    start = model.generation_config.decoder_start_token_id
    if start is None:
        start = getattr(model.config, "decoder_start_token_id", None)
    if isinstance(start, (list, tuple)):
        start = start[0]
    if start is None:
        raise ValueError(
            "The model has no decoder_start_token_id: set model.config.decoder_start_token_id and "
            "model.generation_config.decoder_start_token_id (e.g. to the tokenizer's CLS/BOS id)."
        )
    return int(start)


def pad_id(model) -> int:
    """Returns the model's pad token id, or raises a clear error."""
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = model.config.pad_token_id
    if pad is None:
        raise ValueError("The model has no pad_token_id: set model.config.pad_token_id and generation_config's.")
    return int(pad)


def shift_right(labels: torch.Tensor, start_id: int, pad: int) -> torch.Tensor:
    """Returns decoder inputs for `labels`: the start token, then labels[:-1], with -100 replaced by pad.

    Args:
        labels (`torch.LongTensor` of shape `(N, T)`).
    """
    shifted = labels.new_full(labels.shape, pad)
    shifted[:, 0] = start_id
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == -100, pad)


def right_pad(x: torch.Tensor, length: int, value: int) -> torch.Tensor:
    """Returns `x` `(N, T)` padded on the right with `value` to `(N, length)` (unchanged when `T >= length`)."""
    return pad_columns(x, length, value, "right")
