"""`--src_lang` / `--tgt_lang` for multilingual encoder-decoder models: an NLLB tokenizer (a real
`NllbTokenizerFast`, built offline over characters) marks sources and targets with their codes, and the decode starts
with the target's code through the generation config's `forced_bos_token_id`, saved with the model."""

import json

import pytest
import torch

from hf_seqrl.cli import main


def nllb_tokenizer():
    from transformers import NllbTokenizerFast

    pieces = ["<s>", "<pad>", "</s>", "<unk>", "▁"] + list("abcdefghijklmnopqrstuvwxyz")
    return NllbTokenizerFast(vocab={p: i for i, p in enumerate(pieces)}, merges=[])


@pytest.fixture
def nllb_folder(tmp_path):
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    tok = nllb_tokenizer()
    torch.manual_seed(0)
    config = M2M100Config(vocab_size=len(tok), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                          decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
                          pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, dropout=0.1)
    M2M100ForConditionalGeneration(config).save_pretrained(tmp_path / "nllb")
    tok.save_pretrained(tmp_path / "nllb")
    rows = [{"source": s, "target": t} for s, t in [("ein hund", "a dog"), ("eine katze", "a cat")] * 4]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return tmp_path


def train_argv(folder, *flags):
    return ["train", "--model_name_or_path", str(folder / "nllb"), "--train_file", str(folder / "train.jsonl"),
            "--algorithm", "scst", "--reward_funcs", "chrf", "--output_dir", str(folder / "out"), "--max_steps", "1",
            "--per_device_train_batch_size", "4", "--max_new_tokens", "6", "--generation_max_length", "6",
            "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
            "--use_cpu", "true", *flags]


def test_language_codes_mark_the_data_and_start_the_decode(nllb_folder):
    from transformers import AutoTokenizer, M2M100ForConditionalGeneration

    from hf_seqrl.models import family_for

    assert main(train_argv(nllb_folder, "--src_lang", "deu_Latn", "--tgt_lang", "eng_Latn")) == 0
    out = nllb_folder / "out"
    tok = AutoTokenizer.from_pretrained(out)
    english = tok.convert_tokens_to_ids("eng_Latn")
    model = M2M100ForConditionalGeneration.from_pretrained(out)
    assert model.generation_config.forced_bos_token_id == english  # saved: the card's generate() starts with it
    assert (tok.src_lang, tok.tgt_lang) == ("deu_Latn", "eng_Latn")  # saved with the tokenizer, for `evaluate`
    batch = tok(["ein hund"], text_target=["a dog"], return_tensors="pt")
    assert batch["input_ids"][0, 0] == tok.convert_tokens_to_ids("deu_Latn") and batch["labels"][0, 0] == english
    # the rollouts the trainer samples start with the target's code, as generate() does
    family = family_for(model)
    rollout = family.sample(model, {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]},
                            family.generation_config(model, 6), 3)
    assert (rollout.sample_ids[:, 0] == english).all()
    assert model.generate(**{k: batch[k] for k in ("input_ids", "attention_mask")}, max_new_tokens=3)[0, 1] == english


def test_unknown_codes_and_tokenizers_without_codes_are_refused(nllb_folder, capsys, monkeypatch):
    from helpers import REPO

    assert main(train_argv(nllb_folder, "--tgt_lang", "xyz_Latn")) == 2
    assert "tgt_lang='xyz_Latn' is no token of NllbTokenizer" in capsys.readouterr().err
    monkeypatch.chdir(REPO)
    assert main(["train", "--tiny_model", "t5", "--train_file", "recipes/data/toy_de_en.train.txt", "--output_dir",
                 str(nllb_folder / "t5"), "--tgt_lang", "eng_Latn", "--max_steps", "1"]) == 2
    assert "the tokenizer (ByT5Tokenizer) has no language codes" in capsys.readouterr().err
