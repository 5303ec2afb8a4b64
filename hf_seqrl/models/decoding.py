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
- The loop stops when every row has ended (EOS) or at the length limit.
- Once at most half of the rows in the forward still run, the ended rows leave it (`compact_below`,
  `DecodeSteps.keep`); a row's tokens do not depend on which other rows share its forward.

Every step calls the model itself (its root module), never a submodule, so that FSDP2's root hooks gather the
root's parameters (shared embedding, LM head) before they are used. Under `torch.distributed` with more than one
process, every rank keeps stepping until all ranks are done, because sharded layers (FSDP2, ZeRO-3) all-gather their
weights inside each forward and every rank must join every gather.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from ..functional.sampling import argmax_or_sample, rollout_uniforms
from ..types import Rollout
from .bans import ban_logits
from .base import DecodeSettings, cut_at_limit, eval_mode, pad_after_eos


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
    """Returns whether ranks must decode in lockstep: `torch.distributed` is initialized with world size > 1."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def any_rank_running(running: bool, device: torch.device) -> bool:
    """Returns whether `running` is true on any rank (an all-reduce of one number)."""
    flag = torch.tensor([float(running)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def choose_tokens(logits: torch.Tensor, step: int, settings: DecodeSettings, sampled: torch.Tensor,
                  uniforms: torch.Tensor) -> torch.Tensor:
    """Returns the next token of every row: a forced token where one is due, else the argmax on greedy rows and a
    sample elsewhere, both over the logits with the tokens `settings.bans` bans at `step` masked out.

    Args:
        logits (`torch.Tensor` of shape `(N, V)`): next-token logits of the rows being decoded.
        step (`int`): index of the token being chosen (0 = the first after the start token or prompt).
        sampled (`torch.BoolTensor` of shape `(N,)`): the sample rows (the others take the argmax).
        uniforms (`torch.Tensor` of shape `(sampled.sum(),)`): this step's uniform of each sample row, in order.
    """
    rows = logits.shape[0]
    forced = settings.forced_bos_id if step == 0 else None
    if step == settings.max_new_tokens - 1 and settings.forced_eos_id is not None:
        forced = settings.forced_eos_id  # `generate` applies the EOS processor after the BOS one
    if forced is not None:
        return torch.full((rows,), int(forced), dtype=torch.long, device=logits.device)
    logits = ban_logits(logits, settings.bans.ids_at(step, logits.shape[-1]))
    if not settings.do_sample:
        return logits.float().argmax(dim=-1)
    return argmax_or_sample(logits, sampled, uniforms, settings.temperature, settings.top_k, settings.top_p)


def rows_to_keep(running: torch.Tensor, compact_below: float) -> torch.Tensor | None:
    """Returns the positions of the running rows among the rows being decoded when they are at most
    `compact_below` of them (and at least one), else None: the decode then drops the ended rows from every
    further forward (their KV cache, encoder states and mask rows)."""
    kept = int(running.sum())
    if kept == 0 or kept > compact_below * running.numel():
        return None
    return running.nonzero().squeeze(1)


@torch.no_grad()
def decode_loop(steps: DecodeSteps, settings: DecodeSettings, greedy_first: bool, uniforms: torch.Tensor | None,
                compact_below: float = 0.5) -> torch.Tensor:
    """Returns the tokens decoded for the rows of `steps` (`pad_id` after a row's EOS).

    Args:
        steps (`DecodeSteps`): the family's model calls, the model in the mode to decode in.
        greedy_first (`bool`): the first row of each group is greedy (the argmax at every step).
        uniforms (`torch.Tensor` of shape `(max_new_tokens, R)`, or None when `settings.do_sample` is false): one
            uniform in (0, 1] per step and sample row, the sample rows in order.
        compact_below (`float`): once the rows still running are at most this fraction of the rows in the forward,
            the ended rows leave it, so that a few long rows do not carry the whole batch; 0 turns this off.

    Returns: `torch.LongTensor` of shape `(N, T)`, `1 <= T <= max_new_tokens`: up to the step at which the last
    row ended (T = 1 when `max_new_tokens` is 0: a single pad column).
    """
    rows, device = steps.rows, steps.device
    logits = steps.first()
    eos = torch.tensor(settings.eos_ids, dtype=torch.long, device=device)
    sampled = torch.ones(rows, dtype=torch.bool, device=device)
    if greedy_first:
        sampled = torch.arange(rows, device=device) % steps.group != 0
    # Each row's uniform per step (the sample rows' in order; greedy rows read none).
    row_uniforms = torch.ones((settings.max_new_tokens, rows), dtype=torch.float64, device=device)
    if uniforms is not None:
        row_uniforms[:, sampled] = uniforms.to(device=device, dtype=torch.float64)
    lockstep = lockstep_group()
    active = None  # the positions of the rows in the forward; None while every row is (no gathers needed)
    running = torch.ones(rows, dtype=torch.bool, device=device)
    tokens: list[torch.Tensor] = []
    done = settings.max_new_tokens == 0
    while True:
        if not done:
            step = len(tokens)
            on, step_uniforms = (sampled, row_uniforms[step]) if active is None else (
                sampled[active], row_uniforms[step, active])
            chosen = choose_tokens(logits, step, settings, on, step_uniforms[on])
            last = chosen if active is None else torch.full((rows,), settings.pad_id, dtype=torch.long,
                                                            device=device).index_copy_(0, active, chosen)
            last.masked_fill_(running.logical_not(), settings.pad_id)
            tokens.append(last)
            if eos.numel():
                running &= torch.isin(last, eos, invert=True)
            done = len(tokens) == settings.max_new_tokens or not bool(running.any())
        # A rank whose rows have all ended keeps calling the model (its outputs unused) while others still decode.
        if not (any_rank_running(not done, device) if lockstep else not done):
            break
        keep = None if done else rows_to_keep(running if active is None else running[active], compact_below)
        if keep is not None:
            steps.keep(keep)
            active = keep if active is None else active[keep]
        logits = steps.next(last if active is None else last[active])
    if not tokens:
        return torch.full((rows, 1), settings.pad_id, dtype=torch.long, device=device)
    return torch.stack(tokens, dim=1)


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
    with eval_mode(model):
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
