"""Language codes of multilingual encoder-decoder models, on real `M2M100Tokenizer`, `NllbTokenizerFast` and
`MBart50TokenizerFast` built offline over a sentencepiece model trained here: each code resolves through the
tokenizer's own table (M2M100's `en` is the token `__en__`, not the subword "en"), the decode starts with the token
the labels start with (`--src_lang/--tgt_lang` of `hf-seqrl train`, or the tokenizer's `tgt_lang` through the Python
API), a code the tokenizer does not define is refused naming the ones it does, and no reward, sample log or metric
sees a language token."""

import json

import pytest
import torch

from helpers import REPO, make_config, multilingual_model, multilingual_tokenizer

from hf_seqrl.cli import main

# kind -> (source code, target code, a code of the table looked up as a plain token elsewhere, a refused code and
# the code its error suggests)
KINDS = {"m2m100": ("de", "en", "__en__", "en"), "nllb": ("deu_Latn", "eng_Latn", "en", "eng_Latn"),
         "mbart50": ("de_DE", "en_XX", "en", "en_XX")}
PAIRS = [("ein hund", "a dog"), ("eine katze", "a cat"), ("der mann liest", "the man reads"), ("ein buch", "a book")]


def own_lookup(tokenizer, code: str) -> int:
    """The id each tokenizer's own API gives a language code (what `generate(forced_bos_token_id=...)` takes)."""
    if hasattr(tokenizer, "get_lang_id"):
        return tokenizer.get_lang_id(code)  # M2M100
    return tokenizer.convert_tokens_to_ids(code)  # NLLB, mBART-50: the code is the token


def model_folder(tmp_path, kind: str):
    """A tiny checkpoint of `kind` (model and tokenizer, no languages set) and a training file of text pairs."""
    tokenizer = multilingual_tokenizer(kind, tmp_path / "spm")
    multilingual_model(tokenizer).save_pretrained(tmp_path / kind)
    tokenizer.save_pretrained(tmp_path / kind)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"source": s, "target": t}) + "\n" for s, t in PAIRS * 2))
    return tmp_path / kind


def train_argv(tmp_path, folder, *flags):
    return ["train", "--model_name_or_path", str(folder), "--train_file", str(tmp_path / "train.jsonl"),
            "--algorithm", "scst", "--reward_funcs", "chrf", "--output_dir", str(tmp_path / "out"), "--max_steps", "1",
            "--per_device_train_batch_size", "4", "--max_new_tokens", "6", "--generation_max_length", "6",
            "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
            "--use_cpu", "true", *flags]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cli_codes_mark_the_data_and_start_the_decode(tmp_path, kind):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_seqrl.models import family_for

    source, target = KINDS[kind][:2]
    folder = model_folder(tmp_path, kind)
    assert main(train_argv(tmp_path, folder, "--src_lang", source, "--tgt_lang", target)) == 0
    tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    language = own_lookup(tok, target)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out")
    assert model.generation_config.forced_bos_token_id == language  # saved: the card's generate() starts with it
    assert (tok.src_lang, tok.tgt_lang) == (source, target)  # saved with the tokenizer, for `evaluate`
    batch = tok(["ein hund"], text_target=["a dog"], return_tensors="pt")
    assert batch["input_ids"][0, 0] == own_lookup(tok, source) and batch["labels"][0, 0] == language
    family = family_for(model)
    rollout = family.sample(model, {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]},
                            family.generation_config(model, 6), 3)
    assert (rollout.sample_ids[:, 0] == language).all()
    assert model.generate(**{k: batch[k] for k in ("input_ids", "attention_mask")}, max_new_tokens=3)[0, 1] == language


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cli_refuses_a_code_the_tokenizer_does_not_define_naming_the_right_one(tmp_path, kind, capsys):
    _, _, wrong, suggested = KINDS[kind]
    folder = model_folder(tmp_path, kind)
    assert main(train_argv(tmp_path, folder, "--tgt_lang", wrong)) == 2
    err = capsys.readouterr().err
    assert f"tgt_lang={wrong!r} is not a language code of" in err and f"Did you mean {suggested!r}" in err
    assert main(train_argv(tmp_path, folder, "--src_lang", "xyz_Latn")) == 2
    assert "src_lang='xyz_Latn' is not a language code of" in capsys.readouterr().err


def test_m2m100_resolves_codes_that_are_no_token_of_its_vocabulary(tmp_path):
    """M2M100's `ja` is the token `__ja__`: as a plain token it is unknown, so a lookup by token refused it."""
    from hf_seqrl.models.languages import code_token_id

    tok = multilingual_tokenizer("m2m100", tmp_path)
    assert tok.convert_tokens_to_ids("ja") == tok.unk_token_id
    assert code_token_id(tok, "ja", "tgt_lang") == tok.get_lang_id("ja") == tok.convert_tokens_to_ids("__ja__")
    assert code_token_id(tok, "en", "tgt_lang") == tok.get_lang_id("en")


def test_tokenizers_without_codes_are_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["train", "--tiny_model", "t5", "--train_file", "recipes/data/toy_de_en.train.txt", "--output_dir",
                 str(tmp_path / "t5"), "--tgt_lang", "eng_Latn", "--max_steps", "1"]) == 2
    assert "the tokenizer (ByT5Tokenizer) has no language codes" in capsys.readouterr().err


def recording_reward(seen: list):
    def reward(predictions, references, sources=None, **columns):
        seen.extend(predictions)
        seen.extend(r for refs in references for r in refs)
        return [0.5 + 0.1 * (i % 3) for i in range(len(predictions))]
    return reward


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_trainer_starts_decodes_with_the_tokenizers_target_language(tmp_path, kind):
    """The Python API: a tokenizer loaded with `src_lang` / `tgt_lang` and a checkpoint whose generation config forces
    no first token (as NLLB and M2M100 ship): the trainer starts every decode with the token the labels start with,
    and rewards, references and the sample log read the text without any language token."""
    from datasets import Dataset

    from hf_seqrl import SCSTTrainer, SeqRLConfig

    source, target = KINDS[kind][:2]
    tok = multilingual_tokenizer(kind, tmp_path / "spm", src_lang=source, tgt_lang=target)
    model = multilingual_model(tok)
    assert model.generation_config.forced_bos_token_id is None
    seen: list[str] = []
    args = make_config(SeqRLConfig, tmp_path, max_steps=1, max_new_tokens=6, num_samples=2, baseline="mean",
                       log_completions=True)
    data = Dataset.from_dict({"source": [s for s, _ in PAIRS], "target": [t for _, t in PAIRS]})
    trainer = SCSTTrainer(model=model, args=args, reward_funcs=recording_reward(seen), processing_class=tok,
                          train_dataset=data)
    language = own_lookup(tok, target)
    assert model.generation_config.forced_bos_token_id == language
    batch = tok(["ein hund"], return_tensors="pt")
    rollout = trainer.family.sample(model, dict(batch), trainer.family.generation_config(model, 4), 3)
    assert (rollout.sample_ids[:, 0] == language).all()
    trainer.train()
    assert seen and all(text.split()[:1] != [tok.convert_ids_to_tokens(language)] for text in seen)
    assert not any("__" in text or target in text or source in text for text in seen), seen
    logged = [json.loads(line) for path in (tmp_path / "out").rglob("*.jsonl") for line in path.open()]
    assert logged and not any("__" in str(row.get("completion", "")) for row in logged)


def test_trainer_refuses_a_generation_config_forcing_another_language(tmp_path):
    from datasets import Dataset

    from hf_seqrl import SCSTTrainer, SeqRLConfig

    tok = multilingual_tokenizer("m2m100", tmp_path / "spm", src_lang="de", tgt_lang="en")
    model = multilingual_model(tok)
    model.generation_config.forced_bos_token_id = tok.get_lang_id("fr")
    args = make_config(SeqRLConfig, tmp_path, max_steps=1, max_new_tokens=4)
    data = Dataset.from_dict({"source": ["ein hund"], "target": ["a dog"]})
    with pytest.raises(ValueError, match=r"tgt_lang 'en' starts every target with token \d+, but the model's "
                                         r"generation config forces token \d+ \('__fr__'\)"):
        SCSTTrainer(model=model, args=args, reward_funcs="chrf", processing_class=tok, train_dataset=data)
    no_target = multilingual_tokenizer("m2m100", tmp_path / "spm2", src_lang="de")
    with pytest.raises(ValueError, match="its tgt_lang is not set"):
        SCSTTrainer(model=multilingual_model(no_target), args=args, reward_funcs="chrf", processing_class=no_target,
                    train_dataset=data)


def test_decoded_text_leaves_out_language_tokens_decode_keeps(tmp_path):
    """transformers' M2M100 tokenizer does not mark `__en__` special, so `decode(skip_special_tokens=True)` keeps it;
    `decode_texts`, which every reward and log reads through, does not (tensors and lists alike)."""
    from hf_seqrl.models.languages import decode_texts

    tok = multilingual_tokenizer("m2m100", tmp_path, src_lang="de", tgt_lang="en")
    labels = tok(["a dog"], text_target=["a dog"])["labels"]
    assert tok.decode(labels[0], skip_special_tokens=True).startswith("__en__")
    assert decode_texts(tok, labels) == decode_texts(tok, torch.tensor(labels)) == ["a dog"]
