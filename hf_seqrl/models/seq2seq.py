"""Encoder-decoder models: the rollout decode, its samples and greedy rows, the scoring pass, and `Seq2SeqFamily`.

Rollouts: sampled sequences and the greedy baseline (no grad), then their token log-probs (with grad).

One decode (`hf_seqrl.decoding`) yields the `n` samples and, for SCST, the greedy baseline row of every source:
the encoder runs once per source, greedy rows take the argmax, sample rows draw by inverse CDF
(`hf_seqrl.sampling`) from the distribution `generate(do_sample=True)` would sample from.
The log-prob pass is one teacher-forced forward through the (possibly DDP-wrapped) model: the encoder
runs once per source and its states are expanded to the decoder rows by a forward pre-hook, so
gradients flow back through the expansion.

The decode loop, what `generate(do_sample=True)` does for a rollout without what a rollout does not need:


- The first step is one forward of the whole model on the `B` sources with the decoder start token: the encoder
  runs once per source and the cross-attention keys/values are computed once per source; the KV cache
  (`EncoderDecoderCache`) is then repeated to the `B * group` rows, whose first-step logits are the same.
- Tokens are chosen by `hf_seqrl.sampling` (inverse CDF, one uniform per row per step) instead of
  `torch.multinomial` (one exponential variate per vocabulary entry); greedy rows take the argmax.
- Only the processors a rollout config can ask for: temperature / top-k / top-p, forced BOS / EOS tokens, and the
  model's single-token bans (`bad_words_ids`, `suppress_tokens`, `begin_suppress_tokens`) as a logit mask, which the
  scoring pass applies too (`TokenBans`).
- The loop stops when every row has ended (EOS) or at the length limit.
- Once at most half of the rows in the forward still run, the ended rows leave it (`compact_below`).

Every step calls the model itself (its root module), never a submodule, so that FSDP2's root hooks gather the
root's parameters (shared embedding, LM head) before the encoder and the decoder use them. Under
`torch.distributed` with more than one process, every rank keeps stepping until all ranks are done, because
sharded layers all-gather their weights inside each forward and every rank must join every gather.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from transformers import GenerationConfig
from transformers.modeling_outputs import BaseModelOutput

from ..functional.logprobs import group_logprobs
from ..functional.sampling import rollout_uniforms
from .bans import TokenBans, token_ban_settings
from .beam import beam_kwargs
from ..types import Rollout, ScoredRollout
from .base import (DecodeSettings, ModelFamily, any_rank_running, choose_tokens, completion_mask, decoder_start_id,
                   eos_ids, eval_mode, lockstep_group, pad_id, right_pad, rows_to_keep, shift_right, split_groups,
                   unwrap)


def rollout_generation_config(
    model,
    max_new_tokens: int | None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    max_length: int | None = None,
) -> GenerationConfig:
    """Returns a generation config that samples from the model's own distribution.

    Only structural tokens (start, EOS, pad, forced BOS/EOS) and the single-token bans (`bad_words_ids`,
    `suppress_tokens`, `begin_suppress_tokens`: a logit mask that the scoring pass applies too) are kept from the
    model's generation config; beam search, repetition penalties, n-gram blocking and minimum lengths are dropped:
    the log-probs of the policy gradient must be those of the distribution the samples were drawn from. A
    multi-token `bad_words_ids` entry raises a ValueError (no fixed mask can ban it). Decoding always uses the
    KV cache: `Trainer` sets `model.config.use_cache = False` (`TrainingArguments.use_cache` defaults to
    `False`), and a model built from that config, or loaded from a checkpoint without `generation_config.json`,
    would otherwise inherit `use_cache=False` and re-run the decoder over the whole prefix at every step.
    """
    base = model.generation_config
    kwargs = dict(
        do_sample=True,
        num_beams=1,
        use_cache=True,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        decoder_start_token_id=decoder_start_id(model),
        eos_token_id=base.eos_token_id if base.eos_token_id is not None else model.config.eos_token_id,
        pad_token_id=pad_id(model),
        bos_token_id=base.bos_token_id,
        forced_bos_token_id=base.forced_bos_token_id,
        forced_eos_token_id=base.forced_eos_token_id,
        **token_ban_settings(base),
    )
    if max_new_tokens is not None:
        kwargs["max_new_tokens"] = max_new_tokens
    elif max_length is not None:
        kwargs["max_length"] = max_length
    elif base.max_new_tokens is not None:
        kwargs["max_new_tokens"] = base.max_new_tokens
    else:
        kwargs["max_length"] = base.max_length if base.max_length is not None else 20
    return GenerationConfig(**kwargs)


def strip_decoded(sequences: torch.Tensor, model) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns `(token_ids, mask)` of `generate` output: start token dropped, pad after the first EOS.

    Args:
        sequences (`torch.LongTensor` of shape `(N, 1 + T)`): `generate` output, decoder start token first.

    Returns: token ids `(N, max(T, 1))` and the `completion_mask` of them (true up to and including EOS).
    """
    ids = sequences[:, 1:]
    if ids.shape[1] == 0:
        ids = sequences.new_full((sequences.shape[0], 1), pad_id(model))
    mask = completion_mask(ids, eos_ids(model))
    return ids.masked_fill(~mask, pad_id(model)), mask


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


@torch.no_grad()
def sample_rollout(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    generation_config: GenerationConfig,
    num_samples: int = 1,
    with_greedy: bool = False,
    keys: torch.Tensor | None = None,
) -> Rollout:
    """Returns `num_samples` sampled sequences per source and, if `with_greedy`, the greedy decode.

    Decoding runs in eval mode (no dropout), in one decode of `B * (num_samples + with_greedy)` rows
    (`hf_seqrl.decoding.decode`). The samples follow the distribution `generate(do_sample=True)` samples from
    with the same config; the greedy rows are the tokens of greedy `generate`.

    Randomness: one `torch.rand((max_new_tokens, B * num_samples))` from the global RNG of the inputs' device,
    drawn at the start whatever the samples' lengths. Seeding before a rollout reproduces it, and consecutive
    rollouts draw fresh uniforms. With `keys` `(B * num_samples,)` (`sampling.row_keys`), each sample row's uniforms
    are `sampling.keyed_uniforms` of its key instead: its tokens do not depend on the other rows of the decode.

    Args:
        model: an unwrapped encoder-decoder `PreTrainedModel` (FSDP2-sharded models included).
        input_ids (`torch.LongTensor` of shape `(B, S)`), attention_mask (`(B, S)`): the sources.
        generation_config: from `rollout_generation_config`.
    """
    return _decoded_rollout(model, input_ids, attention_mask, generation_config, num_samples, with_greedy, keys=keys)


def _decoded_rollout(model, input_ids, attention_mask, generation_config, num_samples, with_greedy,
                     prefix_ids: torch.Tensor | None = None, keys: torch.Tensor | None = None) -> Rollout:
    """Returns the `Rollout` of one decode of every row in eval mode; with `prefix_ids` `(B, P)`, each row holds
    the forced prefix then its continuation (mask true on the prefix)."""
    settings = DecodeSettings.from_generation_config(generation_config)
    if prefix_ids is not None:  # the decode counts steps from the prefix's end, the bans count target positions
        settings = dataclasses.replace(settings, bans=settings.bans.after_prefix(prefix_ids.shape[1]))
    group = num_samples + int(with_greedy)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    uniforms = rollout_uniforms(settings.max_new_tokens, input_ids.shape[0] * num_samples, input_ids.device, keys)
    with eval_mode(model):
        ids = decode(model, input_ids, attention_mask, settings, group, with_greedy, uniforms, prefix_ids)
    mask = completion_mask(ids, list(settings.eos_ids))
    ids = ids.masked_fill(~mask, settings.pad_id)
    if prefix_ids is not None:
        prefix = prefix_ids.repeat_interleave(group, dim=0)
        ids = torch.cat([prefix, ids], dim=1)
        mask = torch.cat([torch.ones_like(prefix, dtype=torch.bool), mask], dim=1)
    sample_ids, greedy_ids = split_groups(ids, group, with_greedy)
    sample_mask, greedy_mask = split_groups(mask, group, with_greedy)
    return Rollout(sample_ids, sample_mask, greedy_ids, greedy_mask, num_samples)


@torch.no_grad()
def sample_from_prefix(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    prefix_ids: torch.Tensor,
    generation_config: GenerationConfig,
    num_samples: int = 1,
    with_greedy: bool = False,
    keys: torch.Tensor | None = None,
) -> Rollout:
    """Returns `num_samples` continuations per source of a forced decoder prefix (and the greedy continuation).

    The decoder reads the start token and `prefix_ids`, then samples as `sample_rollout` does; the returned
    sequences hold the prefix followed by the continuation (decoder start token stripped). The encoder runs once
    per source, and `generation_config.max_new_tokens` counts the continuation only.

    Args:
        model: an unwrapped encoder-decoder `PreTrainedModel`.
        input_ids (`torch.LongTensor` of shape `(B, S)`), attention_mask (`(B, S)`): the sources.
        prefix_ids (`torch.LongTensor` of shape `(B, P)`): the forced tokens after the start token, `P >= 1`.
        generation_config: from `rollout_generation_config`.
    """
    return _decoded_rollout(model, input_ids, attention_mask, generation_config, num_samples, with_greedy, prefix_ids,
                            keys)


@contextlib.contextmanager
def expand_encoder_states(model, group: int):
    """Within the context, the decoder of `model` sees every encoder row repeated `group` times.

    The encoder thus runs once per source while the decoder scores `group` sequences per source;
    gradients flow back through the expansion to the encoder.
    """
    decoder = unwrap(model).get_decoder()

    def hook(module, args, kwargs):
        for key in ("encoder_hidden_states", "encoder_attention_mask"):
            value = kwargs.get(key)
            if value is not None:
                kwargs[key] = value.repeat_interleave(group, dim=0)
        return args, kwargs

    handle = decoder.register_forward_pre_hook(hook, with_kwargs=True) if group > 1 else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


def score_rollout(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sample_ids: torch.Tensor,
    num_samples: int,
    start_id: int,
    pad: int,
    gold_labels: torch.Tensor | None = None,
    temperature: float = 1.0,
    bans: TokenBans | None = None,
) -> ScoredRollout:
    """Returns token log-probs of the sampled sequences (with grad) in one teacher-forced forward.

    The encoder runs once per source; the decoder scores the `n` samples of each source and, if
    `gold_labels` is given, the gold target too (for the mixed cross-entropy term). The log-probs of the samples
    (at `temperature`) and of the gold tokens (at temperature 1) come from one pass over the logits, both under
    `bans` (the rollout's `TokenBans`: banned tokens out of the softmax, the logits themselves left unmasked).

    Args:
        model: the (possibly DDP-wrapped or FSDP2-sharded) encoder-decoder model.
        input_ids (`torch.LongTensor` of shape `(B, S)`), attention_mask (`(B, S)`): the sources.
        sample_ids (`torch.LongTensor` of shape `(B*n, T)`): sampled tokens, pad after EOS.
        gold_labels (`torch.LongTensor` of shape `(B, T_gold)`, -100 at padding) or None.
        bans (`TokenBans`, *optional*): what the rollout decode banned (`Seq2SeqFamily.score` reads the model's).
    """
    batch = input_ids.shape[0]
    t_sample = sample_ids.shape[1]
    rows = sample_ids.view(batch, num_samples, t_sample)
    group = num_samples
    if gold_labels is not None:
        length = max(t_sample, gold_labels.shape[1])
        rows = right_pad(rows.flatten(0, 1), length, pad).view(batch, num_samples, length)
        gold = right_pad(gold_labels, length, -100).unsqueeze(1)
        rows = torch.cat([rows, gold], dim=1)
        group += 1
    targets = rows.flatten(0, 1)
    decoder_input_ids = shift_right(targets, start_id, pad)
    with expand_encoder_states(model, group):
        logits = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            use_cache=False,
        ).logits
    logits = logits.view(batch, group, logits.shape[1], logits.shape[2])
    banned = None if bans is None else bans.mask(logits.shape[2], logits.shape[3], logits.device)
    sample_logits, token_logprobs, gold_logits, gold_logprobs, sample_banned = group_logprobs(
        logits, rows, sample_ids, num_samples, temperature, banned, with_gold=gold_labels is not None)
    if gold_labels is None:
        return ScoredRollout(sample_logits, token_logprobs, None, banned=sample_banned)
    t_gold = gold_labels.shape[1]
    return ScoredRollout(sample_logits, token_logprobs, gold_logits[:, :t_gold], gold_logprobs[:, :t_gold],
                         sample_banned)


class Seq2SeqFamily(ModelFamily):
    """Encoder-decoder models: the source is the encoder's input; targets follow the decoder start token."""

    name, auto_class = "seq2seq", "AutoModelForSeq2SeqLM"

    def generation_config(self, model, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, max_length=None):
        return rollout_generation_config(model, max_new_tokens, temperature, top_k, top_p, max_length=max_length)

    def sample(self, model, batch, generation_config, num_samples=1, with_greedy=False, keys=None):
        return sample_rollout(model, batch["input_ids"], batch.get("attention_mask"), generation_config, num_samples,
                              with_greedy=with_greedy, keys=keys)

    def sample_from_prefix(self, model, batch, prefix, generation_config, num_samples=1, with_greedy=False, keys=None):
        return sample_from_prefix(model, batch["input_ids"], batch.get("attention_mask"), prefix, generation_config,
                                  num_samples, with_greedy=with_greedy, keys=keys)

    def score(self, model, batch, sample_ids, num_samples, gold_labels=None, temperature=1.0):
        inner = unwrap(model)
        # The bans of the rollout config this family builds from the model's generation config.
        bans = TokenBans.from_generation_config(self.generation_config(inner, None))
        return score_rollout(model, batch["input_ids"], batch.get("attention_mask"), sample_ids, num_samples,
                             decoder_start_id(inner), pad_id(inner), gold_labels, temperature, bans)

    def generate(self, model, batch, **generate_kwargs):
        return model.generate(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                              **generate_kwargs)

    def beam_search(self, model, batch, num_beams, num_return, max_new_tokens, limits=None):
        kwargs = beam_kwargs(model, num_beams, num_return, max_new_tokens, limits, offset=1)  # after the start token
        with eval_mode(model), torch.no_grad():
            return strip_decoded(self.generate(model, batch, **kwargs), model)

    def continue_from(self, model, batch, prefix, generation_config):
        forced = None if prefix is None else torch.cat(
            [prefix.new_full((prefix.shape[0], 1), decoder_start_id(model)), prefix], dim=1)
        out = model.generate(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                             generation_config=generation_config, decoder_input_ids=forced)
        return strip_decoded(out, model)

    def prompts(self, model, batch):
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
        return ids.masked_fill(~mask, pad_id(unwrap(model))), mask

    def encode(self, model, batch):
        out = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                                  return_dict=True)
        return {"encoder_outputs": BaseModelOutput(last_hidden_state=out.last_hidden_state),
                "attention_mask": batch.get("attention_mask")}

    def rotate(self, encoded, shifts=-1):
        states = encoded["encoder_outputs"].last_hidden_state.roll(shifts, dims=0)
        mask = encoded["attention_mask"]
        return {"encoder_outputs": BaseModelOutput(last_hidden_state=states),
                "attention_mask": None if mask is None else mask.roll(shifts, dims=0)}

    def select(self, encoded, index):
        if index is None:
            return encoded
        states, mask = encoded["encoder_outputs"].last_hidden_state, encoded["attention_mask"]
        return {"encoder_outputs": BaseModelOutput(last_hidden_state=states[index]),
                "attention_mask": None if mask is None else mask[index]}

    def detach(self, encoded):
        states = encoded["encoder_outputs"].last_hidden_state.detach()
        return {"encoder_outputs": BaseModelOutput(last_hidden_state=states), "attention_mask": encoded["attention_mask"]}

    def target_labels(self, batch):
        return batch["labels"]

    def target_forward(self, model, encoded, targets, group=1, output_hidden_states=False):
        inner = unwrap(model)
        rows = shift_right(targets, decoder_start_id(inner), pad_id(inner))
        with expand_encoder_states(model, group):
            out = model(encoder_outputs=encoded["encoder_outputs"], attention_mask=encoded["attention_mask"],
                        decoder_input_ids=rows, output_hidden_states=output_hidden_states, use_cache=False)
        if output_hidden_states:
            out.hidden_states = out.decoder_hidden_states[-1]
        return out

    def input_embeddings(self, model):
        return model.get_decoder().get_input_embeddings()

    def label_start_id(self, model):
        return decoder_start_id(model)

    def structural_ids(self, model):
        return [decoder_start_id(model)]
