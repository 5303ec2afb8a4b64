"""Rollouts: sampled sequences and the greedy baseline (no grad), then their token log-probs (with grad).

One decode (`hf_seqrl.decoding`) yields the `n` samples and, for SCST, the greedy baseline row of every source:
the encoder runs once per source, greedy rows take the argmax, sample rows draw by inverse CDF
(`hf_seqrl.sampling`) from the distribution `generate(do_sample=True)` would sample from.
The log-prob pass is one teacher-forced forward through the (possibly DDP-wrapped) model: the encoder
runs once per source and its states are expanded to the decoder rows by a forward pre-hook, so
gradients flow back through the expansion.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from transformers import GenerationConfig

from . import losses
from .decoding import DecodeSettings, decode
from .sampling import draw_uniforms


@dataclass
class Rollout:
    """Sequences decoded for a batch of `B` sources.

    Attributes:
        sample_ids (`torch.LongTensor` of shape `(B*n, T)`): sampled tokens (decoder start token stripped),
            `pad_token_id` after EOS; the `n` samples of a source are contiguous.
        sample_mask (`torch.BoolTensor` of shape `(B*n, T)`): true up to and including each sample's EOS.
        greedy_ids (`torch.LongTensor` of shape `(B, T')` or None): greedy decode of each source.
        greedy_mask (`torch.BoolTensor` of shape `(B, T')` or None).
        num_samples (`int`): `n`.
    """

    sample_ids: torch.Tensor
    sample_mask: torch.Tensor
    greedy_ids: torch.Tensor | None
    greedy_mask: torch.Tensor | None
    num_samples: int


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


def rollout_generation_config(
    model,
    max_new_tokens: int | None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    max_length: int | None = None,
) -> GenerationConfig:
    """Returns a generation config that samples from the model's own distribution.

    Only structural tokens are kept from the model's generation config (start, EOS, pad, forced BOS/EOS);
    beam search, repetition penalties, n-gram blocking and minimum lengths are dropped: the log-probs of
    the policy gradient must be those of the distribution the samples were drawn from. Decoding always uses the
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


def _split_rows(ids: torch.Tensor, group: int, with_greedy: bool):
    if not with_greedy:
        return ids, None
    grouped = ids.view(-1, group, ids.shape[-1])
    return grouped[:, 1:].reshape(-1, ids.shape[-1]), grouped[:, 0]


@torch.no_grad()
def sample_rollout(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    generation_config: GenerationConfig,
    num_samples: int = 1,
    with_greedy: bool = False,
) -> Rollout:
    """Returns `num_samples` sampled sequences per source and, if `with_greedy`, the greedy decode.

    Decoding runs in eval mode (no dropout), in one decode of `B * (num_samples + with_greedy)` rows
    (`hf_seqrl.decoding.decode`). The samples follow the distribution `generate(do_sample=True)` samples from
    with the same config; the greedy rows are the tokens of greedy `generate`.

    Randomness: one `torch.rand((max_new_tokens, B * num_samples))` from the global RNG of the inputs' device,
    drawn at the start whatever the samples' lengths. Seeding before a rollout reproduces it, and consecutive
    rollouts draw fresh uniforms.

    Args:
        model: an unwrapped encoder-decoder `PreTrainedModel` (FSDP2-sharded models included).
        input_ids (`torch.LongTensor` of shape `(B, S)`), attention_mask (`(B, S)`): the sources.
        generation_config: from `rollout_generation_config`.
    """
    return _decoded_rollout(model, input_ids, attention_mask, generation_config, num_samples, with_greedy)


def _decoded_rollout(model, input_ids, attention_mask, generation_config, num_samples, with_greedy,
                     prefix_ids: torch.Tensor | None = None) -> Rollout:
    """Returns the `Rollout` of one decode of every row in eval mode; with `prefix_ids` `(B, P)`, each row holds
    the forced prefix then its continuation (mask true on the prefix)."""
    settings = DecodeSettings.from_generation_config(generation_config)
    group = num_samples + int(with_greedy)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    uniforms = draw_uniforms(settings.max_new_tokens, input_ids.shape[0] * num_samples, input_ids.device)
    was_training = model.training
    model.eval()
    try:
        ids = decode(model, input_ids, attention_mask, settings, group, with_greedy, uniforms, prefix_ids)
    finally:
        model.train(was_training)
    mask = completion_mask(ids, list(settings.eos_ids))
    ids = ids.masked_fill(~mask, settings.pad_id)
    if prefix_ids is not None:
        prefix = prefix_ids.repeat_interleave(group, dim=0)
        ids = torch.cat([prefix, ids], dim=1)
        mask = torch.cat([torch.ones_like(prefix, dtype=torch.bool), mask], dim=1)
    sample_ids, greedy_ids = _split_rows(ids, group, with_greedy)
    sample_mask, greedy_mask = _split_rows(mask, group, with_greedy)
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
    return _decoded_rollout(model, input_ids, attention_mask, generation_config, num_samples, with_greedy, prefix_ids)


@contextlib.contextmanager
def expand_encoder_states(model, repeats: int):
    """Within the context, the decoder of `model` sees every encoder row repeated `repeats` times.

    The encoder thus runs once per source while the decoder scores `repeats` sequences per source;
    gradients flow back through the expansion to the encoder.
    """
    inner = model.module if hasattr(model, "module") else model
    decoder = inner.get_decoder()

    def hook(module, args, kwargs):
        for key in ("encoder_hidden_states", "encoder_attention_mask"):
            value = kwargs.get(key)
            if value is not None:
                kwargs[key] = value.repeat_interleave(repeats, dim=0)
        return args, kwargs

    handle = decoder.register_forward_pre_hook(hook, with_kwargs=True) if repeats > 1 else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


def shift_right(labels: torch.Tensor, start_id: int, pad: int) -> torch.Tensor:
    """Returns decoder inputs for `labels`: the start token, then labels[:-1], with -100 replaced by pad.

    Args:
        labels (`torch.LongTensor` of shape `(N, T)`).
    """
    shifted = labels.new_full(labels.shape, pad)
    shifted[:, 0] = start_id
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == -100, pad)


def _pad_to(x: torch.Tensor, length: int, value: int) -> torch.Tensor:
    if x.shape[1] >= length:
        return x
    return torch.nn.functional.pad(x, (0, length - x.shape[1]), value=value)


@dataclass
class ScoredRollout:
    """Output of the teacher-forced pass over a rollout.

    Attributes:
        sample_logits (`torch.Tensor` of shape `(B, n, T, V)`): decoder logits at the sampled positions (a view of
            the forward's logits; `sample_logits[b, j]` belongs to row `b * n + j` of the samples).
        token_logprobs (`torch.Tensor` of shape `(B*n, T)`): log-prob of each sampled token (with grad).
        gold_logits (`torch.Tensor` of shape `(B, T_gold, V)` or None): logits of the gold rows.
        gold_logprobs (`torch.Tensor` of shape `(B, T_gold)` or None): log-prob of each gold token at temperature 1
            (with grad; any value where the label is -100), from the same pass as `token_logprobs`. None where
            the family computes only `gold_logits`.
    """

    sample_logits: torch.Tensor
    token_logprobs: torch.Tensor
    gold_logits: torch.Tensor | None
    gold_logprobs: torch.Tensor | None = None


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
) -> ScoredRollout:
    """Returns token log-probs of the sampled sequences (with grad) in one teacher-forced forward.

    The encoder runs once per source; the decoder scores the `n` samples of each source and, if
    `gold_labels` is given, the gold target too (for the mixed cross-entropy term). The log-probs of the samples
    (at `temperature`) and of the gold tokens (at temperature 1) come from one pass over the logits.

    Args:
        model: the (possibly DDP-wrapped or FSDP2-sharded) encoder-decoder model.
        input_ids (`torch.LongTensor` of shape `(B, S)`), attention_mask (`(B, S)`): the sources.
        sample_ids (`torch.LongTensor` of shape `(B*n, T)`): sampled tokens, pad after EOS.
        gold_labels (`torch.LongTensor` of shape `(B, T_gold)`, -100 at padding) or None.
    """
    batch = input_ids.shape[0]
    t_sample = sample_ids.shape[1]
    rows = sample_ids.view(batch, num_samples, t_sample)
    group = num_samples
    if gold_labels is not None:
        length = max(t_sample, gold_labels.shape[1])
        rows = _pad_to(rows.flatten(0, 1), length, pad).view(batch, num_samples, length)
        gold = _pad_to(gold_labels, length, -100).unsqueeze(1)
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
    sample_logits = logits[:, :num_samples, :t_sample]  # a view: the scoring reads the logits in place
    if gold_labels is None:
        token_logprobs = losses.token_logprobs_from_logits(sample_logits, sample_ids, temperature)
        return ScoredRollout(sample_logits, token_logprobs, None)
    # One pass over every row, the gold row of each source at temperature 1.
    row_temperature = logits.new_full((group, 1), temperature, dtype=torch.float32)
    row_temperature[num_samples] = 1.0
    logprobs = losses.token_logprobs_from_logits(logits, rows, row_temperature)
    t_gold = gold_labels.shape[1]
    return ScoredRollout(sample_logits, logprobs[:, :num_samples, :t_sample].flatten(0, 1),
                         logits[:, num_samples, :t_gold], logprobs[:, num_samples, :t_gold])
