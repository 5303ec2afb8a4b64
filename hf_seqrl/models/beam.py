"""Beam-search candidates and length limits relative to the source (minimum risk training over the n-best list).

The beam runs through `generate` with the model's own generation config (its length penalty, banned tokens, forced
tokens): the candidates are the hypotheses the model's beam search returns. A length limit relative to the source,
`int(max_len_a * source_tokens + max_len_b)` tokens with EOS (fairseq's and Nematus' form), caps the beam through a
logits processor that forces EOS at each source's limit, and caps decoded samples afterwards (ending a sample with
EOS at its limit is what forcing EOS there while sampling gives: the tokens before it are drawn alike).
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from .tokens import eos_ids
from .decoding import lockstep_group


def length_limits(source_lengths: torch.Tensor, max_len_a: float, max_len_b: int) -> torch.LongTensor:
    """Returns each source's candidate length limit `int(max_len_a * source_length + max_len_b)`, at least 1.

    Args:
        source_lengths (`torch.Tensor` of shape `(B,)`): tokens of each source (or prompt).
    """
    return (max_len_a * source_lengths.double() + max_len_b).floor().long().clamp(min=1)


def cap_lengths(ids: torch.Tensor, mask: torch.Tensor, limits: torch.Tensor, eos_id: int,
                pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns `(ids, mask)` with every row cut to its limit: a row of more than `limits[r]` counted tokens keeps its
    first `limits[r] - 1` and ends with EOS; shorter rows are unchanged.

    Args:
        ids (`torch.LongTensor` of shape `(N, T)`), mask (`torch.BoolTensor` of shape `(N, T)`): decoded rows, the
            mask true up to and including each row's EOS.
        limits (`torch.LongTensor` of shape `(N,)`): tokens allowed per row, EOS included, `>= 1`.
    """
    limits = limits.to(ids.device)
    over = mask.sum(dim=1) > limits
    positions = torch.arange(ids.shape[1], device=ids.device)
    mask = mask & (positions.unsqueeze(0) < limits.unsqueeze(1))
    ids = ids.masked_fill(~mask, pad_id)
    if over.any():
        rows = over.nonzero().squeeze(1)
        ids[rows, limits[rows] - 1] = eos_id
    return ids, mask


class EOSAtLengthLimit(LogitsProcessor):
    """Forces EOS as the `limits[b]`-th token of every row of source `b` (beam and return rows included).

    Args:
        limits (`torch.LongTensor` of shape `(B,)`): tokens allowed per source, EOS included.
        eos_id (`int`): the EOS token.
        rows_per_source (`int`): rows of each source in `generate`'s batch (the beam width).
        offset (`int`): tokens in `generate`'s `input_ids` before the first generated one (the decoder start token,
            or the left-padded prompt).
    """

    def __init__(self, limits: torch.Tensor, eos_id: int, rows_per_source: int, offset: int):
        self.limits = limits.repeat_interleave(rows_per_source)
        self.eos_id, self.offset = eos_id, offset

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        written = input_ids.shape[1] - self.offset  # the token chosen now is number `written` (from 0)
        force = self.limits.to(scores.device) - 1 <= written
        if force.any():
            forced = torch.full_like(scores[force], float("-inf"))
            forced[:, self.eos_id] = 0.0
            scores = scores.clone()
            scores[force] = forced
        return scores


def beam_kwargs(model, num_beams: int, num_return: int, max_new_tokens: int, limits: torch.Tensor | None,
                offset: int) -> dict:
    """Returns the `generate` arguments of a beam search of width `num_beams` returning the `num_return` best
    hypotheses per source (the model's own generation config otherwise), capped at `limits` `(B,)` when given."""
    kwargs = dict(num_beams=num_beams, num_return_sequences=num_return, do_sample=False, max_new_tokens=max_new_tokens,
                  synced_gpus=lockstep_group())
    if limits is not None:
        eos = eos_ids(model)
        if not eos:
            raise ValueError("A candidate length limit (max_len_b) needs the model's eos_token_id to end candidates.")
        kwargs["logits_processor"] = LogitsProcessorList([EOSAtLengthLimit(limits, eos[0], num_beams, offset)])
        kwargs["max_new_tokens"] = min(max_new_tokens, int(limits.max()))
    return kwargs
