"""`family_for(model)`: the model family (encoder-decoder or decoder-only) of a model, a config or a checkpoint."""

from __future__ import annotations

from .base import ModelFamily
from .causal import CausalFamily
from .seq2seq import Seq2SeqFamily

SUPPORTED = ("encoder-decoder models (AutoModelForSeq2SeqLM: T5, BART, Marian, mBART, Pegasus, or an "
             "EncoderDecoderModel)", "decoder-only models (AutoModelForCausalLM: Llama, Qwen2, Mistral, GPT-2, ...)")


FAMILIES = {"seq2seq": Seq2SeqFamily, "causal": CausalFamily}  # one new instance per caller: a trainer's own


def family_for_config(config) -> ModelFamily:
    """Returns the family of a model config: seq2seq when `config.is_encoder_decoder`, else causal."""
    return FAMILIES["seq2seq" if getattr(config, "is_encoder_decoder", False) else "causal"]()


def family_for(model) -> ModelFamily:
    """Returns a new instance of the family of `model` (each trainer its own), or raises an error naming the supported models."""
    if model is None:
        raise ValueError("Pass `model=`: one of " + "; ".join(SUPPORTED) + ".")
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return FAMILIES["seq2seq"]()
    can_generate = getattr(model, "can_generate", None)
    if callable(can_generate) and can_generate() and model.get_output_embeddings() is not None:
        return FAMILIES["causal"]()
    raise ValueError(
        f"{type(model).__name__} is neither an encoder-decoder model (config.is_encoder_decoder) nor a causal "
        "language model that generates text (a model with an LM head). hf-seqrl trains " + " and ".join(SUPPORTED)
        + ": load one with AutoModelForSeq2SeqLM or AutoModelForCausalLM.")


def load_pretrained(name_or_path: str, **kwargs):
    """Returns the model at `name_or_path`, loaded with its family's Auto class (from its config)."""
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(name_or_path, **kwargs)
    return getattr(transformers, family_for_config(config).auto_class).from_pretrained(name_or_path, **kwargs)
