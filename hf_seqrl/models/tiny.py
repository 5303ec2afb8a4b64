"""Randomly initialized encoder-decoders and decoder-only models built from a config: the tests, the recipes' `tiny_model`, the demo and the
benchmarks all build theirs here, so a model of given settings is the same model everywhere."""

from __future__ import annotations

import torch

ARCHITECTURES = ("t5", "bart", "marian", "llama", "qwen2")
CAUSAL_ARCHITECTURES = ("llama", "qwen2")


def build_tiny_model(arch: str, vocab_size: int | None = None, tokenizer=None, *, d_model: int = 32, layers: int = 1,
                     heads: int = 2, ffn: int | None = None, dropout: float = 0.0, max_positions: int = 1024,
                     pad_token_id: int | None = None, eos_token_id: int | None = None,
                     bos_token_id: int | None = None, decoder_start_token_id: int | None = None,
                     seed: int | None = None, **config_overrides):
    """Returns a randomly initialized `"t5"`, `"bart"` or `"marian"` encoder-decoder, or a `"llama"` / `"qwen2"`
    decoder-only model, its special ids set in both its config and its generation config.

    Args:
        arch (`str`): `"t5"` (`T5ForConditionalGeneration`), `"bart"` (`BartForConditionalGeneration`) or
            `"marian"` (`MarianMTModel`); `"llama"` (`LlamaForCausalLM`) or `"qwen2"` (`Qwen2ForCausalLM`), with
            tied input and output embeddings.
        vocab_size (`int`, *optional*): defaults to `len(tokenizer)`.
        tokenizer (*optional*): the source of `vocab_size` and of the special ids not given.
        d_model (`int`, *optional*, defaults to `32`), layers (`int`, *optional*, defaults to `1`, encoder and
            decoder each; a decoder-only model has `layers` layers), heads (`int`, *optional*, defaults to `2`), ffn (`int`, *optional*, defaults to
            `2 * d_model`): the sizes. T5's per-head width is `d_model // heads`.
        dropout (`float`, *optional*, defaults to `0.0`): T5's `dropout_rate`; BART's and Marian's `dropout`,
            `attention_dropout` and `activation_dropout` (override the last two to tell them apart).
        max_positions (`int`, *optional*, defaults to `1024`): BART's and Marian's `max_position_embeddings`
            (T5's positions are relative).
        pad_token_id, eos_token_id, bos_token_id (`int`, *optional*): default to the tokenizer's. BART's `bos`
            falls back to `eos`; T5 has none.
        decoder_start_token_id (`int`, *optional*): defaults to `eos` for BART (as the pretrained BARTs) and to
            `pad` for T5 and Marian; decoder-only models have none.
        seed (`int`, *optional*): `torch.manual_seed(seed)` before the weights are drawn; `None` draws from the
            current generator state (after `transformers.set_seed`, say).
        config_overrides: any other field of the config class (`activation_function="relu"`, `init_std=0.1`,
            `scale_embedding=True`, ...); they win over the values above.
    """
    from transformers import BartConfig, BartForConditionalGeneration, MarianConfig, MarianMTModel, T5Config
    from transformers import T5ForConditionalGeneration

    if arch not in ARCHITECTURES:
        raise ValueError(f"arch={arch!r} is not one of {', '.join(ARCHITECTURES)}.")

    def from_tokenizer(value, attribute):
        return getattr(tokenizer, attribute) if value is None and tokenizer is not None else value

    vocab_size = len(tokenizer) if vocab_size is None and tokenizer is not None else vocab_size
    pad, eos = from_tokenizer(pad_token_id, "pad_token_id"), from_tokenizer(eos_token_id, "eos_token_id")
    bos = from_tokenizer(bos_token_id, "bos_token_id")
    missing = [name for name, value in (("vocab_size", vocab_size), ("pad_token_id", pad), ("eos_token_id", eos))
               if value is None]
    if missing:
        raise ValueError(f"build_tiny_model needs {', '.join(missing)}: give them, or a tokenizer that has them.")
    ffn = 2 * d_model if ffn is None else ffn
    if arch in CAUSAL_ARCHITECTURES:
        return _build_causal(arch, vocab_size, d_model, layers, heads, ffn, dropout, max_positions, pad, eos, bos, seed,
                             config_overrides)
    if decoder_start_token_id is None:
        decoder_start_token_id = eos if arch == "bart" else pad
    ids = {"pad_token_id": pad, "eos_token_id": eos, "decoder_start_token_id": decoder_start_token_id}
    if arch == "t5":
        config_class, model_class = T5Config, T5ForConditionalGeneration
        fields = dict(vocab_size=vocab_size, d_model=d_model, d_ff=ffn, num_layers=layers, num_decoder_layers=layers,
                      num_heads=heads, d_kv=d_model // heads, dropout_rate=dropout, **ids)
    else:
        config_class, model_class = {"bart": (BartConfig, BartForConditionalGeneration),
                                     "marian": (MarianConfig, MarianMTModel)}[arch]
        if arch == "bart" and bos is None:
            bos = eos
        # The config classes' default forced_eos_token_id (BART's 2, Marian's 0) is an id of their pretrained
        # vocabularies; here it would overwrite the last token of every sample cut at `max_new_tokens`.
        fields = dict(vocab_size=vocab_size, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                      encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
                      decoder_ffn_dim=ffn, dropout=dropout, attention_dropout=dropout, activation_dropout=dropout,
                      max_position_embeddings=max_positions, bos_token_id=bos, forced_eos_token_id=None, **ids)
    model = _instantiate(model_class, config_class(**{**fields, **config_overrides}), ids, seed)
    # Marian's pretrained generation configs ban the pad id through `bad_words_ids`; nothing is banned here.
    model.generation_config.bad_words_ids = None
    return model


def _instantiate(model_class, config, ids: dict, seed: int | None):
    """Returns `model_class(config)`, its weights drawn after `torch.manual_seed(seed)` (when given), with the special
    `ids` copied into its generation config (transformers 5 reads them there, not from the model config)."""
    if seed is not None:
        torch.manual_seed(seed)
    model = model_class(config)
    for key in ids:
        setattr(model.generation_config, key, getattr(model.config, key))
    return model


def _build_causal(arch, vocab_size, d_model, layers, heads, ffn, dropout, max_positions, pad, eos, bos, seed,
                  config_overrides):
    """Returns a tiny `LlamaForCausalLM` / `Qwen2ForCausalLM` (see `build_tiny_model`)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_class, model_class = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    ids = {"pad_token_id": pad, "eos_token_id": eos, "bos_token_id": bos}
    fields = dict(vocab_size=vocab_size, hidden_size=d_model, intermediate_size=ffn, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=heads, attention_dropout=dropout,
                  max_position_embeddings=max_positions, tie_word_embeddings=True, **ids)
    return _instantiate(model_class, config_class(**{**fields, **config_overrides}), ids, seed)
