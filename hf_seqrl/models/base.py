"""The model-family layer's shared part: the `ModelFamily` protocol, the EOS / pad / mask helpers
and the pieces of the decode loop both families share.

Trainers, rollouts and diagnostics call a `ModelFamily` (`hf_seqrl.models.family_for(model)`) and never branch on the
model type. A family knows how a source (seq2seq) or prompt (causal) is read from a batch, how samples and the greedy
row are decoded, how decoding continues from a given prefix, and which logits score given target tokens.

Coordinates. Every method speaks in *target* coordinates: `targets[:, t]` is the t-th token the model writes (a
seq2seq label, a causal completion token), and `logits[:, t]` its distribution given the source/prompt and
`targets[:, :t]`. A batch is the dict the collator yields (`input_ids`, `attention_mask`, and `labels` when the
dataset has them); a causal row holds prompt + completion with `labels` = -100 on the prompt. A *group* is the rows
decoded or scored for one source: its `num_samples` samples, plus the greedy row or the gold row where there is one.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

import torch
from torch.distributed.fsdp import FSDPModule
from transformers import GenerationConfig

from ..functional.lm_head import Divergence, Positions, position_stats
from ..types import Rollout, ScoredRollout
from .bans import TokenBans
from .heads import handing_hidden


def is_sharded(model) -> bool:
    """Returns whether `model` (unwrapped) holds parameters sharded across processes (FSDP2, ZeRO-3): gathered only
    inside its forward."""
    return any(isinstance(m, FSDPModule) for m in model.modules()) or any(
        hasattr(p, "ds_id") for p in model.parameters())


def unwrap(model):
    """Returns the model inside a DDP wrapper (`model.module`), or `model` itself."""
    return model.module if hasattr(model, "module") else model


@contextlib.contextmanager
def eval_mode(model):
    """Within the context, `model` is in eval mode (no dropout); its previous mode is restored on exit."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


class _LengthWarnings:
    """A logging filter that drops transformers' "Both `max_new_tokens` ... and `max_length` ... seem to have been
    set" warning."""

    def filter(self, record) -> bool:
        return "seem to have been set" not in record.getMessage()


@contextlib.contextmanager
def quiet_length_warnings():
    """Within the context, `generate` does not warn that both `max_new_tokens` and `max_length` are set: the project
    sets `max_new_tokens` on purpose over a checkpoint's `max_length` (opus-mt's 512), which `generate` then warns of
    at every call."""
    import logging

    logger, quiet = logging.getLogger("transformers.generation.utils"), _LengthWarnings()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def prepared_attention_mask(config, keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """Returns the 4D mask `(N, 1, 1, K)` that one query's attention over keys `keep` `(N, K)` (bool, true = attend)
    reads under the attention implementation of `config`, as transformers' mask utilities build it (`sdpa`: bool;
    `eager`: 0 where attended, `finfo(dtype).min` elsewhere); None where the implementation is another, or the config
    adds a pattern of its own (a sliding window): the model then builds its mask itself.

    Handed a prepared mask, transformers returns it as is, where a 2D one is first read on the host (whether it has
    padding at all): one sync per forward of a decode step."""
    impl = getattr(config, "_attn_implementation", None)
    sliding = getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
    layer_types = getattr(config, "layer_types", None) or ()
    if sliding or any(kind != "full_attention" for kind in layer_types) or impl not in ("sdpa", "eager"):
        return None
    keep = keep.bool()[:, None, None, :]
    if impl == "sdpa":
        return keep
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)


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


def decode_budget(config: GenerationConfig, minimum: int = 1) -> int:
    """Returns the tokens a decode under `config` may write, EOS included: its `max_new_tokens`, else its `max_length`
    less the decoder start token that `generate` counts in it (20 when neither is set); at least `minimum`."""
    if config.max_new_tokens is not None:
        budget = config.max_new_tokens
    else:
        budget = (config.max_length if config.max_length is not None else 20) - 1
    return max(int(budget), minimum)


# Generation settings that add logits processors the decode loop does not implement, with their neutral values.
UNSUPPORTED = {"num_beams": 1, "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0,
               "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": 0,
               "sequence_bias": None, "min_p": None, "top_h": None, "typical_p": 1.0, "epsilon_cutoff": 0.0,
               "eta_cutoff": 0.0, "guidance_scale": 1.0, "exponential_decay_length_penalty": None,
               "watermarking_config": None}


@dataclass(frozen=True)
class DecodeSettings:
    """What the decode loop reads from a `GenerationConfig` (see `DecodeSettings.from_generation_config`)."""

    start_id: int | None  # the decoder start token (None for decoder-only models)
    pad_id: int
    eos_ids: tuple[int, ...]
    max_new_tokens: int
    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    forced_bos_id: int | None = None
    forced_eos_id: int | None = None
    bans: TokenBans = TokenBans()  # masked before every choice, greedy rows included

    @classmethod
    def from_generation_config(cls, config: GenerationConfig) -> "DecodeSettings":
        """Returns the settings of `config` (from `rollout_generation_config`); raises on settings that would add
        logits processors the loop does not implement, and on bans that are no logit mask."""
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
        start = config.decoder_start_token_id
        return cls(start_id=None if start is None else int(start), pad_id=int(config.pad_token_id), eos_ids=eos,
                   max_new_tokens=decode_budget(config, minimum=0), do_sample=bool(config.do_sample),
                   temperature=1.0 if config.temperature is None else float(config.temperature),
                   top_k=int(config.top_k or 0), top_p=1.0 if config.top_p is None else float(config.top_p),
                   forced_bos_id=config.forced_bos_token_id, forced_eos_id=forced_eos,
                   bans=TokenBans.from_generation_config(config))


@dataclass(frozen=True)
class ScoreOptions:
    """What a scoring pass computes besides the token log-probs (each costs one more reduction per chunk).

    Attributes:
        reference (`Positions`, *optional*): a frozen model's output-layer inputs at the sampled positions
            (`ModelFamily.reference_positions`); gives `ScoredRollout.kl`.
        entropy_grad (`bool`): the entropy carries grad (an entropy bonus), else it is a detached metric.
        plain (`bool`): the samples' log-probs at temperature 1 too. raw (`bool`): label smoothing's terms.
        divergence (`Divergence`, *optional*): a teacher's output-layer inputs at the sampled positions, the
            interpolation and temperature of the divergence to it; gives `ScoredRollout.divergence`.
    """

    reference: Positions | None = None
    entropy_grad: bool = False
    plain: bool = False
    raw: bool = False
    divergence: Divergence | None = None


class ModelFamily:
    """The interface; see the module docstring for its coordinates. Methods take unwrapped models unless noted."""

    name: str = ""
    auto_class: str = ""  # the transformers Auto class that loads a trained model of this family
    # Whether `Seq2SeqTrainer.prediction_step`'s own generation reads this family's batches right (a causal batch holds
    # prompt + completion, which it would continue; the trainers then generate through `generate`).
    trainer_generates: bool = True
    # Where `join_prompts` pads sources/prompts: where padding leaves the other tokens' positions as they are.
    prompt_padding_side: str = "right"

    def generation_config(self, model, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, max_length=None):
        """Returns the `GenerationConfig` of rollouts: the model's own distribution, structural tokens and the
        model's single-token bans (`TokenBans`) only."""
        raise NotImplementedError

    def sample(self, model, batch: dict, generation_config, num_samples: int = 1, with_greedy: bool = False,
               keys: torch.Tensor | None = None) -> Rollout:
        """Returns `num_samples` samples per source and, with `with_greedy`, its greedy decode (in one decode; the
        encoder runs once per source, a long prompt is read once). `keys` `(B*n,)` (`sampling.row_keys`) make each
        sample row's draws a function of its key (`sampling.keyed_uniforms`); without them the global RNG draws."""
        raise NotImplementedError

    def join_prompts(self, model, batches: list[dict]) -> dict:
        """Returns one batch whose `sample` decodes the sources/prompts of `batches` in order (the tokens of each
        row as its own batch gives them): their `prompts`, padded to one width on `prompt_padding_side`."""
        parts = [self.prompts(model, batch) for batch in batches]
        width = max(ids.shape[1] for ids, _ in parts)
        pad, side = pad_id(unwrap(model)), self.prompt_padding_side
        ids = torch.cat([pad_columns(ids, width, pad, side) for ids, _ in parts])
        mask = torch.cat([pad_columns(mask.long(), width, 0, side) for _, mask in parts])
        return {"input_ids": ids, "attention_mask": mask}

    def beam_search(self, model, batch: dict, num_beams: int, num_return: int, max_new_tokens: int,
                    limits: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns `(ids (B*num_return, T), mask)`: the `num_return` best hypotheses of `generate`'s beam search of
        width `num_beams` per source, contiguous per source, in target coordinates, pad after EOS; with `limits`
        `(B,)`, each source's hypotheses end by its limit (`beam.EOSAtLengthLimit`)."""
        raise NotImplementedError

    def sample_from_prefix(self, model, batch: dict, prefix, generation_config, num_samples: int = 1,
                           with_greedy: bool = False, keys: torch.Tensor | None = None) -> Rollout:
        """Returns what `sample` returns, every row starting with the forced target tokens `prefix` `(B, P)` (held
        in the returned ids, mask true on them)."""
        raise NotImplementedError

    def score(self, model, batch: dict, sample_ids, num_samples: int, gold_labels=None, temperature: float = 1.0,
              options: ScoreOptions = ScoreOptions()) -> ScoredRollout:
        """Returns the token log-probs (with grad) of `sample_ids` `(B*n, T)` under the (possibly wrapped) model,
        the tokens that `generation_config(model, ...)` bans out of the softmax, their entropy (and what `options`
        asks); `gold_logprobs` is aligned with `gold_labels` (the batch's `labels`) when they are given.

        One `target_forward` over the samples and the gold rows of every source, the sources encoded inside it
        (`encode(..., in_forward=True)`), then `score_targets`."""
        inner = unwrap(model)
        # The bans of the rollout config this family builds from the model's generation config.
        bans = TokenBans.from_generation_config(self.generation_config(inner, None))
        encoded = self.encode(inner, batch, in_forward=True)
        gold = None if gold_labels is None else self.target_labels({"labels": gold_labels})
        return score_targets(lambda targets, group: self.target_forward(model, encoded, targets, group), inner,
                             sample_ids, num_samples, gold, pad_id(inner), temperature, bans, options)

    def reference_positions(self, model, batch: dict, sample_ids, num_samples: int) -> Positions:
        """Returns a frozen (possibly wrapped or sharded) model's output-layer inputs at the positions of `sample_ids`
        `(B*n, T)`, for `ScoreOptions.reference` (run it under `torch.no_grad()`)."""
        inner = unwrap(model)
        encoded = self.encode(inner, batch, in_forward=True)
        return target_positions(lambda targets, group: self.target_forward(model, encoded, targets, group), inner,
                                sample_ids, num_samples, copy=is_sharded(inner))

    def generate(self, model, batch: dict, **generate_kwargs):
        """Returns `model.generate`'s output for the sources/prompts of `batch`, target tokens only for causal
        models (the seq2seq output keeps its decoder start token, as `generate` returns it)."""
        raise NotImplementedError

    def continue_from(self, model, batch: dict, prefix, generation_config):
        """Returns `(ids (N, T), mask (N, T))`: greedy/sampled targets that start with `prefix` `(N, k)` (pad after
        EOS, mask true up to and including it)."""
        raise NotImplementedError

    def prompts(self, model, batch: dict):
        """Returns the sources (seq2seq) or prompts (causal) of `batch`: ids `(B, P)`, pad where masked, and their
        mask `(B, P)`."""
        raise NotImplementedError

    def encode(self, model, batch: dict, in_forward: bool = False):
        """Returns what every pass over `batch` reads (seq2seq: the encoder output, with grad when enabled); with
        `in_forward`, what lets the next `target_forward` encode the sources itself, inside the model's own forward
        (as DDP and FSDP2 want a single pass over a batch to run; for `target_forward` only)."""
        raise NotImplementedError

    def rotate(self, encoded, shifts: int = -1):
        """Returns `encoded` with its sources rolled by `shifts` rows (each target then reads another source)."""
        raise NotImplementedError

    def select(self, encoded, index: torch.Tensor | None):
        """Returns `encoded` with its rows gathered by `index` `(N,)` (row i reads source `index[i]`; gradients flow
        back to the gathered rows); `None` returns it unchanged."""
        raise NotImplementedError

    def detach(self, encoded):
        """Returns `encoded` cut from the graph (what no-grad passes over the same sources read)."""
        raise NotImplementedError

    def target_labels(self, batch: dict) -> torch.Tensor:
        """Returns the gold targets of a batch in target coordinates, `(B, T)`, -100 after each row's last token."""
        raise NotImplementedError

    def target_forward(self, model, encoded, targets, group: int = 1, output_hidden_states: bool = False):
        """Returns the model output whose `logits[:, t]` `(N, T, V)` score `targets[:, t]` `(B*group, T)` (the
        teacher-forced pass; -100 read as pad) and, when asked, `hidden_states` `(N, T, d)`: the last layer at the
        same positions, position t reading the input that precedes `targets[:, t]`."""
        raise NotImplementedError

    def input_embeddings(self, model):
        """Returns the embedding module whose output feeds the target positions (perturbed by the diagnostics)."""
        return model.get_input_embeddings()

    def target_offset(self, encoded) -> int:
        """Returns the position in the embedded rows of target position 0's input."""
        return 0

    def label_start_id(self, model) -> int | None:
        """Returns the token that tokenized labels must not start with (the decoder start token), or None."""
        return None

    def structural_ids(self, model) -> list[int]:
        """Returns token ids that start a target without being part of it (never an injected mistake)."""
        return []


# Module attributes that hold a dropout probability read at forward time (BART / Marian `dropout`,
# `activation_dropout`, attention `dropout`, Llama / Qwen2 `attention_dropout`, `layerdrop`), besides `nn.Dropout`.
DROPOUT_ATTRIBUTE = re.compile(r"(^|_)(dropout|layerdrop)(_rate|_prob|_p)?$")


def _flat_positions(batch: int, group: int, length: int, rows: range, width: int, device) -> tuple:
    """Returns the flat indices `(batch*len(rows)*width,)` of rows `rows` of each group, positions `< width`, in a
    `(batch, group, length)` layout, and each one's position."""
    b = torch.arange(batch, device=device).view(-1, 1, 1) * group * length
    r = torch.arange(rows.start, rows.stop, device=device).view(1, -1, 1) * length
    t = torch.arange(width, device=device).view(1, 1, -1)
    return (b + r + t).flatten(), t.expand(batch, len(rows), width).flatten()


def score_targets(forward, model, sample_ids: torch.Tensor, num_samples: int, gold: torch.Tensor | None, pad: int,
                  temperature: float = 1.0, bans: TokenBans | None = None,
                  options: ScoreOptions = ScoreOptions()) -> ScoredRollout:
    """Returns the scoring pass over the `n` samples of every source and, with `gold`, its gold row: one forward
    over all of them, the output layer's inputs reduced a slice of the vocabulary at a time (`position_stats`, inside
    the forward) into the samples' log-probs (at `temperature`), entropy (and KL, ...: `options`) and the gold tokens'
    log-probs (at temperature 1), all under `bans` (banned tokens out of the softmax).

    Args:
        forward: `forward(targets, group)` runs the teacher-forced pass of `targets` `(B*group, L)` (-100 read as
            pad), `group` rows per source, and returns its output (a family's `target_forward`).
        model: the unwrapped model `forward` runs (its output layer, `hf_seqrl.models.heads`).
        sample_ids (`torch.LongTensor` of shape `(B*n, T)`): sampled tokens, pad after EOS.
        gold (`torch.LongTensor` of shape `(B, T_gold)`, -100 after each row's last token, *optional*): gold targets;
            the returned gold log-probs `(B, T_gold)` are aligned with them.
    """
    batch, t_sample = sample_ids.shape[0] // num_samples, sample_ids.shape[1]
    rows, group = sample_ids.view(batch, num_samples, t_sample), num_samples
    if gold is not None:
        length = max(t_sample, gold.shape[1])
        rows = right_pad(rows.flatten(0, 1), length, pad).view(batch, num_samples, length)
        rows = torch.cat([rows, right_pad(gold, length, -100).unsqueeze(1)], dim=1)
        group += 1
    length, device = rows.shape[2], sample_ids.device
    out = {}

    def reduce(positions: Positions):
        banned = None if bans is None else bans.mask(length, positions.vocab_size, device)
        where, at = _flat_positions(batch, group, length, range(num_samples), t_sample, device)
        samples = position_stats(positions.take(where), sample_ids.flatten(), temperature, banned, at,
                                 reference=options.reference, entropy=True, entropy_grad=options.entropy_grad,
                                 plain=options.plain, raw=options.raw and gold is None, divergence=options.divergence)
        out["samples"], out["vocab_size"] = samples, positions.vocab_size
        if gold is not None:
            where, at = _flat_positions(batch, group, length, range(num_samples, group), gold.shape[1], device)
            out["gold"] = position_stats(positions.take(where), gold.flatten(), 1.0, banned, at, raw=options.raw)

    def receive(hidden, layer):  # inside the forward: a sharded model holds its output layer gathered here
        reduce(Positions(hidden.reshape(-1, hidden.shape[-1]), layer))
        return out["samples"].logprobs[:1].sum()

    with handing_hidden(model, receive) as known:
        output = forward(rows.flatten(0, 1), group)
    tie = 0.0
    if not known:
        reduce(Positions(logits=output.logits.reshape(-1, output.logits.shape[-1])))
    elif output.logits.requires_grad:
        # The forward's placeholder logits join the loss (times 0), so that a backward passes through the output
        # module's output: ZeRO-3 gathers the module's weight there, before the chunks' backward reads it.
        tie = output.logits.sum() * 0
    samples, gold_stats = out["samples"], out.get("gold")
    shape = sample_ids.shape
    view = (lambda x, like=shape: None if x is None else x.view(like))
    raw = gold_stats if gold is not None else samples
    raw_shape = shape if gold is None else gold.shape
    return ScoredRollout(
        token_logprobs=samples.logprobs.view(shape) + tie, entropy=samples.entropy.view(shape), kl=view(samples.kl),
        plain_logprobs=view(samples.plain_logprobs), divergence=view(samples.divergence),
        gold_logprobs=None if gold_stats is None else gold_stats.logprobs.view(gold.shape),
        raw_logprobs=view(raw.raw_logprobs, raw_shape), raw_logprob_sums=view(raw.raw_logprob_sums, raw_shape),
        vocab_size=out["vocab_size"])


def label_logprobs(forward, model, labels: torch.Tensor, rows: slice | None = None):
    """Returns `(output, logprobs, logprob_sums, vocab_size)`: the output of `forward()` (a teacher-forced pass whose
    `logits[:, t]` score `labels[:, t]`), the log-probs at temperature 1 of `labels` `(N', T)` (any value where -100)
    at its rows `rows` (all by default), and their `sum_v log p(v)` (label smoothing's term), no bans: the
    cross-entropy's terms, reduced chunk by chunk (`position_stats`) as the scoring pass does."""
    out = {}

    def reduce(positions: Positions, width: int):
        grid = torch.arange(len(positions), device=labels.device).view(-1, width)
        where = (grid if rows is None else grid[rows])[:, :labels.shape[1]].flatten()
        stats = position_stats(positions.take(where), labels.flatten(), raw=True)
        out["stats"], out["vocab_size"] = stats, positions.vocab_size
        return stats.raw_logprobs[:1].sum()

    with handing_hidden(model, lambda hidden, layer: reduce(
            Positions(hidden.reshape(-1, hidden.shape[-1]), layer), hidden.shape[-2])) as known:
        output = forward()
    tie = 0.0
    if not known:
        logits = output.logits
        reduce(Positions(logits=logits.reshape(-1, logits.shape[-1])), logits.shape[-2])
    elif output.logits.requires_grad:
        tie = output.logits.sum() * 0  # as in `score_targets`: the backward passes the output module's output
    stats = out["stats"]
    return (output, stats.raw_logprobs.view(labels.shape) + tie, stats.raw_logprob_sums.view(labels.shape),
            out["vocab_size"])


def target_positions(forward, model, sample_ids: torch.Tensor, num_samples: int, copy: bool) -> Positions:
    """Returns a frozen model's output-layer inputs at every position of `sample_ids` `(B*n, T)` (`B*n*T` of them,
    row-major): one teacher-forced pass (`forward(targets, group)`), for the KL of a later scoring pass; with `copy`,
    the output layer's tensors are copied (a sharded model frees its gathered weights after the forward)."""
    out = {}

    def receive(hidden, layer):
        out["positions"] = Positions(hidden.reshape(-1, hidden.shape[-1]).detach(), layer.frozen(copy))

    with handing_hidden(model, receive) as known:
        output = forward(sample_ids, num_samples)
    if not known:
        return Positions(logits=output.logits.reshape(-1, output.logits.shape[-1]).detach())
    return out["positions"]


def disable_dropout(model) -> int:
    """Sets every dropout probability of `model` to 0 (in place) and returns how many it changed: `nn.Dropout`
    modules (LoRA's included) and the float rates that modules read at forward time. The config is left as it is,
    so a saved model keeps its dropout."""
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            changed += module.p != 0
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if isinstance(value, float) and DROPOUT_ATTRIBUTE.search(name):
                changed += value != 0
                setattr(module, name, 0.0)
    return changed


def rng_state(device: torch.device) -> tuple:
    """Returns the state of the RNGs a forward on `device` draws from (the CPU's, and the device's own)."""
    device = torch.device(device)
    own = torch.get_device_module(device.type).get_rng_state(device) if device.type not in ("cpu", "meta") else None
    return torch.get_rng_state(), own


@contextlib.contextmanager
def replayed_rng(state: tuple, device: torch.device):
    """Within the context, the RNGs draw what they drew after `rng_state(device)` returned `state` (the same dropout
    masks as that forward's); outside it they are left as they were."""
    device = torch.device(device)
    cpu, own = state
    devices = [device] if own is not None else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if own is not None else "cuda"):
        torch.set_rng_state(cpu)
        if own is not None:
            torch.get_device_module(device.type).set_rng_state(own, device)
        yield
