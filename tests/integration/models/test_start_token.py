"""BERT-style targets ([CLS] ... [SEP]) with a BERT2BERT model that starts decoding from [CLS]: the labels and the
diagnostics' gold rows drop the leading [CLS]; other tokenizers' labels are left alone."""

import pytest
import torch

from helpers import byt5_tokenizer
from hf_seqrl.data import strip_start_token, tokenize_pairs
from hf_seqrl.diagnostics import run_diagnostics

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away", "big", "red"]


@pytest.fixture(scope="module")
def bert2bert():
    from transformers import BertConfig, BertLMHeadModel, BertModel, BertTokenizerFast, EncoderDecoderModel

    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS)})
    sizes = dict(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=32, max_position_embeddings=64)
    torch.manual_seed(0)
    model = EncoderDecoderModel(encoder=BertModel(BertConfig(**sizes)),
                                decoder=BertLMHeadModel(BertConfig(**sizes, is_decoder=True,
                                                                   add_cross_attention=True)))
    ids = dict(decoder_start_token_id=tok.cls_token_id, pad_token_id=tok.pad_token_id, eos_token_id=tok.sep_token_id)
    for config in (model.config, model.generation_config):
        for key, value in ids.items():
            setattr(config, key, value)
    return model.eval(), tok


def test_strip_start_token_drops_only_a_leading_start_token():
    rows = [[2, 5, 6, 3], [7, 3], [2], [5, 2, 3]]
    assert strip_start_token(rows, 2) == [[5, 6, 3], [7, 3], [2], [5, 2, 3]]
    assert strip_start_token(rows, None) is rows


def test_tokenize_pairs_with_a_bert_tokenizer(bert2bert):
    _, tok = bert2bert
    batch = {"source": ["the cat sat"], "target": ["a dog ran"]}
    plain = tokenize_pairs(batch, tok, "source", "target")
    assert plain["labels"][0][0] == tok.cls_token_id  # what the tokenizer gives
    fixed = tokenize_pairs(batch, tok, "source", "target", decoder_start_token_id=tok.cls_token_id)
    assert fixed["labels"] == [plain["labels"][0][1:]]
    assert tok.decode(fixed["labels"][0], skip_special_tokens=True) == "a dog ran"
    # T5-style labels (no start token in them) are unchanged
    byt5 = byt5_tokenizer()
    assert (tokenize_pairs(batch, byt5, "source", "target", decoder_start_token_id=0)["labels"]
            == tokenize_pairs(batch, byt5, "source", "target")["labels"])


def test_diagnostics_score_the_gold_target_after_the_start_token(bert2bert):
    model, tok = bert2bert
    sources = ["the cat sat on a mat", "a big red dog ran far away"]
    references = ["the cat sat", "a dog ran away"]
    report = run_diagnostics(model, tok, sources, references, max_horizon=3, inject_positions=(0,),
                             batch_size=2, max_new_tokens=6, progress=False)
    labels = tok(text_target=references, padding=True, return_tensors="pt")["input_ids"][:, 1:]
    labels = labels.masked_fill(labels == tok.pad_token_id, -100)
    enc = tok(sources, padding=True, return_tensors="pt")
    with torch.no_grad():
        loss = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], labels=labels).loss
    # the teacher-forced NLL is the model's own loss on [w1 ... SEP] after [CLS]
    assert report["summary"]["tf_nll"] == pytest.approx(float(loss), rel=1e-4)
