"""Decoder-only models (`CausalFamily`): prompts split from a batch, the decode's model calls (a long prompt's KV cache
computed once per source), and the teacher-forced pass over completion tokens.

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

from ..types import Rollout
from .bans import token_ban_settings
from .beam import beam_kwargs
from .base import DecodeSettings, ModelFamily, eval_mode, prepared_attention_mask, quiet_length_warnings, unwrap
from .scoring import ScoreOptions
from .tokens import eos_ids, generated_targets, pad_after_eos, pad_id
from .sharding import whole_for_decode
from .decoding import DecodeSteps, decode_rollout, decode_targets


# Below this many prompt tokens, reading a prompt once per sample costs less than the extra forward call that shares
# its KV cache (the timings: docs/performance.md, "Decoder-only prompts: one read per source or per row").
PROMPT_CACHE_MIN_TOKENS = 24


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
    if labels is not None:  # the prompt ends at the first label other than -100 (`L` when none)
        is_completion = labels != -100
        first = is_completion.int().argmax(dim=1)
        first = torch.where(is_completion.any(dim=1), first, torch.full_like(first, labels.shape[1]))
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        keep = keep & (positions.unsqueeze(0) < first.unsqueeze(1))
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
                             top_p: float = 1.0, max_length: int | None = None,
                             epsilon_cutoff: float = 0.0) -> GenerationConfig:
    """Returns a generation config that samples completions from the model's own distribution.

    As `seq2seq.rollout_generation_config` does for seq2seq models: only EOS, pad, BOS and the single-token bans
    (`bad_words_ids`, `suppress_tokens`, `begin_suppress_tokens` at the first completion token) are kept from the
    model's generation config; penalties, beams and minimum lengths are dropped. `max_length` (the
    Seq2SeqTrainer's `generation_max_length`) counts completion tokens here, since prompts differ in length.
    """
    base = model.generation_config
    budget = max_new_tokens or max_length or base.max_new_tokens or 20
    return GenerationConfig(do_sample=True, num_beams=1, temperature=temperature, top_k=top_k, top_p=top_p,
                            epsilon_cutoff=epsilon_cutoff,
                            eos_token_id=base.eos_token_id if base.eos_token_id is not None else model.config.eos_token_id,
                            pad_token_id=pad_id(model), bos_token_id=base.bos_token_id, max_new_tokens=budget,
                            **token_ban_settings(base))


def generate_completions(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                         **generate_kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns `(completion ids (B, T), mask)` of `model.generate` on left-padded prompts (greedy, beams, or whatever
    `generate_kwargs` ask for: evaluation and diagnostics), pad after each row's first EOS."""
    with quiet_length_warnings():
        sequences = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask.long(), **generate_kwargs)
    return generated_targets(sequences, prompt_ids.shape[1], model)


class CausalSteps(DecodeSteps):
    """The decode's model calls for a decoder-only model on left-padded prompts `(B, P)`: positions count from each
    row's first attended token (as `generate` numbers them), and every step adds one column to the KV cache and the
    mask. Prompts of at least `PROMPT_CACHE_MIN_TOKENS` tokens are read once per source, their cache then expanded to
    their `group` rows; shorter ones are read once per row."""

    def __init__(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group: int):
        super().__init__(prompt_ids.shape[0], group, prompt_ids.device)
        self.model, self.prompt_ids, self.prompt_mask = model, prompt_ids, prompt_mask

    def first(self) -> torch.Tensor:
        model, prompt_ids, prompt_mask, group = self.model, self.prompt_ids, self.prompt_mask, self.group
        self.cache = DynamicCache(config=model.config)
        self.mask = prompt_mask.bool().repeat_interleave(group, dim=0)
        if group > 1 and prompt_ids.shape[1] >= max(PROMPT_CACHE_MIN_TOKENS, 2):
            model(input_ids=prompt_ids[:, :-1], attention_mask=prompt_mask[:, :-1].long(),
                  position_ids=position_ids(prompt_mask[:, :-1]), cache=self.cache, use_cache=True, logits_to_keep=1)
            self.cache.batch_repeat_interleave(group)
            rows = prompt_ids[:, -1:].repeat_interleave(group, dim=0)
            logits = model(input_ids=rows, attention_mask=self.mask.long(),
                           position_ids=position_ids(self.mask)[:, -1:], cache=self.cache, use_cache=True).logits[:, -1]
        else:
            rows = prompt_ids.repeat_interleave(group, dim=0)
            logits = model(input_ids=rows, attention_mask=self.mask.long(), position_ids=position_ids(self.mask),
                           cache=self.cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        self.positions = position_ids(self.mask)[:, -1:]
        # Without left padding no mask is needed; with it, each step hands the model a prepared 4D mask, which it
        # takes as is (a 2D one it would read on the host at every step).
        self.padded = not bool(self.mask.all())  # once per decode
        self.config = unwrap(model).config
        return logits

    def next(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        self.positions = self.positions + 1
        mask = None
        if self.padded:
            mask = prepared_attention_mask(self.config, self.mask, self.cache_dtype())
            mask = self.mask.long() if mask is None else mask
        return self.model(input_ids=tokens[:, None], attention_mask=mask, position_ids=self.positions,
                          cache=self.cache, use_cache=True).logits[:, -1]

    def cache_dtype(self) -> torch.dtype:
        """Returns the dtype the attention scores are computed in (that of the model's parameters)."""
        return next(unwrap(self.model).parameters()).dtype

    def keep(self, index: torch.Tensor) -> None:
        self.cache.batch_select_indices(index)
        self.mask, self.positions = self.mask[index], self.positions[index]


@torch.no_grad()
def decode_causal(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, generation_config: GenerationConfig,
                  group: int = 1, greedy_first: bool = False, compact_below: float = 0.5,
                  prefix_length: int = 0, keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns `(completion ids (B*group, T), mask)`: each prompt continued `group` times, pad after EOS
    (`decoding.decode_targets` over `CausalSteps`).

    The first row of each group is greedy when `greedy_first`, the others sample from `generation_config`'s
    temperature / top-k / top-p; decoding stops when every row has written an EOS or `max_new_tokens` tokens. The
    uniforms of the draws are one `torch.rand((max_new_tokens, sampled rows))` call on the global RNG per decode
    (`sampling.draw_uniforms`), or with `keys` (one per sampled row) the `sampling.keyed_uniforms` of each row's
    key. Ended rows leave the forward once the running rows are at most `compact_below` of those in it (0: never).
    The tokens the config bans are masked before every choice; `prefix_length` completion tokens already end the
    prompts (a forced prefix), which the position of `begin_suppress_tokens` counts.
    """
    settings = DecodeSettings.from_generation_config(generation_config)
    settings = dataclasses.replace(settings, bans=settings.bans.after_prefix(prefix_length))
    return decode_targets(CausalSteps(model, prompt_ids, prompt_mask, group), settings, greedy_first, keys,
                          compact_below)


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

    One decode in eval mode (`decoding.decode_rollout` over `CausalSteps`) of every prompt's group of rows: the argmax
    on each source's greedy row and a sample elsewhere, as `Seq2SeqFamily.sample` does for seq2seq models.

    Args:
        model: an unwrapped `PreTrainedModel` for causal LM.
        input_ids, attention_mask, labels (`(B, L)`): the batch, as `split_prompts` reads it.
        generation_config: from `causal_generation_config`; `max_new_tokens` counts the tokens after any prefix.
        prefix_ids (`torch.LongTensor` of shape `(B, K)`, *optional*): completion tokens every row of a prompt
            starts with (MIXER's gold prefix): they are read after the prompt, and the returned completions hold
            them (mask true on them) followed by the decoded continuation.
        keys (`torch.LongTensor` of shape `(B*num_samples,)`, *optional*): the sample rows' keys (`decode_causal`).
    """
    prompts = split_prompts(input_ids, attention_mask, labels, pad_id(model))
    steps = CausalSteps(model, *append_prefix(*prompts, prefix_ids), num_samples + int(with_greedy))
    return decode_rollout(model, steps, DecodeSettings.from_generation_config(generation_config), with_greedy, keys,
                          prefix_ids)


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


class CausalFamily(ModelFamily):
    """Decoder-only models: the prompt precedes the completion in one row; only completion tokens count."""

    name, auto_class = "causal", "AutoModelForCausalLM"
    trainer_generates = False
    prompt_padding_side = "left"  # positions count from each row's first attended token

    def generation_config(self, model, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, max_length=None,
                          epsilon_cutoff=0.0):
        return causal_generation_config(model, max_new_tokens, temperature, top_k, top_p, max_length, epsilon_cutoff)

    def sample(self, model, batch, generation_config, num_samples=1, with_greedy=False, keys=None):
        return sample_causal(model, batch["input_ids"], batch.get("attention_mask"), batch.get("labels"),
                             generation_config, num_samples, with_greedy, keys=keys)

    def sample_from_prefix(self, model, batch, prefix, generation_config, num_samples=1, with_greedy=False, keys=None):
        return sample_causal(model, batch["input_ids"], batch.get("attention_mask"), batch.get("labels"),
                             generation_config, num_samples, with_greedy, prefix_ids=prefix, keys=keys)

    def score(self, model, batch, sample_ids, num_samples, gold_labels=None, temperature=1.0,
              options=ScoreOptions()):
        """As `ModelFamily.score`, with the gold rows' values (`gold_logprobs`, and label smoothing's `raw_*`)
        `(B, L)` placed where `gold_labels` `(B, L)` (-100 on prompt and padding) hold the completion: position `t`
        predicts `gold_labels[:, t]`, zeros where it is -100."""
        scored = super().score(model, batch, sample_ids, num_samples, gold_labels, temperature, options)
        if gold_labels is not None:  # from the completion-ordered `(B, T)` values of the gold rows
            completion = completion_labels(gold_labels) != -100
            where = (gold_labels != -100).nonzero(as_tuple=True)
            for name in ("gold_logprobs", "raw_logprobs", "raw_logprob_sums"):
                values = getattr(scored, name)
                if values is not None:
                    placed = values.new_zeros(gold_labels.shape).index_put(where, values[completion])
                    setattr(scored, name, placed)
        return scored

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
        with eval_mode(model), torch.no_grad(), whole_for_decode(unwrap(model)):
            kwargs = beam_kwargs(model, num_beams, num_return, max_new_tokens, limits, offset=prompt_ids.shape[1])
            return generate_completions(model, prompt_ids, prompt_mask, **kwargs)

    def continue_from(self, model, batch, prefix, generation_config):
        prompt_ids, prompt_mask = append_prefix(*self.prompts(model, batch), prefix)
        ids, _ = generate_completions(model, prompt_ids, prompt_mask, generation_config=generation_config)
        ids = ids if prefix is None else torch.cat([prefix, ids], dim=1)
        return pad_after_eos(ids, eos_ids(model), pad_id(model))

    def encode(self, model, batch, in_forward=False):  # prompts are token ids, read inside every forward
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
