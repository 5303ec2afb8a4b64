"""Encoder-decoder models (`Seq2SeqFamily`): the rollout config, the decode's model calls, and the teacher-forced pass.

A rollout is one decode (`hf_seqrl.models.decoding`) of the `n` samples and, for SCST, the greedy row of every source:
the encoder and the cross-attention keys/values are computed once per source, then every row steps on its own KV
cache. The scoring pass (`ModelFamily.score`) is one teacher-forced forward through the
(possibly DDP-wrapped or FSDP2-sharded) model: the encoder runs once per source and its states are expanded to the
decoder rows by a forward pre-hook, so that gradients flow back through the expansion.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig
from transformers.modeling_outputs import BaseModelOutput

from .bans import token_ban_settings
from .beam import beam_kwargs
from .base import DecodeSettings, ModelFamily, eval_mode, prepared_attention_mask, quiet_length_warnings, unwrap
from .tokens import decoder_start_id, generated_targets, pad_id, shift_right
from .sharding import whole_for_decode
from .decoding import DecodeSteps, decode_loop, decode_rollout


def rollout_generation_config(
    model,
    max_new_tokens: int | None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    max_length: int | None = None,
    epsilon_cutoff: float = 0.0,
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
        epsilon_cutoff=epsilon_cutoff,
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


class EncoderDecoderSteps(DecodeSteps):
    """The decode's model calls for an encoder-decoder model.

    The first step is one forward of the whole model on the `B` sources with the decoder start token (and any forced
    prefix): the encoder runs once per source and the cross-attention keys/values are computed once per source; the
    KV cache (`EncoderDecoderCache`), the encoder states and the mask are then repeated to the `B * group` rows, whose
    first logits are the same. Every step calls the root module with the encoder states (`encoder_outputs`).
    """

    def __init__(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor, group: int, start_id: int,
                 prefix_ids: torch.Tensor | None = None):
        super().__init__(input_ids.shape[0], group, input_ids.device)
        self.model, self.input_ids, self.attention_mask = model, input_ids, attention_mask
        self.start = input_ids.new_full((input_ids.shape[0], 1), start_id)
        if prefix_ids is not None:
            self.start = torch.cat([self.start, prefix_ids], dim=1)

    def first(self) -> torch.Tensor:
        out = self.model(input_ids=self.input_ids, attention_mask=self.attention_mask, decoder_input_ids=self.start,
                         use_cache=True, return_dict=True)
        self.cache = out.cache
        self.cache.batch_repeat_interleave(self.group)
        self.encoder_states = out.encoder_last_hidden_state.repeat_interleave(self.group, dim=0)
        mask = self.attention_mask.repeat_interleave(self.group, dim=0)
        # The cross-attention mask, prepared once: without padding none is needed; with it, a 4D mask that the
        # decoder takes as is (a 2D one it would read on the host at every step).
        padded = not bool(mask.all())  # once per decode
        prepared = prepared_attention_mask(unwrap(self.model).get_decoder().config, mask,
                                           self.encoder_states.dtype) if padded else None
        self.attention_mask = prepared if prepared is not None else (mask if padded else None)
        return out.logits[:, -1].repeat_interleave(self.group, dim=0)

    def next(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.model(encoder_outputs=BaseModelOutput(last_hidden_state=self.encoder_states),
                         attention_mask=self.attention_mask, decoder_input_ids=tokens[:, None], cache=self.cache,
                         use_cache=True, return_dict=True)
        self.cache = out.cache
        return out.logits[:, -1]

    def keep(self, index: torch.Tensor) -> None:
        self.cache.batch_select_indices(index)
        self.encoder_states = self.encoder_states[index]
        if self.attention_mask is not None:
            self.attention_mask = self.attention_mask[index]


@torch.no_grad()
def decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, settings: DecodeSettings, group: int,
           greedy_first: bool, uniforms: torch.Tensor, prefix_ids: torch.Tensor | None = None,
           compact_below: float = 0.5) -> torch.Tensor:
    """Returns the decoded tokens of `group` rows per source (start token excluded, `pad_id` after a row's EOS):
    `decoding.decode_loop` over `EncoderDecoderSteps`.

    Args:
        model: an encoder-decoder `PreTrainedModel` (possibly sharded with FSDP2), in the mode to decode in.
        input_ids (`torch.LongTensor` of shape `(B, S)`), attention_mask (`(B, S)`): the sources.
        group (`int`): rows per source; with `greedy_first`, the first row of each group is greedy.
        uniforms (`torch.Tensor` of shape `(max_new_tokens, B*n)`): one uniform in (0, 1] per step and sample row
            (`n = group - greedy_first`).
        prefix_ids (`torch.LongTensor` of shape `(B, P)`, *optional*): tokens forced after the start token (read in
            the first forward); the returned tokens are the continuation only.
        compact_below (`float`): as in `decoding.decode_loop` (0 keeps every row in every forward).

    Returns: `torch.LongTensor` of shape `(B*group, T)`, `1 <= T <= max_new_tokens` (T = 1 when
    `max_new_tokens` is 0: a single pad column).
    """
    steps = EncoderDecoderSteps(model, input_ids, attention_mask, group, settings.start_id, prefix_ids)
    return decode_loop(steps, settings, greedy_first, uniforms, compact_below)


def teacher_forced(model, encoded: dict, targets: torch.Tensor, start_id: int, pad: int, group: int = 1,
                   output_hidden_states: bool = False):
    """Returns the output of one forward of the (possibly wrapped) model whose `logits[:, t]` score `targets[:, t]`
    `(B*group, T)` (-100 read as pad), the decoder reading `start_id` then the targets.

    The encoder's rows are one per source: a forward pre-hook repeats them `group` times where the decoder reads
    them, so that the encoder runs once per source and gradients flow back through the expansion to it.

    Args:
        encoded (`dict`): the sources (`input_ids`, `attention_mask`: the encoder runs inside this forward), or the
            encoder's output (`encoder_outputs`, `attention_mask`), one row per source.
    """
    def expand(module, args, kwargs):
        for key in ("encoder_hidden_states", "encoder_attention_mask"):
            if kwargs.get(key) is not None:
                kwargs[key] = kwargs[key].repeat_interleave(group, dim=0)
        return args, kwargs

    handle = unwrap(model).get_decoder().register_forward_pre_hook(expand, with_kwargs=True) if group > 1 else None
    try:
        return model(**encoded, decoder_input_ids=shift_right(targets, start_id, pad),
                     output_hidden_states=output_hidden_states, use_cache=False)
    finally:
        if handle is not None:
            handle.remove()


class Seq2SeqFamily(ModelFamily):
    """Encoder-decoder models: the source is the encoder's input; targets follow the decoder start token."""

    name, auto_class = "seq2seq", "AutoModelForSeq2SeqLM"

    def generation_config(self, model, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, max_length=None,
                          epsilon_cutoff=0.0):
        return rollout_generation_config(model, max_new_tokens, temperature, top_k, top_p, max_length=max_length,
                                         epsilon_cutoff=epsilon_cutoff)

    def sample(self, model, batch, generation_config, num_samples=1, with_greedy=False, keys=None):
        """Returns `num_samples` sampled sequences per source and, with `with_greedy`, the greedy decode: one decode
        of `B * (num_samples + with_greedy)` rows in eval mode, the encoder run once per source
        (`decoding.decode_rollout`). The samples follow the distribution `generate(do_sample=True)` samples from with
        the same config; the greedy rows are greedy `generate`'s tokens.

        Randomness: one `torch.rand((max_new_tokens, B * num_samples))` from the global RNG of the inputs' device,
        drawn at the start whatever the samples' lengths (nothing under a greedy config), so seeding before a rollout
        reproduces it. With `keys` `(B * num_samples,)` (`sampling.row_keys`) each sample row's uniforms are
        `sampling.keyed_uniforms` of its key instead: its tokens do not depend on the other rows of the decode."""
        return self.sample_from_prefix(model, batch, None, generation_config, num_samples, with_greedy, keys)

    @torch.no_grad()
    def sample_from_prefix(self, model, batch, prefix, generation_config, num_samples=1, with_greedy=False, keys=None):
        """As `sample`, every row starting with the forced target tokens `prefix` `(B, P)` read after the decoder start
        token (None: no prefix); the returned rows hold the prefix (mask true on it), then the continuation, whose
        length `generation_config.max_new_tokens` limits."""
        settings = DecodeSettings.from_generation_config(generation_config)
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        steps = EncoderDecoderSteps(model, ids, torch.ones_like(ids) if mask is None else mask,
                                    num_samples + int(with_greedy), settings.start_id, prefix)
        return decode_rollout(model, steps, settings, with_greedy, keys, prefix)

    def generate(self, model, batch, **generate_kwargs):
        with quiet_length_warnings():
            return model.generate(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                                  **generate_kwargs)

    def beam_search(self, model, batch, num_beams, num_return, max_new_tokens, limits=None):
        with eval_mode(model), torch.no_grad(), whole_for_decode(unwrap(model)):
            kwargs = beam_kwargs(model, num_beams, num_return, max_new_tokens, limits, offset=1)  # after the start
            return generated_targets(self.generate(model, batch, **kwargs), 1, model)

    def continue_from(self, model, batch, prefix, generation_config):
        forced = None if prefix is None else torch.cat(
            [prefix.new_full((prefix.shape[0], 1), decoder_start_id(model)), prefix], dim=1)
        with quiet_length_warnings():
            out = model.generate(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                                 generation_config=generation_config, decoder_input_ids=forced)
        return generated_targets(out, 1, model)

    def prompts(self, model, batch):
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
        return ids.masked_fill(~mask, pad_id(unwrap(model))), mask

    def encode(self, model, batch, in_forward=False):
        mask = batch.get("attention_mask")
        if in_forward:  # the root forward then runs the encoder (DDP's and FSDP2's hooks see one pass)
            return {"input_ids": batch["input_ids"], "attention_mask": mask}
        out = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=mask, return_dict=True)
        return {"encoder_outputs": BaseModelOutput(last_hidden_state=out.last_hidden_state), "attention_mask": mask}

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
        out = teacher_forced(model, encoded, targets, decoder_start_id(inner), pad_id(inner), group,
                             output_hidden_states)
        if output_hidden_states:
            out.hidden_states = out.decoder_hidden_states[-1]
        return out

    def input_embeddings(self, model):
        return model.get_decoder().get_input_embeddings()

    def label_start_id(self, model):
        return decoder_start_id(model)

    def structural_ids(self, model):
        return [decoder_start_id(model)]
