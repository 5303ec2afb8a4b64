"""A model's output layer, recognized by what its forward computes, and a forward that hands the layer's input to the
scoring pass instead of computing every position's logits (`hf_seqrl.functional.lm_head` reduces the vocabulary
slice by slice).

The output module is `model.get_output_embeddings()`: the `Linear` that makes the logits (BERT's decoder `Linear`,
after the transform that runs before it as part of the forward; T5's, after the rescale of tied embeddings). What the
forward does with that module's result is checked once per model instance (`head_of`): a forward of a few tokens
(eval mode, no grad, no autocast) in which the module returns its logits plus fixed noise, so that a soft cap or a
scale shows whatever the weights. Each candidate `OutputLayer` computes the logits from the module's input and the
same noise: the `Linear` alone; plus a bias buffer of the model (Marian / BART's `final_logits_bias`); times the
config's `logit_scale` or over its `logits_scaling`; soft-capped at its `final_logit_softcapping`. The fullest
candidate equal to the forward's own logits (to a few units of rounding) is the model's head; a model that none
matches, whose output module is not a plain `Linear` (an adapter on it), has forward hooks, or is sharded on its
own takes the whole logits from its forward, with one warning naming why.

Inside `handing_hidden(model, receive)`, the model's output module does not multiply: it calls `receive(hidden,
layer)` with its input `(..., d)` and the `OutputLayer`, then returns a width-1 placeholder, so what the forward adds
or caps after it costs nothing. The call happens inside the model's own forward, where a sharded model (FSDP2, ZeRO-3)
holds its output weights gathered and autograd sees them as the forward's. The check's forward runs where the first
scoring pass over the model does, on every rank alike, so a sharded model gathers for it as for any forward.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import logging
import weakref
from dataclasses import dataclass

import torch
from torch.distributed.fsdp import FSDPModule

from ..functional.output_layer import OutputLayer

logger = logging.getLogger(__name__)

PROBE_TOKENS = 4  # the check forward's source / prompt and decoder input, one row each
PROBE_NOISE = 4.0  # the standard deviation of the noise added to the output module's logits in the check
PROBE_ROUNDING = 16  # a candidate matches within this many units of rounding of the largest logit

_whole = contextvars.ContextVar("whole_logits", default=False)
_checking = contextvars.ContextVar("checking_head", default=False)
_heads: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (output module, Head or why not)
_warned: set[str] = set()


@dataclass(frozen=True)
class Head:
    """What a model's forward does after its output `Linear`: adds the buffer `bias_name` (its dotted name in the
    model), multiplies by `scale`, soft-caps at `softcap` (`OutputLayer.activate`)."""

    bias_name: str | None = None
    scale: float = 1.0
    softcap: float | None = None

    def size(self) -> int:
        return (self.bias_name is not None) + (self.scale != 1.0) + (self.softcap is not None)


@contextlib.contextmanager
def whole_logits(on: bool = True):
    """Within the context (with `on`), the scoring pass takes the whole logits from the forward of every model, with no
    warning: the arm that benchmarks and tests compare the chunked pass with."""
    token = _whole.set(on)
    try:
        yield
    finally:
        _whole.reset(token)


def checking_head() -> bool:
    """Returns True inside the check forward that recognizes a model's head: counters of a run's decoder positions or
    forwards leave it out (it runs once per model, at its first scoring pass)."""
    return _checking.get()


def _config_number(model, field: str) -> float | None:
    """Returns the number `field` of the model's config (or its decoder's text config), None where unset or 0."""
    configs = [model.config]
    text_config = getattr(model.config, "get_text_config", None)
    if text_config is not None:
        with contextlib.suppress(Exception):
            configs.append(text_config(decoder=True))
    for config in configs:
        value = getattr(config, field, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value:
            return float(value)
    return None


def candidates(model, module) -> list[Head]:
    """Returns the heads the scoring pass can compute for `model` whose output `Linear` is `module`, fullest first:
    its floating bias buffers of one value per token, its config's scale and soft cap, each present or not."""
    vocab, own = module.out_features, {id(b) for b in module.buffers()}
    biases = [None] + [name for name, buffer in model.named_buffers() if "bias" in name.rsplit(".", 1)[-1]
                       and buffer.is_floating_point() and buffer.numel() == vocab and id(buffer) not in own]
    scales = [1.0]
    for field, invert in (("logit_scale", False), ("logits_scaling", True)):  # Cohere's product, Granite's quotient
        value = _config_number(model, field)
        if value is not None and value != 1.0:
            scales.append(1.0 / value if invert else value)
    softcap = _config_number(model, "final_logit_softcapping")  # Gemma 2 / 3
    softcaps = [None] if softcap is None else [None, softcap]
    heads = {Head(b, s, c) for b, s, c in itertools.product(biases, scales, softcaps)}
    return sorted(heads, key=lambda head: (-head.size(), str(head)))


def _buffer_owner(model, name: str):
    """Returns `(module, local name)` of the buffer `name` (dotted) of `model`."""
    prefix, _, local = name.rpartition(".")
    return (model.get_submodule(prefix) if prefix else model), local


def _bias_buffer(model, name: str | None):
    """Returns the buffer `name` (dotted) of `model`, or None for `name` None."""
    if name is None:
        return None
    owner, local = _buffer_owner(model, name)
    return owner._buffers[local]


def _layer(module, extra_bias, head: Head) -> OutputLayer:
    bias = None if extra_bias is None else extra_bias.reshape(-1)
    if module.bias is not None:
        bias = module.bias if bias is None else bias + module.bias
    return OutputLayer(module.weight, bias, head.scale, head.softcap)


def _probe_inputs(model, module) -> dict:
    """Returns the check forward's inputs: one row of `PROBE_TOKENS` ids (the same row as decoder input)."""
    vocab = module.out_features
    with contextlib.suppress(Exception):
        vocab = min(vocab, model.get_input_embeddings().num_embeddings)
    ids = ((torch.arange(PROBE_TOKENS) + 3) % vocab).view(1, -1).to(module.weight.device)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if getattr(model.config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = ids
    return inputs


def check_head(model, module) -> Head | str:
    """Returns the `Head` of `model` (unwrapped) whose output `Linear` is `module`: the fullest of `candidates` that
    gives the forward's own logits in a check forward of a few tokens (the module's logits plus fixed noise); or, where
    none does, why not (a sentence)."""
    heads = candidates(model, module)
    generator = torch.Generator().manual_seed(0)
    calls = []

    def probe(hidden):  # inside the forward: a sharded model holds the module's weights gathered here
        out = torch.nn.functional.linear(hidden, module.weight, module.bias)
        noise = (torch.randn(out.shape, generator=generator) * PROBE_NOISE).to(out)
        layers = [_layer(module, _bias_buffer(model, head.bias_name), head) for head in heads]
        calls.append([layer.activate(layer.linear(hidden) + noise) for layer in layers])
        return out + noise

    device = module.weight.device
    modes = [(m, m.training) for m in model.modules()]
    forked = [device] if device.type not in ("cpu", "meta") else []
    module.forward = probe
    token = _checking.set(True)
    try:
        with torch.no_grad(), torch.autocast(device.type, enabled=False), torch.random.fork_rng(
                devices=forked, device_type=device.type if forked else "cuda"):
            model.eval()
            output = model(**_probe_inputs(model, module), return_dict=True)
    except Exception as error:  # a model whose forward needs more than token ids
        return f"a check forward of {PROBE_TOKENS} tokens failed: {type(error).__name__}: {str(error)[:200]}"
    finally:
        _checking.reset(token)
        del module.forward
        for submodule, training in modes:
            submodule.training = training
    if len(calls) != 1:
        return f"its forward calls its output module {len(calls)} times, not once"
    logits = getattr(output, "logits", None)
    if logits is None or logits.shape != calls[0][0].shape or not torch.isfinite(logits).all():
        return "its forward's logits do not line up with its output module's (a check forward of a few tokens)"
    want = logits.double()
    eps = max(torch.finfo(logits.dtype).eps, torch.finfo(calls[0][0].dtype).eps)
    errors = [(value.double() - want).abs().max().item() for value in calls[0]]
    tolerance = PROBE_ROUNDING * eps * want.abs().max().item()
    for head, error in zip(heads, errors):
        if error <= tolerance:
            return head
    return (f"its forward changes its output Linear's logits in a way the scoring pass does not compute: in a check "
            f"forward of {PROBE_TOKENS} tokens, none of the Linear alone, plus a bias buffer, scaled or soft-capped "
            f"came within {min(errors):.3g} of its logits")


def _output_module(model):
    """Returns `(output module, why it cannot be handed its input or None)` of the unwrapped `model`."""
    module = model.get_output_embeddings()
    if module is None or type(module) is not torch.nn.Linear:  # an adapter on the head changes its forward
        return module, f"its output module is a {type(module).__name__}, not a plain Linear"
    if module._forward_hooks and not hasattr(module.weight, "ds_id"):  # ZeRO-3's own gather hooks aside
        return module, "its output module has forward hooks, which would not see the logits"
    if isinstance(module, FSDPModule):  # its own group reshards after the forward, before the chunks' backward
        return module, "its output module is sharded on its own (fully_shard), not with the root"
    return module, None


def head_of(model) -> tuple | None:
    """Returns `(output module, Head)` of the unwrapped `model` (checked once per instance and output module:
    `check_head`), or None (warned once per class) when the scoring pass must take the whole logits from the forward:
    always within `whole_logits()`, silently."""
    if _whole.get():
        return None
    module, why = _output_module(model)
    if why is None:
        checked = _heads.get(model)
        if checked is None or checked[0] is not module:
            checked = (module, check_head(model, module))
            _heads[model] = checked
        if isinstance(checked[1], str):
            why = checked[1]
    if why is None:
        return module, checked[1]
    name = type(model).__name__
    if name not in _warned:
        _warned.add(name)
        logger.warning(
            "The scoring pass takes the whole logits tensor of %s from its forward, which holds (rows x tokens x "
            "vocabulary) floats at once: %s.", name, why)
    return None


def knows_head(model) -> bool:
    """Returns whether the scoring pass can take `model`'s (unwrapped) output layer's input instead of its logits."""
    return head_of(model) is not None


@contextlib.contextmanager
def handing_hidden(model, receive):
    """Within the context, a forward of the unwrapped `model` (directly or through its wrapper) calls `receive(hidden
    (..., d), layer: OutputLayer)` where its output module would compute the logits, and returns placeholder logits of
    width 1 (zeros). Yields False (and changes nothing) for a model whose output layer is not known (`head_of`).

    `receive` may return a one-element tensor computed from what it received: the placeholder is made from it (times
    0), so that the forward's output reaches the parameters the reductions used (DDP's search for unused parameters
    walks the graph from the output)."""
    known = head_of(model)
    if known is None:
        yield False
        return
    module, head = known
    owner, local = _buffer_owner(model, head.bias_name) if head.bias_name else (None, None)
    bias_buffer = owner._buffers[local] if owner is not None else None

    def forward(hidden):
        anchor = receive(hidden, _layer(module, bias_buffer, head))
        placeholder = hidden.new_zeros(()) if anchor is None else anchor.reshape(()).to(hidden.dtype) * 0
        return placeholder.expand(*hidden.shape[:-1], 1)

    module.forward = forward
    if owner is not None:
        owner._buffers[local] = bias_buffer.new_zeros(1, 1)
    try:
        yield True
    finally:
        del module.forward
        if owner is not None:
            owner._buffers[local] = bias_buffer
