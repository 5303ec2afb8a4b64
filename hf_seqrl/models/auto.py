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


def set_language_codes(model, tokenizer, src_lang: str | None, tgt_lang: str | None,
                       owner: str = "ScriptArguments") -> None:
    """Sets a multilingual tokenizer's `src_lang` / `tgt_lang` (it marks sources and targets with their codes) and
    starts the model's decode with the target's code (`forced_bos_token_id` of its generation config, saved with
    the model), as NLLB, mBART and M2M100 translate. Refuses codes the tokenizer does not know, a tokenizer without
    language codes, a decoder-only model and a generation config that forces another first token (errors name
    `owner`'s fields)."""
    if src_lang is None and tgt_lang is None:
        return
    name = type(tokenizer).__name__
    if getattr(model.config, "is_encoder_decoder", False) is False:
        raise ValueError(f"{owner}.src_lang / tgt_lang: language codes apply to multilingual encoder-decoder "
                         f"models (NLLB, mBART, M2M100); {type(model).__name__} is decoder-only: put the languages "
                         "in prompt_template instead.")
    if not hasattr(tokenizer, "src_lang"):
        raise ValueError(f"{owner}.src_lang / tgt_lang: the tokenizer ({name}) has no language codes; drop "
                         "them (they are for NLLB, mBART and M2M100 tokenizers).")
    for field_name, code in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
        if code is not None and tokenizer.convert_tokens_to_ids(code) in (None, tokenizer.unk_token_id):
            raise ValueError(f"{owner}.{field_name}={code!r} is no token of {name}: use its language codes "
                             "(e.g. NLLB's deu_Latn, eng_Latn).")
    if src_lang is not None:
        tokenizer.src_lang = src_lang
    if tgt_lang is not None:
        tokenizer.tgt_lang = tgt_lang
        wanted = tokenizer.convert_tokens_to_ids(tgt_lang)
        forced = model.generation_config.forced_bos_token_id
        if forced is not None and forced != wanted:
            raise ValueError(f"{owner}.tgt_lang={tgt_lang!r} (token {wanted}), but the model's generation "
                             f"config forces token {forced} first: drop tgt_lang or set "
                             "generation_config.forced_bos_token_id to it.")
        model.generation_config.forced_bos_token_id = wanted
