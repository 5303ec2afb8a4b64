"""Decoder-only models (`CausalFamily`): prompts split from a batch, one decode loop for the samples and the greedy row
(a long prompt's KV cache computed once per source), and teacher-forced log-probs of completion tokens.

A batch row holds `prompt + completion` in `input_ids` with `labels` = -100 on the prompt (the usual causal-LM
layout), or the prompt alone (a dataset with `references` and no `labels`). The prompt of a row is its attended
tokens before its first label; rollouts read it left-padded, so that every row's next token sits in the last column.
Only completion positions count: log-probs, masks and cross-entropy cover the completion tokens up to and including
their EOS, nothing before or after.
"""

from __future__ import annotations

import dataclasses

import torch
from transformers import DynamicCache, GenerationConfig

from ..functional.logprobs import group_logprobs
from ..functional.sampling import rollout_uniforms
from .bans import TokenBans, token_ban_settings
from .beam import beam_kwargs
from ..types import Rollout, ScoredRollout
from .base import (DecodeSettings, ModelFamily, any_rank_running, choose_tokens, completion_mask, eos_ids, eval_mode,
                   lockstep_group, pad_id, right_pad, rows_to_keep, split_groups, unwrap)


# Below this many prompt tokens, reading a prompt once per sample costs less than the extra forward call that shares
# its KV cache. Measured on CPU, 2-layer width-64 Llama, 4 prompts x 4 samples, 12 new tokens: sharing took 8.8 ms
# against 8.2 at 15 prompt tokens, 8.4 against 9.6 at 31, 9.7 against 14.6 at 63.
PROMPT_CACHE_MIN_TOKENS = 24


def _first_completion_position(labels: torch.Tensor) -> torch.Tensor:
    """Returns, per row of `labels` `(B, L)`, the index of its first label other than -100 (`L` when none)."""
    is_completion = labels != -100
    first = is_completion.int().argmax(dim=1)
    return torch.where(is_completion.any(dim=1), first, torch.full_like(first, labels.shape[1]))


def _pack(ids: torch.Tensor, keep: torch.Tensor, pad: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns `(ids, mask)`: the kept tokens of each row, in order, packed to the left or right edge.

    A stable sort on the keep flag moves the kept tokens to one side without reordering them.
    """
    key = keep.int() if left else (~keep).int()
    order = torch.argsort(key, dim=1, stable=True)
    width = max(int(keep.sum(dim=1).max()), 1)
    packed, mask = ids.gather(1, order), keep.gather(1, order)
    packed, mask = (packed[:, -width:], mask[:, -width:]) if left else (packed[:, :width], mask[:, :width])
    return packed.masked_fill(~mask, pad), mask


def split_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, labels: torch.Tensor | None,
                  pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns the prompts of a batch, left-padded: ids `(B, P)` (pad where masked) and mask `(B, P)`.

    Args:
        input_ids (`torch.LongTensor` of shape `(B, L)`): prompt + completion (or the prompt alone), padded on
            either side.
        attention_mask (`(B, L)`, *optional*), labels (`(B, L)`, -100 on the prompt and padding, *optional*): without
            labels every attended token is prompt.
    """
    keep = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    if labels is not None:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        keep = keep & (positions.unsqueeze(0) < _first_completion_position(labels).unsqueeze(1))
    return _pack(input_ids, keep, pad, left=True)


def completion_labels(labels: torch.Tensor) -> torch.Tensor:
    """Returns the completion tokens of each row of `labels` `(B, L)`, right-aligned at column 0: `(B, T)`, -100
    after them."""
    ids, _ = _pack(labels, labels != -100, -100, left=False)
    return ids


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Returns the position of each token of left-padded rows `(N, L)` as `generate` numbers them (pads: 1)."""
    return (mask.long().cumsum(-1) - 1).masked_fill(~mask.bool(), 1)


def causal_generation_config(model, max_new_tokens: int | None, temperature: float = 1.0, top_k: int = 0,
                             top_p: float = 1.0, max_length: int | None = None) -> GenerationConfig:
    """Returns a generation config that samples completions from the model's own distribution.

    As `seq2seq.rollout_generation_config` does for seq2seq models: only EOS, pad, BOS and the single-token bans
    (`bad_words_ids`, `suppress_tokens`, `begin_suppress_tokens` at the first completion token) are kept from the
    model's generation config; penalties, beams and minimum lengths are dropped. `max_length` (the
    Seq2SeqTrainer's `generation_max_length`) counts completion tokens here, since prompts differ in length.
    """
    base = model.generation_config
    budget = max_new_tokens or max_length or base.max_new_tokens or 20
    return GenerationConfig(do_sample=True, num_beams=1, temperature=temperature, top_k=top_k, top_p=top_p,
                            eos_token_id=base.eos_token_id if base.eos_token_id is not None else model.config.eos_token_id,
                            pad_token_id=pad_id(model), bos_token_id=base.bos_token_id, max_new_tokens=budget,
                            **token_ban_settings(base))


def _strip_prompt(sequences: torch.Tensor, prompt_width: int, model) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns `(completion ids (N, max(T, 1)), mask)` of `generate` output: prompt dropped, pad after EOS."""
    ids = sequences[:, prompt_width:]
    if ids.shape[1] == 0:
        ids = sequences.new_full((sequences.shape[0], 1), pad_id(model))
    mask = completion_mask(ids, eos_ids(model))
    return ids.masked_fill(~mask, pad_id(model)), mask


def generate_completions(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                         **generate_kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns `(completion ids (B, T), mask)` of `model.generate` on left-padded prompts (greedy, beams, or whatever
    `generate_kwargs` ask for: evaluation and diagnostics), pad after each row's first EOS."""
    sequences = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask.long(), **generate_kwargs)
    return _strip_prompt(sequences, prompt_ids.shape[1], model)


def _prefill(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group: int):
    """Returns `(cache, logits (B*group, V) of the next token, mask (B*group, P))` after reading the prompts.

    Prompts of at least `PROMPT_CACHE_MIN_TOKENS` tokens are read once and their cache expanded to their group of rows.
    """
    cache = DynamicCache(config=model.config)
    mask = prompt_mask.bool().repeat_interleave(group, dim=0)
    if group > 1 and prompt_ids.shape[1] >= max(PROMPT_CACHE_MIN_TOKENS, 2):
        model(input_ids=prompt_ids[:, :-1], attention_mask=prompt_mask[:, :-1].long(),
              position_ids=position_ids(prompt_mask[:, :-1]), cache=cache, use_cache=True, logits_to_keep=1)
        cache.batch_repeat_interleave(group)
        rows = prompt_ids[:, -1:].repeat_interleave(group, dim=0)
        logits = model(input_ids=rows, attention_mask=mask.long(), position_ids=position_ids(mask)[:, -1:],
                       cache=cache, use_cache=True).logits[:, -1]
    else:
        rows = prompt_ids.repeat_interleave(group, dim=0)
        logits = model(input_ids=rows, attention_mask=mask.long(), position_ids=position_ids(mask), cache=cache,
                       use_cache=True, logits_to_keep=1).logits[:, -1]
    return cache, logits, mask


@torch.no_grad()
def decode_causal(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, generation_config: GenerationConfig,
                  group: int = 1, greedy_first: bool = False, compact_below: float = 0.5,
                  prefix_length: int = 0, keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns `(completion ids (B*group, T), mask)`: each prompt continued `group` times, pad after EOS.

    A plain decode loop over the model's KV cache: the first row of each group is greedy when `greedy_first`, the
    others sample from `generation_config`'s temperature / top-k / top-p; decoding stops when every row has written
    an EOS or `max_new_tokens` tokens. It does what `generate` does for these rows without its per-step machinery
    (processors, stopping criteria, model-kwargs updates), which dominates the step time of small models. The
    uniforms of the draws are one `torch.rand((max_new_tokens, sampled rows))` call on the global RNG per decode
    (`sampling.draw_uniforms`), as the seq2seq rollouts draw them, or with `keys` (one per sampled row) the
    `sampling.keyed_uniforms` of each row's key. Ended rows leave the forward once the running
    rows are at most `compact_below` of those in it (0: never), as in `seq2seq.decode`. The tokens the config bans
    are masked before every choice; `prefix_length` completion tokens already end the prompts (a forced prefix),
    which the position of `begin_suppress_tokens` counts.
    """
    settings = DecodeSettings.from_generation_config(generation_config)
    settings = dataclasses.replace(settings, bans=settings.bans.after_prefix(prefix_length))
    pad, eos = pad_id(model), torch.tensor(eos_ids(model), device=prompt_ids.device)
    cache, logits, mask = _prefill(model, prompt_ids, prompt_mask, group)
    rows, steps, device = logits.shape[0], settings.max_new_tokens, logits.device
    sampled = torch.ones(rows, dtype=torch.bool, device=device)
    if greedy_first:
        sampled = torch.arange(rows, device=device) % group != 0
    if not settings.do_sample:
        sampled = torch.zeros_like(sampled)
    # Each row's uniform per step (the sampled rows' in order; greedy rows read none).
    row_uniforms = torch.ones((steps, rows), dtype=torch.float64, device=device)
    if sampled.any():
        row_uniforms[:, sampled] = rollout_uniforms(steps, int(sampled.sum()), device, keys).to(torch.float64)
    positions = position_ids(mask)[:, -1:]
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    active = torch.arange(rows, device=device)  # the rows in the forward (ended rows leave it, as in `decode`)
    lockstep = lockstep_group()
    tokens = []
    for step in range(steps):
        on = sampled[active]
        chosen = choose_tokens(logits, step, settings, on, row_uniforms[step, active][on])
        chosen = torch.full((rows,), pad, dtype=torch.long, device=device).index_copy_(0, active, chosen)
        chosen = chosen.masked_fill(finished, pad)
        tokens.append(chosen)
        finished = finished | torch.isin(chosen, eos)
        done = bool(finished.all()) or step + 1 == steps
        # Sharded weights (FSDP2, ZeRO-3) are gathered inside every forward, which every rank must join: a rank whose
        # rows have all ended keeps calling the model (its outputs unused) while another still decodes.
        if not (any_rank_running(not done, device) if lockstep else not done):
            break
        keep = None if done else rows_to_keep(~finished[active], compact_below)
        if keep is not None:
            cache.batch_select_indices(keep)
            mask, positions, active = mask[keep], positions[keep], active[keep]
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        positions = positions + 1
        logits = model(input_ids=chosen[active, None], attention_mask=mask.long(), position_ids=positions,
                       cache=cache, use_cache=True).logits[:, -1]
    ids = torch.stack(tokens, dim=1)
    if bool(finished.all()):  # steps taken only to keep pace with other ranks add nothing
        ids = ids[:, : int(completion_mask(ids, eos_ids(model)).sum(dim=1).max())]
    done = completion_mask(ids, eos_ids(model))
    return ids.masked_fill(~done, pad), done


def append_prefix(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                  prefix_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns `(ids, mask)` of left-padded prompts `(B, P)` followed by completion tokens `prefix_ids` `(B, K)`
    that every row continues from (unchanged when there are none)."""
    if prefix_ids is None or not prefix_ids.shape[1]:
        return prompt_ids, prompt_mask
    return (torch.cat([prompt_ids, prefix_ids], dim=1),
            torch.cat([prompt_mask.bool(), torch.ones_like(prefix_ids, dtype=torch.bool)], dim=1))


@torch.no_grad()
def sample_causal(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, labels: torch.Tensor | None,
                  generation_config: GenerationConfig, num_samples: int = 1, with_greedy: bool = False,
                  prefix_ids: torch.Tensor | None = None, keys: torch.Tensor | None = None) -> Rollout:
    """Returns `num_samples` sampled completions per prompt and, if `with_greedy`, the greedy completion.

    One decode in eval mode (`decode_causal`) over every prompt's group of rows: the argmax on each source's greedy
    row and a sample elsewhere, as `seq2seq.sample_rollout` does for seq2seq models.

    Args:
        model: an unwrapped `PreTrainedModel` for causal LM.
        input_ids, attention_mask, labels (`(B, L)`): the batch, as `split_prompts` reads it.
        generation_config: from `causal_generation_config`; `max_new_tokens` counts the tokens after any prefix.
        prefix_ids (`torch.LongTensor` of shape `(B, K)`, *optional*): completion tokens every row of a prompt
            starts with (MIXER's gold prefix): they are read after the prompt, and the returned completions hold
            them followed by the decoded continuation.
        keys (`torch.LongTensor` of shape `(B*num_samples,)`, *optional*): the sample rows' keys (`decode_causal`).
    """
    pad = pad_id(model)
    prompt_ids, prompt_mask = split_prompts(input_ids, attention_mask, labels, pad)
    context_ids, context_mask = append_prefix(prompt_ids, prompt_mask, prefix_ids)
    group = num_samples + int(with_greedy)
    with eval_mode(model):
        ids, mask = decode_causal(model, context_ids, context_mask, generation_config, group, greedy_first=with_greedy,
                                  prefix_length=0 if prefix_ids is None else prefix_ids.shape[1], keys=keys)
    if context_ids is not prompt_ids:
        ids = torch.cat([prefix_ids.repeat_interleave(group, dim=0), ids], dim=1)
        mask = completion_mask(ids, eos_ids(model))
        ids = ids.masked_fill(~mask, pad)
    sample_ids, greedy_ids = split_groups(ids, group, with_greedy)
    sample_mask, greedy_mask = split_groups(mask, group, with_greedy)
    return Rollout(sample_ids, sample_mask, greedy_ids, greedy_mask, num_samples)


def completion_forward(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completions: torch.Tensor,
                       group: int = 1, output_hidden_states: bool = False):
    """Returns the model output on `prompt + completion` rows, its logits cut to the completion positions:
    `logits[:, t]` `(N, T, V)` predicts `completions[:, t]` from the prompt and `completions[:, :t]`.

    With `output_hidden_states`, `hidden_states` holds the last layer's states at the same positions, `(N, T, d)`:
    position `t` reads `completions[:, t - 1]` (the last prompt token at `t = 0`).

    Args:
        prompt_ids, prompt_mask (`(B, P)`): left-padded prompts; each is repeated `group` times in place (its group of rows).
        completions (`torch.LongTensor` of shape `(B*group, T)`): tokens after the prompt (any id where padded;
            later positions do not change the logits of earlier ones).
    """
    width, length = prompt_ids.shape[1], completions.shape[1]
    rows = torch.cat([prompt_ids.repeat_interleave(group, dim=0), completions.clamp(min=0)], dim=1)
    mask = torch.cat([prompt_mask.repeat_interleave(group, dim=0).bool(),
                      torch.ones_like(completions, dtype=torch.bool)], dim=1)
    # The last prompt position predicts the first completion token; the completion's last token predicts nothing.
    out = model(input_ids=rows[:, :-1], attention_mask=mask[:, :-1].long(), position_ids=position_ids(mask[:, :-1]),
                use_cache=False, logits_to_keep=length, output_hidden_states=output_hidden_states)
    if output_hidden_states:
        out.hidden_states = out.hidden_states[-1][:, width - 1:]
    return out


def score_causal(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, labels: torch.Tensor | None,
                 sample_ids: torch.Tensor, num_samples: int, pad: int, gold_labels: torch.Tensor | None = None,
                 temperature: float = 1.0, bans: TokenBans | None = None) -> ScoredRollout:
    """Returns the token log-probs of sampled completions (with grad) in one teacher-forced forward.

    The log-probs of the samples (at `temperature`) and, with `gold_labels`, of the gold completions (at temperature
    1) come from one pass over the logits, both under `bans` (the rollout's `TokenBans`; the logits stay unmasked).

    Args:
        model: the (possibly DDP-wrapped) causal LM.
        input_ids, attention_mask, labels (`(B, L)`): the batch the samples continue (`split_prompts`).
        sample_ids (`torch.LongTensor` of shape `(B*n, T)`): sampled completions, pad after EOS.
        gold_labels (`torch.LongTensor` of shape `(B, L)`, -100 on prompt and padding) or None: with them the gold
            completion of each source is scored in the same forward, and `gold_logits` `(B, L, V)` is aligned with
            `gold_labels` (position `t` predicts `gold_labels[:, t]`; zeros where it is -100), and `gold_logprobs`
            `(B, L)` likewise.
        bans (`TokenBans`, *optional*): what the rollout decode banned (`CausalFamily.score` reads the model's).
    """
    prompt_ids, prompt_mask = split_prompts(input_ids, attention_mask, labels, pad)
    batch, t_sample = prompt_ids.shape[0], sample_ids.shape[1]
    rows, group = sample_ids.view(batch, num_samples, t_sample), num_samples
    gold = None
    if gold_labels is not None:
        gold = completion_labels(gold_labels)
        length = max(t_sample, gold.shape[1])
        rows = right_pad(rows.flatten(0, 1), length, pad).view(batch, num_samples, length)
        rows = torch.cat([rows, right_pad(gold, length, pad).unsqueeze(1)], dim=1)
        group += 1
    logits = completion_forward(model, prompt_ids, prompt_mask, rows.flatten(0, 1).clamp(min=0), group).logits
    logits = logits.view(batch, group, logits.shape[1], logits.shape[2])
    banned = None if bans is None else bans.mask(logits.shape[2], logits.shape[3], logits.device)
    sample_logits, token_logprobs, gold_logits, gold_logprobs, sample_banned = group_logprobs(
        logits, rows, sample_ids, num_samples, temperature, banned, with_gold=gold is not None)
    if gold is None:
        return ScoredRollout(sample_logits, token_logprobs, None, banned=sample_banned)
    width = gold.shape[1]
    return ScoredRollout(sample_logits, token_logprobs, _align_to_labels(gold_logits[:, :width], gold, gold_labels),
                         _align_to_labels(gold_logprobs[:, :width], gold, gold_labels), sample_banned)


def _align_to_labels(completion_logits: torch.Tensor, gold: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Returns logits `(B, L, V)` (or log-probs `(B, L)`) placed at the positions of `labels` `(B, L)` that hold the
    completion (zeros elsewhere), from the completion-ordered `completion_logits` `(B, T, V)` (or `(B, T)`) of
    `gold` `(B, T)`."""
    aligned = completion_logits.new_zeros(labels.shape + completion_logits.shape[2:])
    return aligned.index_put((labels != -100).nonzero(as_tuple=True), completion_logits[gold != -100])


class CausalFamily(ModelFamily):
    """Decoder-only models: the prompt precedes the completion in one row; only completion tokens count."""

    name, auto_class = "causal", "AutoModelForCausalLM"
    trainer_generates = False
    prompt_padding_side = "left"  # positions count from each row's first attended token

    def generation_config(self, model, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, max_length=None):
        return causal_generation_config(model, max_new_tokens, temperature, top_k, top_p, max_length)

    def sample(self, model, batch, generation_config, num_samples=1, with_greedy=False, keys=None):
        return sample_causal(model, batch["input_ids"], batch.get("attention_mask"), batch.get("labels"),
                             generation_config, num_samples, with_greedy, keys=keys)

    def sample_from_prefix(self, model, batch, prefix, generation_config, num_samples=1, with_greedy=False, keys=None):
        return sample_causal(model, batch["input_ids"], batch.get("attention_mask"), batch.get("labels"),
                             generation_config, num_samples, with_greedy, prefix_ids=prefix, keys=keys)

    def score(self, model, batch, sample_ids, num_samples, gold_labels=None, temperature=1.0):
        # The bans of the rollout config this family builds from the model's generation config.
        bans = TokenBans.from_generation_config(self.generation_config(unwrap(model), None))
        return score_causal(model, batch["input_ids"], batch.get("attention_mask"), batch.get("labels"),
                                   sample_ids, num_samples, pad_id(unwrap(model)), gold_labels, temperature, bans)

    def prompts(self, model, batch):
        """Returns the left-padded prompts `(ids (B, P), mask (B, P))` of a batch."""
        return split_prompts(batch["input_ids"], batch.get("attention_mask"), batch.get("labels"),
                                    pad_id(unwrap(model)))

    def generate(self, model, batch, **generate_kwargs):
        # Prompts differ in length: a `max_length` (Seq2SeqTrainer's generation_max_length) counts completion tokens.
        if generate_kwargs.get("max_length") is not None and generate_kwargs.get("max_new_tokens") is None:
            generate_kwargs["max_new_tokens"] = generate_kwargs.pop("max_length")
        generate_kwargs.pop("max_length", None)
        # `synced_gpus` (set by Seq2SeqTrainer under ZeRO-3 and FSDP) reaches `generate`, which then keeps every rank
        # stepping until all ranks' rows have ended.
        prompt_ids, prompt_mask = self.prompts(model, batch)
        ids, _ = generate_completions(unwrap(model), prompt_ids, prompt_mask, **generate_kwargs)
        return ids

    def beam_search(self, model, batch, num_beams, num_return, max_new_tokens, limits=None):
        prompt_ids, prompt_mask = self.prompts(model, batch)
        kwargs = beam_kwargs(model, num_beams, num_return, max_new_tokens, limits, offset=prompt_ids.shape[1])
        with eval_mode(model), torch.no_grad():
            return generate_completions(model, prompt_ids, prompt_mask, **kwargs)

    def continue_from(self, model, batch, prefix, generation_config):
        prompt_ids, prompt_mask = append_prefix(*self.prompts(model, batch), prefix)
        ids, _ = generate_completions(model, prompt_ids, prompt_mask, generation_config=generation_config)
        ids = ids if prefix is None else torch.cat([prefix, ids], dim=1)
        mask = completion_mask(ids, eos_ids(model))
        return ids.masked_fill(~mask, pad_id(model)), mask

    def encode(self, model, batch):
        prompt_ids, prompt_mask = self.prompts(model, batch)
        return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask}

    def rotate(self, encoded, shifts=-1):
        return {key: value.roll(shifts, dims=0) for key, value in encoded.items()}

    def select(self, encoded, index):
        return encoded if index is None else {key: value[index] for key, value in encoded.items()}

    def detach(self, encoded):
        return encoded  # token ids: nothing to cut

    def target_labels(self, batch):
        return completion_labels(batch["labels"])

    def target_forward(self, model, encoded, targets, group=1, output_hidden_states=False):
        return completion_forward(model, encoded["prompt_ids"], encoded["prompt_mask"],
                                         targets.masked_fill(targets == -100, pad_id(unwrap(model))), group,
                                         output_hidden_states)

    def target_offset(self, encoded):
        return encoded["prompt_ids"].shape[1] - 1

    def structural_ids(self, model):
        bos = model.generation_config.bos_token_id
        return [] if bos is None else [int(bos)]
