"""`build_tiny_model`: special ids in the config and the generation config, sizes, seeds, a tokenizer's ids."""

import pytest
import torch

from hf_seqrl.models.tiny import build_tiny_model

BYT5_IDS = dict(vocab_size=384, pad_token_id=0, eos_token_id=1)
GENERATION_IDS = ("pad_token_id", "eos_token_id", "decoder_start_token_id")


def word_tokenizer():
    """A word-level tokenizer whose special ids are neither 0 nor 1 and all differ: pad 5, eos 7, bos 3."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["a", "b", "c", "<s>", "d", "<pad>", "e", "</s>", "<unk>", "f"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", bos_token="<s>",
                                   unk_token="<unk>")


@pytest.mark.parametrize("arch, start", [("t5", 0), ("bart", 1), ("marian", 0)])
def test_special_ids_reach_the_generation_config(arch, start):
    model = build_tiny_model(arch, **BYT5_IDS)
    # BART starts the decoder from eos, as the pretrained BARTs; T5 and Marian from pad.
    assert model.config.decoder_start_token_id == start
    for key in GENERATION_IDS:
        assert getattr(model.generation_config, key) == getattr(model.config, key)
    assert (model.config.pad_token_id, model.config.eos_token_id) == (0, 1)
    assert model.generation_config.bad_words_ids is None
    if arch != "t5":
        assert model.config.forced_eos_token_id is None and model.generation_config.forced_eos_token_id is None


@pytest.mark.parametrize("arch, expected", [
    # shared embedding 384*32 = 12288 (lm_head tied); encoder: attention 4*32*32 + relative bias 32 buckets*2
    # heads + norm 32, feed-forward 2*32*64 + norm 32, final norm 32 = 8352; decoder: self-attention 4096 + 64
    # + 32, cross-attention 4096 + 32, feed-forward 4096 + 32, final norm 32 = 12480.
    ("t5", 12288 + 8352 + 12480),
    # shared embedding 12288; sinusoidal positions 2 * 128*32 = 8192; encoder layer: attention 4*(32*32 + 32),
    # fc1 32*64 + 64, fc2 64*32 + 32, two norms 2*64 = 8544; decoder layer: two attentions and three norms = 12832.
    ("marian", 12288 + 8192 + 8544 + 12832),
    # Marian's, with learned positions of 128 + 2 offset rows (2 * 130*32 = 8320) and two embedding norms (128).
    ("bart", 12288 + 8320 + 128 + 8544 + 12832),
])
def test_parameter_count(arch, expected):
    model = build_tiny_model(arch, **BYT5_IDS, max_positions=128)
    assert sum(p.numel() for p in model.parameters()) == expected


def test_sizes_and_overrides():
    model = build_tiny_model("marian", **BYT5_IDS, d_model=64, layers=2, heads=4, ffn=96, dropout=0.1,
                             attention_dropout=0.0, activation_function="relu", init_std=0.1)
    config = model.config
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (64, 2, 2)
    assert config.encoder_attention_heads == config.decoder_attention_heads == 4
    assert config.encoder_ffn_dim == config.decoder_ffn_dim == 96
    # `dropout` sets all three rates; an override wins over it.
    assert (config.dropout, config.attention_dropout, config.activation_dropout) == (0.1, 0.0, 0.1)
    assert (config.activation_function, config.init_std) == ("relu", 0.1)
    t5 = build_tiny_model("t5", **BYT5_IDS, d_model=64, heads=4).config
    assert (t5.d_ff, t5.d_kv, t5.num_layers, t5.num_decoder_layers) == (128, 16, 1, 1)


@pytest.mark.parametrize("arch", ["t5", "bart", "marian"])
def test_seed_reproduces_the_weights(arch):
    first, again = build_tiny_model(arch, **BYT5_IDS, seed=3), build_tiny_model(arch, **BYT5_IDS, seed=3)
    other = build_tiny_model(arch, **BYT5_IDS, seed=4)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))
    assert not all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), other.state_dict().values()))


@pytest.mark.parametrize("arch, start", [("t5", 5), ("bart", 7), ("marian", 5)])
def test_a_tokenizers_ids_are_used(arch, start):
    tokenizer = word_tokenizer()
    model = build_tiny_model(arch, tokenizer=tokenizer)
    assert model.config.vocab_size == len(tokenizer) == 10
    assert (model.config.pad_token_id, model.config.eos_token_id, model.config.decoder_start_token_id) == (5, 7, start)
    for key in GENERATION_IDS:
        assert getattr(model.generation_config, key) == getattr(model.config, key)
    if arch != "t5":
        assert model.config.bos_token_id == 3
    # Given ids win over the tokenizer's.
    model = build_tiny_model(arch, tokenizer=tokenizer, pad_token_id=8, decoder_start_token_id=2)
    assert (model.config.pad_token_id, model.config.decoder_start_token_id) == (8, 2)
    assert (model.generation_config.pad_token_id, model.generation_config.decoder_start_token_id) == (8, 2)


def test_bart_bos_falls_back_to_eos():
    assert build_tiny_model("bart", **BYT5_IDS).config.bos_token_id == 1
    assert build_tiny_model("bart", **BYT5_IDS, bos_token_id=2).config.bos_token_id == 2


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="not one of t5, bart, marian"):
        build_tiny_model("gpt2", **BYT5_IDS)
    with pytest.raises(ValueError, match="vocab_size, pad_token_id, eos_token_id"):
        build_tiny_model("t5")
