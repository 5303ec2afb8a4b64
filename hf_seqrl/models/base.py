"""The model-family layer's shared part: the `ModelFamily` protocol, the settings the decode loop reads
(`DecodeSettings`), and the model-state helpers both families and the trainers use (eval mode, dropout off, a
forward's random state replayed). The EOS / pad / mask helpers live in `hf_seqrl.models.tokens`, the scoring pass
behind `ModelFamily.score` in `hf_seqrl.models.scoring`.

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

from ..functional.output_layer import Positions
from ..types import Rollout, ScoredRollout
from .bans import TokenBans
from .scoring import ScoreOptions, score_targets, target_positions
from .tokens import pad_columns, pad_id


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
               "sequence_bias": None, "min_p": None, "top_h": None, "typical_p": 1.0,
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
    epsilon_cutoff: float = 0.0
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
                   epsilon_cutoff=float(getattr(config, "epsilon_cutoff", 0.0) or 0.0),
                   forced_bos_id=config.forced_bos_token_id, forced_eos_id=forced_eos,
                   bans=TokenBans.from_generation_config(config))


class ModelFamily:
    """The interface; see the module docstring for its coordinates. Methods take unwrapped models unless noted."""

    name: str = ""
    auto_class: str = ""  # the transformers Auto class that loads a trained model of this family
    # Whether `Seq2SeqTrainer.prediction_step`'s own generation reads this family's batches right (a causal batch holds
    # prompt + completion, which it would continue; the trainers then generate through `generate`).
    trainer_generates: bool = True
    # Where `join_prompts` pads sources/prompts: where padding leaves the other tokens' positions as they are.
    prompt_padding_side: str = "right"

    def generation_config(self, model, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, max_length=None,
                          epsilon_cutoff=0.0):
        """Returns the `GenerationConfig` of rollouts: the model's own distribution (warped by `temperature`,
        `top_k`, `top_p`, `epsilon_cutoff`), structural tokens and the model's single-token bans (`TokenBans`)
        only."""
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
