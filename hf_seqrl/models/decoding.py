"""The rollout decode of both families: one loop, what `generate(do_sample=True)` does for a rollout without what a
rollout does not need.

- A family reads its sources or prompts once (`DecodeSteps.first`: an encoder-decoder runs its encoder once per
  source, a long prompt's KV cache is computed once per source) and hands the loop the next-token logits of every
  row of every group; after that each step is one forward over the rows' last tokens (`DecodeSteps.next`).
- Tokens are chosen by `hf_seqrl.functional.sampling` (inverse CDF, one uniform per row per step, drawn at the start
  or derived from each row's key) instead of `torch.multinomial` (one exponential variate per vocabulary entry);
  greedy rows take the argmax.
- Only the processors a rollout config can ask for: temperature / top-k / top-p, forced BOS / EOS tokens, and the
  model's single-token bans (`bad_words_ids`, `suppress_tokens`, `begin_suppress_tokens`) as a logit mask, which the
  scoring pass applies too (`TokenBans`).
- The loop stops when every row has ended (EOS) or at the length limit. It reads the device once every
  `SYNC_EVERY` steps (one host sync; under `torch.distributed` one all-reduce in the same look), never per token:
  at small batch a GPU decode is bound by kernel launches, and each sync stops the host from queueing the next ones.
- Once at most half of the rows in the forward still run, the ended rows leave it (`compact_below`,
  `DecodeSteps.keep`); a row's tokens do not depend on which other rows share its forward.

Every step calls the model itself (its root module), never a submodule, so that FSDP2's root hooks gather the
root's parameters (shared embedding, LM head) before they are used. Under `torch.distributed` with more than one
process, every rank keeps stepping until all ranks are done, because sharded layers (FSDP2, ZeRO-3) all-gather their
weights inside each forward and every rank must join every gather; ranks agree at each look.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from ..functional.sampling import argmax_or_sample, rollout_uniforms
from ..types import Rollout
from .bans import TokenBans
from .base import DecodeSettings, eval_mode, unwrap
from .tokens import cut_at_limit, pad_after_eos
from .sharding import decoding_whole, whole_for_decode


class DecodeSteps:
    """The model calls of one decode, the part that differs between the families (`seq2seq.EncoderDecoderSteps`,
    `causal.CausalSteps`): `rows` rows on `device`, `group` per source, contiguous per source."""

    def __init__(self, sources: int, group: int, device: torch.device):
        self.rows, self.group, self.device = sources * group, group, device

    def first(self) -> torch.Tensor:
        """Returns the next-token logits `(N, V)` of every row after the sources or prompts (and any forced prefix)
        have been read."""
        raise NotImplementedError

    def next(self, tokens: torch.Tensor) -> torch.Tensor:
        """Returns the next-token logits `(A, V)` of the rows in the forward after each has read its token `tokens`
        `(A,)`."""
        raise NotImplementedError

    def keep(self, index: torch.Tensor) -> None:
        """Drops from every further forward the rows not at positions `index` `(A',)` of the rows in it."""
        raise NotImplementedError


def lockstep_group() -> bool:
    """Returns whether ranks must decode in lockstep: `torch.distributed` is initialized with world size > 1 and the
    model decodes sharded (its forwards gather weights: every rank must run as many)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 and not decoding_whole()


# Steps between two looks at the device: whether every row has ended, whether the ended rows leave the forward.
SYNC_EVERY = 4


class StepBans:
    """The bans of a decode as bool masks over the vocabulary, built once on the decode's device: `at(step)` is the
    mask of target position `step` (None when nothing is banned there), applied by `masked_fill` with no host→device
    copy per token."""

    def __init__(self, bans: TokenBans, vocab: int, device: torch.device):
        def mask(position):
            ids = bans.ids_at(position, vocab)
            if not ids:
                return None
            banned = torch.zeros(vocab, dtype=torch.bool, device=device)
            banned[ids] = True
            return banned

        self.everywhere, self.begin = mask(None), bans.begin
        self.at_begin = mask(bans.begin) if bans.begin_ids else self.everywhere

    def at(self, step: int) -> torch.Tensor | None:
        return self.at_begin if step == self.begin else self.everywhere


def choose_tokens(logits: torch.Tensor, step: int, settings: DecodeSettings, sample_rows: torch.Tensor | None,
                  uniforms: torch.Tensor, bans: StepBans | None = None) -> torch.Tensor:
    """Returns the next token of every row: a forced token where one is due, else the argmax on greedy rows and a
    sample elsewhere, both over the logits with the tokens `settings.bans` bans at `step` masked out. Nothing in it
    waits for the device.

    Args:
        logits (`torch.Tensor` of shape `(N, V)`): next-token logits of the rows being decoded.
        step (`int`): index of the token being chosen (0 = the first after the start token or prompt).
        sample_rows (`torch.LongTensor` of shape `(S,)`, or None when every row samples): the sample rows (the others
            take the argmax).
        uniforms (`torch.Tensor` of shape `(S,)`, `(N,)` when every row samples): this step's uniform of each sample
            row, in order.
        bans (`StepBans`, *optional*): the masks of `settings.bans` (built here when not given).
    """
    rows = logits.shape[0]
    forced = settings.forced_bos_id if step == 0 else None
    if step == settings.max_new_tokens - 1 and settings.forced_eos_id is not None:
        forced = settings.forced_eos_id  # `generate` applies the EOS processor after the BOS one
    if forced is not None:
        return torch.full((rows,), int(forced), dtype=torch.long, device=logits.device)
    banned = (bans or StepBans(settings.bans, logits.shape[-1], logits.device)).at(step)
    if banned is not None:
        logits = logits.masked_fill(banned, torch.finfo(logits.dtype).min)
    if not settings.do_sample:
        return logits.float().argmax(dim=-1)
    return argmax_or_sample(logits, sample_rows, uniforms, settings.temperature, settings.top_k, settings.top_p,
                            settings.epsilon_cutoff)


class RowsInForward:
    """Which of a decode's `N` rows are in the forward (`active`: their positions, None while all are) and which of
    those sample (`sample_rows`: positions among them, None when all do), kept on the device and recomputed only when
    rows leave the forward."""

    def __init__(self, sampled: torch.Tensor):
        self.sampled, self.active = sampled, None
        self.every_row_samples = bool(sampled.all())  # once per decode
        self.sample_rows = None if self.every_row_samples else sampled.nonzero().squeeze(1)

    def keep(self, index: torch.Tensor) -> None:
        """Drops from the forward the rows not at positions `index` of the rows in it."""
        self.active = index if self.active is None else self.active[index]
        if not self.every_row_samples:
            self.sample_rows = self.sampled[self.active].nonzero().squeeze(1)

    def sample_uniforms(self, step_uniforms: torch.Tensor) -> torch.Tensor:
        """Returns the uniforms `(N,)` of a step at the sample rows in the forward, in order."""
        rows = step_uniforms if self.active is None else step_uniforms.index_select(0, self.active)
        return rows if self.sample_rows is None else rows.index_select(0, self.sample_rows)


def longest_limit(max_new_tokens: int, device: torch.device) -> int:
    """Returns the largest `max_new_tokens` of any rank (an all-reduce of one number, once per decode)."""
    limit = torch.tensor([max_new_tokens], dtype=torch.float64, device=device)
    dist.all_reduce(limit, op=dist.ReduceOp.MAX)
    return int(limit.item())


def look(running: torch.Tensor, active: torch.Tensor | None, lockstep: bool) -> tuple[bool, int, int]:
    """Returns `(any row running on any rank, rows running in the forward, rows in the forward)`: one read of the
    device (and, with `lockstep`, one all-reduce folded into it)."""
    in_forward = running if active is None else running.index_select(0, active)
    anywhere = running.any().to(torch.float64).reshape(1)
    if lockstep:
        dist.all_reduce(anywhere, op=dist.ReduceOp.MAX)
    size = in_forward.numel()
    # Both numbers in one scalar, so that reading them is one host sync.
    code = int((anywhere[0] * (size + 1) + in_forward.sum()).item())
    return code > size, code % (size + 1), size


@torch.no_grad()
def decode_loop(steps: DecodeSteps, settings: DecodeSettings, greedy_first: bool, uniforms: torch.Tensor | None,
                compact_below: float = 0.5, sync_every: int | None = None) -> torch.Tensor:
    """Returns the tokens decoded for the rows of `steps` (`pad_id` after a row's EOS).

    The loop looks at the device once every `sync_every` steps (default `SYNC_EVERY`): whether every row has ended
    (on every rank, under `torch.distributed`: one all-reduce folded into that look, so ranks stop at the same step),
    and whether the ended rows leave the forward. Between looks, rows that ended keep writing pad; the columns after
    the last row's EOS are cut before returning, so the result does not depend on `sync_every`.

    Args:
        steps (`DecodeSteps`): the family's model calls, the model in the mode to decode in.
        greedy_first (`bool`): the first row of each group is greedy (the argmax at every step).
        uniforms (`torch.Tensor` of shape `(max_new_tokens, R)`, or None when `settings.do_sample` is false): one
            uniform in (0, 1] per step and sample row, the sample rows in order.
        compact_below (`float`): once the rows still running are at most this fraction of the rows in the forward,
            the ended rows leave it, so that a few long rows do not carry the whole batch; 0 turns this off.
        sync_every (`int`, *optional*): steps between two looks at the device (>= 1).

    Returns: `torch.LongTensor` of shape `(N, T)`, `1 <= T <= max_new_tokens`: up to the step at which the last
    row ended (T = 1 when `max_new_tokens` is 0: a single pad column).
    """
    sync_every = SYNC_EVERY if sync_every is None else int(sync_every)
    if sync_every < 1:
        raise ValueError(f"decode_loop: sync_every must be >= 1, got {sync_every}.")
    rows, device = steps.rows, steps.device
    logits = steps.first()
    bans = StepBans(settings.bans, logits.shape[-1], device)
    eos = torch.tensor(settings.eos_ids, dtype=torch.long, device=device)
    sampled = torch.ones(rows, dtype=torch.bool, device=device)
    if greedy_first:
        sampled = torch.arange(rows, device=device) % steps.group != 0
    forward = RowsInForward(sampled)
    # Each row's uniform per step (the sample rows' in order; greedy rows read none).
    row_uniforms = torch.ones((settings.max_new_tokens, rows), dtype=torch.float64, device=device)
    if uniforms is not None:
        sample_positions = torch.arange(rows, device=device) if forward.sample_rows is None else forward.sample_rows
        row_uniforms[:, sample_positions] = uniforms.to(device=device, dtype=torch.float64)
    lockstep = lockstep_group()
    # Under lockstep every rank steps until the longest limit of any rank (agreed once), so that all stop together.
    limit = settings.max_new_tokens if not lockstep else longest_limit(settings.max_new_tokens, device)
    running = torch.ones(rows, dtype=torch.bool, device=device)
    tokens: list[torch.Tensor] = []
    pads = torch.full((rows,), settings.pad_id, dtype=torch.long, device=device)
    for iteration in range(1, limit + 1):
        if len(tokens) < settings.max_new_tokens:
            step = len(tokens)
            chosen = choose_tokens(logits, step, settings, forward.sample_rows,
                                   forward.sample_uniforms(row_uniforms[step]), bans)
            last = chosen if forward.active is None else pads.clone().index_copy_(0, forward.active, chosen)
            last = last.masked_fill(running.logical_not(), settings.pad_id)
            tokens.append(last)
            if eos.numel():
                running &= torch.isin(last, eos, invert=True)
            if len(tokens) == settings.max_new_tokens:
                running = torch.zeros_like(running)  # this rank has written all it may
        else:  # past this rank's limit, another rank's rows still decode: forwards whose outputs go unused
            last = pads
        if iteration == limit:
            break
        if iteration % sync_every == 0:
            # A rank whose rows have all ended keeps calling the model (its outputs unused) while others still decode:
            # sharded layers (FSDP2, ZeRO-3) gather their weights inside each forward, and every rank joins every gather.
            anyone, kept, in_forward = look(running, forward.active, lockstep)
            if not anyone:
                break
            if 0 < kept <= compact_below * in_forward:
                running_in_forward = running if forward.active is None else running.index_select(0, forward.active)
                index = running_in_forward.nonzero().squeeze(1)
                steps.keep(index)
                forward.keep(index)
        logits = steps.next(last if forward.active is None else last.index_select(0, forward.active))
    if not tokens:
        return torch.full((rows, 1), settings.pad_id, dtype=torch.long, device=device)
    ids = torch.stack(tokens, dim=1)
    return ids[:, :written_width(ids, eos)] if eos.numel() else ids


def written_width(ids: torch.Tensor, eos: torch.Tensor) -> int:
    """Returns the columns of `ids` `(N, T)` up to the one where the last row ended (its first EOS; every column for
    a row without one): one read of the device, once per decode."""
    is_eos = torch.isin(ids, eos)
    ended_at = torch.where(is_eos.any(dim=1), is_eos.long().argmax(dim=1) + 1, ids.shape[1])
    return max(int(ended_at.max()), 1)


def decode_targets(steps: DecodeSteps, settings: DecodeSettings, greedy_first: bool, keys: torch.Tensor | None = None,
                   compact_below: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns `(ids (N, T), mask)` of `decode_loop`, pad after each row's EOS and the mask true up to and including
    it, its uniforms drawn here: one `torch.rand((max_new_tokens, sample rows))` on the global RNG of the rows'
    device, or with `keys` (one per sample row, `sampling.row_keys`) the `sampling.keyed_uniforms` of each row's key,
    so that its tokens do not depend on the other rows. A greedy config draws nothing."""
    samples = steps.rows - steps.rows // steps.group * int(greedy_first)
    uniforms = None
    if settings.do_sample:
        uniforms = rollout_uniforms(settings.max_new_tokens, samples, steps.device, keys)
    ids = decode_loop(steps, settings, greedy_first, uniforms, compact_below)
    return pad_after_eos(ids, list(settings.eos_ids), settings.pad_id)


def decode_rollout(model, steps: DecodeSteps, settings: DecodeSettings, with_greedy: bool,
                   keys: torch.Tensor | None = None, prefix_ids: torch.Tensor | None = None) -> Rollout:
    """Returns the `Rollout` of one decode of `model` in eval mode: the groups of rows of `steps`, each the greedy
    row first when `with_greedy`, then the sample rows.

    With `prefix_ids` `(B, P)` (which `steps` reads before the first step), every returned row holds the forced
    prefix then its continuation, the mask true on the prefix; `settings.max_new_tokens` counts the continuation,
    the bans count target positions from the prefix's start.
    """
    if prefix_ids is not None:
        settings = dataclasses.replace(settings, bans=settings.bans.after_prefix(prefix_ids.shape[1]))
    group = steps.group
    with eval_mode(model), whole_for_decode(unwrap(model)):
        ids, mask = decode_targets(steps, settings, with_greedy, keys)
    cut = cut_at_limit(ids, mask, list(settings.eos_ids), settings.max_new_tokens, settings.forced_eos_id)
    if prefix_ids is not None:
        prefix = prefix_ids.repeat_interleave(group, dim=0)
        ids = torch.cat([prefix, ids], dim=1)
        mask = torch.cat([torch.ones_like(prefix, dtype=torch.bool), mask], dim=1)
    if not with_greedy:
        return Rollout(ids, mask, None, None, group, cut)
    ids, mask, cut = ids.view(-1, group, ids.shape[-1]), mask.view(-1, group, mask.shape[-1]), cut.view(-1, group)
    return Rollout(ids[:, 1:].flatten(0, 1), mask[:, 1:].flatten(0, 1), ids[:, 0], mask[:, 0], group - 1,
                   cut[:, 1:].flatten(), cut[:, 0])  # the greedy row first
