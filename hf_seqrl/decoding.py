"""The rollout decode: greedy rows and samples of an encoder-decoder model, one root-module forward per step.

What `generate(do_sample=True)` does for a rollout, without what a rollout does not need:

- The first step is one forward of the whole model on the `B` sources with the decoder start token: the encoder
  runs once per source and the cross-attention keys/values are computed once per source; the KV cache
  (`EncoderDecoderCache`) is then repeated to the `B * group` rows, whose first-step logits are the same.
- Tokens are chosen by `hf_seqrl.sampling` (inverse CDF, one uniform per row per step) instead of
  `torch.multinomial` (one exponential variate per vocabulary entry); greedy rows take the argmax.
- Only the processors a rollout config can ask for: temperature / top-k / top-p, and forced BOS / EOS tokens.
- The loop stops when every row has ended (EOS) or at the length limit.
- Once at most half of the rows in the forward still run, the ended rows leave it (`compact_below`).

Every step calls the model itself (its root module), never a submodule, so that FSDP2's root hooks gather the
root's parameters (shared embedding, LM head) before the encoder and the decoder use them. Under
`torch.distributed` with more than one process, every rank keeps stepping until all ranks are done, because
sharded layers all-gather their weights inside each forward and every rank must join every gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from transformers import GenerationConfig
from transformers.modeling_outputs import BaseModelOutput

from .sampling import argmax_or_sample

# Generation settings that add logits processors the decode loop does not implement, with their neutral values.
UNSUPPORTED = {"num_beams": 1, "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0,
               "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": 0,
               "bad_words_ids": None, "suppress_tokens": None, "begin_suppress_tokens": None, "sequence_bias": None,
               "min_p": None, "top_h": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
               "guidance_scale": 1.0, "exponential_decay_length_penalty": None, "watermarking_config": None}


@dataclass(frozen=True)
class DecodeSettings:
    """What the decode loop reads from a `GenerationConfig` (see `DecodeSettings.from_generation_config`)."""

    start_id: int
    pad_id: int
    eos_ids: tuple[int, ...]
    max_new_tokens: int
    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    forced_bos_id: int | None = None
    forced_eos_id: int | None = None

    @classmethod
    def from_generation_config(cls, config: GenerationConfig) -> "DecodeSettings":
        """Returns the settings of `config` (from `rollout_generation_config`); raises on settings that would add
        logits processors the loop does not implement."""
        for name, neutral in UNSUPPORTED.items():
            value = getattr(config, name, None)
            if value is not None and value != neutral:
                raise ValueError(
                    f"The rollout decode does not implement generation_config.{name}={value!r} (samples must come "
                    "from the model's own distribution): build the config with rollout_generation_config().")
        eos = config.eos_token_id
        eos = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
        forced_eos = config.forced_eos_token_id
        if isinstance(forced_eos, (list, tuple)):
            if len(forced_eos) != 1:
                raise ValueError("The rollout decode forces one EOS token: set forced_eos_token_id to one id.")
            forced_eos = forced_eos[0]
        if config.max_new_tokens is not None:
            max_new = config.max_new_tokens
        else:  # `generate` counts the decoder start token in max_length
            max_new = (config.max_length if config.max_length is not None else 20) - 1
        return cls(start_id=int(config.decoder_start_token_id), pad_id=int(config.pad_token_id), eos_ids=eos,
                   max_new_tokens=max(int(max_new), 0), do_sample=bool(config.do_sample),
                   temperature=1.0 if config.temperature is None else float(config.temperature),
                   top_k=int(config.top_k or 0), top_p=1.0 if config.top_p is None else float(config.top_p),
                   forced_bos_id=config.forced_bos_token_id, forced_eos_id=forced_eos)


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
    sample elsewhere.

    Args:
        logits (`torch.Tensor` of shape `(N, V)`): next-token logits of the rows being decoded.
        step (`int`): index of the token being chosen (0 = the first after the start token).
        sampled (`torch.BoolTensor` of shape `(N,)`): the sample rows (the others take the argmax).
        uniforms (`torch.Tensor` of shape `(sampled.sum(),)`): this step's uniform of each sample row, in order.
    """
    rows = logits.shape[0]
    forced = settings.forced_bos_id if step == 0 else None
    if step == settings.max_new_tokens - 1 and settings.forced_eos_id is not None:
        forced = settings.forced_eos_id  # `generate` applies the EOS processor after the BOS one
    if forced is not None:
        return torch.full((rows,), int(forced), dtype=torch.long, device=logits.device)
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
def decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, settings: DecodeSettings, group: int,
           greedy_first: bool, uniforms: torch.Tensor, prefix_ids: torch.Tensor | None = None,
           compact_below: float = 0.5) -> torch.Tensor:
    """Returns the decoded tokens of `group` rows per source (start token excluded, `pad_id` after a row's EOS).

    Args:
        model: an encoder-decoder `PreTrainedModel` (possibly sharded with FSDP2), in the mode to decode in.
        input_ids (`torch.LongTensor` of shape `(B, S)`), attention_mask (`(B, S)`): the sources.
        group (`int`): rows per source; with `greedy_first`, the first row of each group is greedy.
        uniforms (`torch.Tensor` of shape `(max_new_tokens, B*n)`): one uniform in (0, 1] per step and sample row
            (`n = group - greedy_first`).
        prefix_ids (`torch.LongTensor` of shape `(B, P)`, *optional*): tokens forced after the start token (read in
            the first forward); the returned tokens are the continuation only.
        compact_below (`float`): once the rows still running are at most this fraction of the rows in the forward,
            the ended rows leave it (their cache, encoder states and mask rows are dropped), so that a few long
            rows do not carry the whole batch; 0 turns this off. A row's tokens do not depend on which other rows
            share its forward.

    Returns: `torch.LongTensor` of shape `(B*group, T)`, `1 <= T <= max_new_tokens` (T = 1 when
    `max_new_tokens` is 0: a single pad column).
    """
    batch = input_ids.shape[0]
    rows = batch * group
    device = input_ids.device
    eos = torch.tensor(settings.eos_ids, dtype=torch.long, device=device)
    lockstep = lockstep_group()
    start = input_ids.new_full((batch, 1), settings.start_id)
    if prefix_ids is not None:
        start = torch.cat([start, prefix_ids], dim=1)
    out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=start, use_cache=True,
                return_dict=True)
    cache = out.cache
    cache.batch_repeat_interleave(group)
    encoder_states = out.encoder_last_hidden_state.repeat_interleave(group, dim=0)
    attention_mask = attention_mask.repeat_interleave(group, dim=0)
    logits = out.logits[:, -1].repeat_interleave(group, dim=0)
    del out
    sampled = torch.ones(rows, dtype=torch.bool, device=device)
    if greedy_first:
        sampled = torch.arange(rows, device=device) % group != 0
    # Each row's uniform per step (the sample rows' in order; greedy rows read none).
    row_uniforms = torch.ones((uniforms.shape[0], rows), dtype=uniforms.dtype, device=device)
    row_uniforms[:, sampled] = uniforms
    active = torch.arange(rows, device=device)  # the rows in the forward
    tokens: list[torch.Tensor] = []
    running = torch.ones(rows, dtype=torch.bool, device=device)
    last = input_ids.new_full((rows,), settings.pad_id)
    done = settings.max_new_tokens == 0
    while True:
        if not done:
            on = sampled[active]
            chosen = choose_tokens(logits, len(tokens), settings, on, row_uniforms[len(tokens), active][on])
            last = input_ids.new_full((rows,), settings.pad_id).index_copy_(0, active, chosen)
            last.masked_fill_(~running, settings.pad_id)
            tokens.append(last)
            if eos.numel():
                running &= ~torch.isin(last, eos)
            done = len(tokens) == settings.max_new_tokens or not bool(running.any())
        # A rank whose rows have all ended keeps calling the model (its outputs unused) while others still decode.
        if not (any_rank_running(not done, device) if lockstep else not done):
            break
        keep = None if done else rows_to_keep(running[active], compact_below)
        if keep is not None:
            cache.batch_select_indices(keep)
            encoder_states, attention_mask, active = encoder_states[keep], attention_mask[keep], active[keep]
        out = model(encoder_outputs=BaseModelOutput(last_hidden_state=encoder_states), attention_mask=attention_mask,
                    decoder_input_ids=last[active, None], cache=cache, use_cache=True, return_dict=True)
        cache, logits = out.cache, out.logits[:, -1]
        del out
    if not tokens:
        return input_ids.new_full((rows, 1), settings.pad_id)
    return torch.stack(tokens, dim=1)
