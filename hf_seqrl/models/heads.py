"""A model's output layer, read from its architecture, and a forward that hands the layer's input to the scoring pass
instead of computing every position's logits (`hf_seqrl.functional.lm_head` reduces the vocabulary slice by slice).

Inside `handing_hidden(model, receive)`, the model's output module does not multiply: it calls `receive(hidden,
layer)` with its input `(..., d)` and the `OutputLayer` (what the architecture's forward does after it included),
then returns a width-1 placeholder, so what the forward adds or caps after it costs nothing. The call happens inside
the model's own forward, where a sharded model (FSDP2, ZeRO-3) holds its output weights gathered and autograd sees
them as the forward's.
"""

from __future__ import annotations

import contextlib
import logging

import torch
from torch.distributed.fsdp import FSDPModule

from ..functional.lm_head import OutputLayer

logger = logging.getLogger(__name__)

# model_type -> what its forward does to the output module's result: the buffer it adds (Marian / BART), the config
# field that soft-caps it (Gemma 2 / 3) and the one that scales it (Cohere). T5's rescale of the decoder's states
# for tied embeddings comes before the output module, so its input already holds it.
KNOWN_HEADS = {
    **dict.fromkeys(("t5", "mt5", "umt5", "longt5", "m2m_100", "llama", "mistral", "qwen2", "qwen3", "gemma",
                     "phi3"), (None, None, None)),
    **dict.fromkeys(("bart", "mbart", "marian", "pegasus", "blenderbot", "blenderbot-small"),
                    ("final_logits_bias", None, None)),
    **dict.fromkeys(("gemma2", "gemma3_text"), (None, "final_logit_softcapping", None)),
    "cohere": (None, None, "logit_scale"),
}

_warned: set[str] = set()


def _known_head(model):
    """Returns `(output module, bias buffer name, softcap, scale)` of the unwrapped `model`, or None (warned once per
    class) when the scoring pass must take the whole logits from the forward."""
    name = type(model).__name__
    spec = KNOWN_HEADS.get(getattr(model.config, "model_type", None))
    module = model.get_output_embeddings() if spec is not None else None
    why = None
    if spec is None:
        why = "its architecture is not in hf_seqrl.models.heads.KNOWN_HEADS"
    elif module is None or type(module) is not torch.nn.Linear:  # an adapter on the head changes its forward
        why = f"its output module is a {type(module).__name__}, not a plain Linear"
    elif module._forward_hooks and not hasattr(module.weight, "ds_id"):  # ZeRO-3's own gather hooks aside
        why = "its output module has forward hooks, which would not see the logits"
    elif isinstance(module, FSDPModule):  # its own group reshards after the forward, before the chunks' backward
        why = "its output module is sharded on its own (fully_shard), not with the root"
    if why is not None:
        if name not in _warned:
            _warned.add(name)
            logger.warning(
                "The scoring pass does not know the output layer of %s (%s): it takes the whole logits tensor from "
                "the forward, which holds (rows x tokens x vocabulary) floats at once.", name, why)
        return None
    bias_name, softcap_field, scale_field = spec
    softcap = getattr(model.config, softcap_field, None) if softcap_field else None
    scale = float(getattr(model.config, scale_field, 1.0) or 1.0) if scale_field else 1.0
    return module, bias_name, softcap, scale


def knows_head(model) -> bool:
    """Returns whether the scoring pass can take `model`'s (unwrapped) output layer's input instead of its logits."""
    return _known_head(model) is not None


@contextlib.contextmanager
def handing_hidden(model, receive):
    """Within the context, a forward of the unwrapped `model` (directly or through its wrapper) calls `receive(hidden
    (..., d), layer: OutputLayer)` where its output module would compute the logits, and returns placeholder logits of
    width 1 (zeros). Yields False (and changes nothing) for a model whose output layer is not known.

    `receive` may return a one-element tensor computed from what it received: the placeholder is made from it (times
    0), so that the forward's output reaches the parameters the reductions used (DDP's search for unused parameters
    walks the graph from the output)."""
    known = _known_head(model)
    if known is None:
        yield False
        return
    module, bias_name, softcap, scale = known
    bias_buffer = getattr(model, bias_name) if bias_name else None

    def forward(hidden):
        bias = None
        if bias_buffer is not None:
            bias = bias_buffer.reshape(-1)
        if module.bias is not None:
            bias = module.bias if bias is None else bias + module.bias
        anchor = receive(hidden, OutputLayer(module.weight, bias, scale, softcap))
        placeholder = hidden.new_zeros(()) if anchor is None else anchor.reshape(()).to(hidden.dtype) * 0
        return placeholder.expand(*hidden.shape[:-1], 1)

    module.forward = forward
    if bias_name:
        model._buffers[bias_name] = bias_buffer.new_zeros(1, 1)
    try:
        yield True
    finally:
        del module.forward
        if bias_name:
            model._buffers[bias_name] = bias_buffer
