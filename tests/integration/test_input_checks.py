"""Bad input met before the first step (or at the failing reward call) with a message naming the field or row and the
fix: ids outside the model's embeddings (an M2M100 built with `len(tokenizer)`, rows tokenized with another
tokenizer), text cells of the wrong type, a source column that is not there, a teacher that does not load, LoRA target
modules the model lacks, a token-level reward given to MRT, empty datasets, rows the CLI reads but cannot train on, a
reward that raises (and the checkpoint it leaves), an `evaluate` metric that needs the Hub."""

import json

import pytest
import torch
from datasets import Dataset

from helpers import byt5_tokenizer, make_config, tiny_model, toy_dataset, toy_pairs
from hf_seqrl import SCSTTrainer, SeqRLConfig


def text_data(n=4):
    sources, targets = toy_pairs(n, seed=1)
    return Dataset.from_dict({"source": sources, "target": targets})


def build(tmp_path, model, data=None, tokenizer=None, **settings):
    return SCSTTrainer(model=model, args=make_config(SeqRLConfig, tmp_path, **settings), reward_funcs="chrf",
                       processing_class=tokenizer or byt5_tokenizer(), train_dataset=text_data() if data is None else data)


def test_a_tokenizer_larger_than_the_embeddings_is_refused_at_build(tmp_path):
    from hf_seqrl.models.tiny import build_tiny_model

    small = build_tiny_model("marian", vocab_size=300, d_model=16, layers=1, pad_token_id=0, eos_token_id=1)
    with pytest.raises(ValueError, match=r"the tokenizer \(ByT5Tokenizer\) has 384 tokens, but the model's .* has 300 "
                                         r"rows.*resize_token_embeddings\(len\(tokenizer\)\)"):
        build(tmp_path, small)


def test_a_config_id_outside_the_vocabulary_is_refused_at_build(tmp_path):
    from transformers import MarianConfig, MarianMTModel

    # MarianConfig's default decoder_start_token_id is opus-mt's 58100, far outside a 4000-token vocabulary.
    model = MarianMTModel(MarianConfig(vocab_size=4000, d_model=16, encoder_layers=1, decoder_layers=1,
                                       encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16,
                                       decoder_ffn_dim=16, pad_token_id=0, eos_token_id=1))
    with pytest.raises(ValueError, match=r"decoder_start_token_id=58100 \(the decoder start token\) is outside the "
                                         r"model's .* of 4000 rows"):
        build(tmp_path, model)
    banned = tiny_model("marian")
    banned.generation_config.bad_words_ids = [[500]]
    with pytest.raises(ValueError, match=r"model.generation_config.bad_words_ids=500 \(a banned token\)"):
        build(tmp_path, banned)


def test_an_empty_dataset_says_it_is_empty(tmp_path):
    with pytest.raises(ValueError, match="train_dataset has 0 rows"):
        build(tmp_path, tiny_model("t5"), data=text_data().select([]))


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return str(path)


def test_the_cli_refuses_rows_it_cannot_train_on_or_drops_them_with_a_count(tmp_path):
    from hf_seqrl.cli.train import load_splits, parse_args

    good = [{"source": s, "target": t} for s, t in zip(*toy_pairs(4, seed=3))]
    bad = [{"source": "", "target": "x"}, {"source": "ab", "target": None}, {"source": "cd", "target": ["", "dc"]}]
    train = write_jsonl(tmp_path / "train.jsonl", good + bad)
    argv = ["--tiny_model", "marian", "--train_file", train, "--output_dir", str(tmp_path / "out")]
    script_args, args = parse_args(argv)
    with pytest.raises(ValueError, match=r"3 of 7 rows cannot be trained on: row 4: empty source ''; row 5: no "
                                         r"reference \(target None\); row 6: an empty reference.*--drop_invalid_rows"):
        load_splits(script_args, args, byt5_tokenizer())
    script_args, args = parse_args(argv + ["--drop_invalid_rows"])
    with pytest.warns(UserWarning, match=r"dropped 2 of 7 rows and the empty references of others .* 5 rows remain"):
        splits = load_splits(script_args, args, byt5_tokenizer())
    assert len(splits["train"]) == 5 and splits["train"]["references"][-1] == ["dc"]
    write_jsonl(tmp_path / "nulls.jsonl", [{"source": "ab", "target": None}])
    script_args.train_file = str(tmp_path / "nulls.jsonl")
    with pytest.raises(ValueError, match="no row is left to train on: row 0: no reference"):
        load_splits(script_args, args, byt5_tokenizer())


def test_a_raising_reward_names_step_and_rows_and_leaves_a_checkpoint_that_resumes(tmp_path):
    calls = []

    def flaky(predictions, references, sources=None, **columns):
        calls.append(len(predictions))
        if len(calls) == 3:
            raise ConnectionError("metric server down")
        return [0.5] * len(predictions)

    tokenizer = byt5_tokenizer()
    src, tgt = toy_pairs(8, seed=2)
    data = toy_dataset(tokenizer, src, tgt)
    args = make_config(SeqRLConfig, tmp_path, max_steps=4, per_device_train_batch_size=2, baseline="mean",
                       num_samples=2)
    trainer = SCSTTrainer(model=tiny_model("t5", dropout=0.1), args=args, reward_funcs=flaky,
                          processing_class=tokenizer, train_dataset=data)
    with pytest.raises(RuntimeError, match=r"reward 'flaky' raised ConnectionError at training step 3 on 4 rows, the "
                                           r"first prediction .*metric server down.*The 2 steps done are saved in "
                                           r".*checkpoint-2 \(save_on_error\).*resume_from_checkpoint="):
        trainer.train()
    checkpoint = tmp_path / "out" / "checkpoint-2"
    assert (checkpoint / "model.safetensors").exists() and (checkpoint / "optimizer.pt").exists()
    resumed = SCSTTrainer(model=tiny_model("t5", dropout=0.1), args=args, reward_funcs=flaky,
                          processing_class=tokenizer, train_dataset=data)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 4 and len(calls) == 5  # steps 3 and 4 ran again, nothing before them
    assert torch.isfinite(torch.tensor([h["loss"] for h in resumed.state.log_history if "loss" in h])).all()


def test_save_on_error_off_writes_nothing(tmp_path):
    def broken(predictions, references, sources=None, **columns):
        if broken.calls:
            raise KeyError("boom")
        broken.calls += 1
        return [0.0] * len(predictions)

    broken.calls = 0
    args = make_config(SeqRLConfig, tmp_path, save_on_error=False, baseline="mean", num_samples=2)
    trainer = SCSTTrainer(model=tiny_model("t5"), args=args,
                          reward_funcs=broken, processing_class=byt5_tokenizer(), train_dataset=text_data())
    with pytest.raises(RuntimeError, match=r"at training step 2 .*'boom'$"):
        trainer.train()
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("checkpoint-*"))


def test_an_evaluate_metric_offline_points_to_the_builtin(monkeypatch):
    import evaluate

    from hf_seqrl.rewards import load_evaluate_module
    from hf_seqrl.rewards.convention import check_reward_spec

    def offline(path, **kwargs):
        raise FileNotFoundError(f"Couldn't find a module script at {path}. Module '{path}' doesn't exist on the "
                                "Hugging Face Hub either.")

    monkeypatch.setattr(evaluate, "load", offline)
    with pytest.raises(RuntimeError, match=r"Hugging Face Hub, which is not reachable here.*reward_funcs='bleu'"):
        load_evaluate_module("sacrebleu")
    with pytest.raises(ValueError, match=r"unknown reward 'sacrebleu'. Did you mean 'bleu'\?"):
        check_reward_spec("sacrebleu")


@pytest.mark.parametrize("family", ["seq2seq", "causal"])
def test_truncation_is_counted_in_one_warning(tmp_path, family):
    from helpers import tiny_causal_model

    columns = ("source", "target") if family == "seq2seq" else ("prompt", "completion")
    data = Dataset.from_dict({columns[0]: ["a" * 10_000, "short", "b" * 70], columns[1]: ["x", "y" * 40, "z"]})
    model = tiny_model("t5") if family == "seq2seq" else tiny_causal_model()
    limits = (dict(max_source_length=64, max_target_length=16) if family == "seq2seq"
              else dict(max_prompt_length=64, max_completion_length=16))
    with pytest.warns(UserWarning, match=rf"train_dataset: 2 of 3 {columns[0]}s cut to 64 tokens and 1 of 3 "
                                         rf"{columns[1]}s cut to 16 tokens"):
        trainer = build(tmp_path, model, data=data, **limits)
    assert "cut_to_max_length" not in trainer.train_dataset.column_names  # the count's column is gone


def test_half_precision_weights_are_warned_of_once_with_the_fix(tmp_path, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="hf_seqrl"):
        build(tmp_path, tiny_model("t5").to(torch.bfloat16))
    assert caplog.text.count("no fp32 master copy") == 1
    assert "dtype=torch.float32" in caplog.text and "SeqRLConfig(bf16=True)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hf_seqrl"):
        build(tmp_path, tiny_model("t5"))
    assert "master copy" not in caplog.text


# ---- ids the model has no embedding for -------------------------------------------------------------------------

def m2m100_built_with_len_of_its_tokenizer(tmp_path):
    """An M2M100 tokenizer translating de -> en and a model whose embeddings hold `len(tokenizer)` rows: its language
    tokens (`__de__`, `__en__`, ...) lie past them."""
    from helpers import multilingual_model, multilingual_tokenizer

    tokenizer = multilingual_tokenizer("m2m100", tmp_path / "spm", src_lang="de", tgt_lang="en")
    model = multilingual_model(tokenizer)
    model.resize_token_embeddings(len(tokenizer))
    return tokenizer, model


def pairs_data():
    return Dataset.from_dict({"source": ["ein hund", "eine katze", "ein buch", "der mann"],
                              "target": ["a dog", "a cat", "a book", "the man"]})


def test_an_m2m100_whose_embedding_leaves_out_the_language_tokens_is_refused_with_the_size_to_grow_to(tmp_path):
    tokenizer, model = m2m100_built_with_len_of_its_tokenizer(tmp_path)
    needed = max(tokenizer.lang_code_to_id.values()) + 1
    assert len(tokenizer) < needed  # what `vocab_size=len(tokenizer)` leaves out
    with pytest.raises(ValueError, match=rf"SCSTTrainer: the tokenizer \(M2M100Tokenizer\) writes ids up to "
                                         rf"{needed - 1} \('__\w+__' of its lang_\w+_to_id\), past len\(tokenizer\) = "
                                         rf"{len(tokenizer)}, but the model's .* has {len(tokenizer)} rows.*"
                                         rf"model.resize_token_embeddings\({needed}\)"):
        build(tmp_path, model, data=pairs_data(), tokenizer=tokenizer)
    model.resize_token_embeddings(needed)  # the fix the error names: one step trains
    trainer = build(tmp_path, model, data=pairs_data(), tokenizer=tokenizer, max_steps=1, max_new_tokens=4)
    trainer.train()
    assert trainer.state.global_step == 1


def test_hf_seqrl_train_refuses_that_m2m100_before_training(tmp_path, capsys):
    import re

    from hf_seqrl.cli import main

    tokenizer, model = m2m100_built_with_len_of_its_tokenizer(tmp_path)
    model.save_pretrained(tmp_path / "m2m100")
    tokenizer.save_pretrained(tmp_path / "m2m100")
    write_jsonl(tmp_path / "train.jsonl", [{"source": s, "target": t} for s, t in zip(*pairs_data()[:].values())])
    assert main(["train", "--model_name_or_path", str(tmp_path / "m2m100"), "--train_file",
                 str(tmp_path / "train.jsonl"), "--src_lang", "de", "--tgt_lang", "en", "--output_dir",
                 str(tmp_path / "out"), "--max_steps", "1", "--report_to", "none", "--use_cpu", "true"]) == 2
    err = capsys.readouterr().err
    assert "hf-seqrl train: error: " in err and "Traceback" not in err
    assert re.search(r"writes ids up to .* past len\(tokenizer\) = .*resize_token_embeddings", err)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("checkpoint-*"))


def test_a_model_larger_than_its_tokenizer_and_added_tokens_within_it_are_taken(tmp_path):
    from hf_seqrl.models.tiny import build_tiny_model
    from hf_seqrl.trainers.services.inputs import largest_tokenizer_id

    tokenizer = byt5_tokenizer()
    assert largest_tokenizer_id(tokenizer) == (383, "the last of its 384 tokens")
    tokenizer.add_tokens(["<new>"])  # id 384: the model's 400 rows hold it
    larger = build_tiny_model("marian", vocab_size=400, d_model=16, layers=1, pad_token_id=0, eos_token_id=1)
    assert build(tmp_path, larger, tokenizer=tokenizer).train_dataset.num_rows == 4


def test_pretokenized_rows_with_ids_past_the_embeddings_are_named(tmp_path):
    tokenizer = byt5_tokenizer()
    data = toy_dataset(tokenizer, *toy_pairs(4, seed=1))
    labels = list(data["labels"])
    labels[2] = labels[2][:-1] + [500, 1]  # made with a larger tokenizer
    data = data.remove_columns("labels").add_column("labels", labels)
    with pytest.raises(ValueError, match=r"train_dataset row 2: 'labels' holds id 500, but the model has 384 rows "
                                         r"of embeddings \(ids 0..383\).*model's own tokenizer"):
        build(tmp_path, tiny_model("t5"), data=data)


# ---- text columns: named when missing, typed row by row ---------------------------------------------------------

def test_a_source_column_that_is_not_there_is_named_with_the_columns(tmp_path):
    with pytest.raises(ValueError, match=r"train_dataset has no column 'sorce' \(SeqRLConfig.source_column; its "
                                         r"columns: \['source', 'target'\]\).*did you mean 'source'\?"):
        build(tmp_path, tiny_model("t5"), source_column="sorce")


# (family, the dataset's columns, the config's fields, exception, what the error says)
TEXT_CELLS = [
    ("seq2seq", {"source": ["ab", "cd", "ef"], "target": ["ab", None, "ef"]}, {}, ValueError,
     r"train_dataset row 1: column 'target' holds None"),
    ("seq2seq", {"source": ["ab", "cd", "ef"], "target": [1, 2, 3]}, {}, TypeError,
     r"train_dataset row 0: column 'target' holds an int \(1\)"),
    ("seq2seq", {"source": ["ab", "cd", "ef"], "target": [["ab"], ["cd", None], ["ef"]]}, {}, ValueError,
     r"row 1: column 'target' holds a list holding None"),
    ("seq2seq", {"source": ["ab", "cd", "ef"], "target": [[1], [2], [3]]}, {}, TypeError,
     r"row 0: column 'target' holds a list holding an int \(1\)"),
    ("seq2seq", {"source": ["ab", "cd", "ef"], "target": ["ab", "", "ef"]}, {}, ValueError,
     r"row 1: column 'target' holds an empty string"),
    ("seq2seq", {"source": [1.5, 2.5, 3.5], "target": ["ab", "cd", "ef"]}, {}, TypeError,
     r"row 0: column 'source' holds a float \(1.5\)"),
    ("seq2seq", {"src": ["ab", None, "ef"], "tgt": ["ab", "cd", "ef"]},
     dict(source_column="src", target_column="tgt"), ValueError, r"row 1: column 'src' holds None"),
    ("causal", {"prompt": ["ab=", None, "ef="], "completion": ["ab", "cd", "ef"]}, {}, ValueError,
     r"row 1: column 'prompt' holds None, but each cell must be a string or a list of chat messages"),
    ("causal", {"prompt": [["ab", "x"], ["cd"], ["ef"]], "completion": ["ab", "cd", "ef"]}, {}, ValueError,
     r"row 0: column 'prompt' holds a list holding a string \('ab'\)"),
    ("causal", {"prompt": ["ab=", "cd=", "ef="], "completion": [7, 8, 9]}, {}, TypeError,
     r"row 0: column 'completion' holds an int \(7\)"),
    # tokenized rows: the text columns the rewards read
    ("tokenized", {"references": ["ab", None, "ef"]}, {}, ValueError, r"row 1: column 'references' holds None"),
    ("tokenized", {"references": [["ab"], [], ["ef"]]}, {}, ValueError,
     r"row 1: column 'references' holds an empty list"),
    ("tokenized", {"sources": [1, 2, 3]}, {}, TypeError, r"row 0: column 'sources' holds an int \(1\)"),
]


@pytest.mark.parametrize("family,columns,fields,error,message", TEXT_CELLS)
def test_a_text_cell_of_the_wrong_type_is_named_by_row_and_column(tmp_path, family, columns, fields, error, message):
    from helpers import tiny_causal_model

    if family == "tokenized":
        data = toy_dataset(byt5_tokenizer(), *toy_pairs(3, seed=1))
        for name, values in columns.items():
            data = data.add_column(name, values)
    else:
        data = Dataset.from_dict(columns)
    model = tiny_causal_model() if family == "causal" else tiny_model("t5")
    with pytest.raises(error, match=message):
        build(tmp_path, model, data=data, **fields)


def test_rows_are_counted_over_the_whole_dataset_and_the_evaluation_split_is_named(tmp_path):
    sources, targets = toy_pairs(1004, seed=1)
    targets[1002] = None  # in the second batch of the tokenizing map
    with pytest.raises(ValueError, match=r"^train_dataset row 1002: column 'target' holds None"):
        build(tmp_path, tiny_model("t5"), data=Dataset.from_dict({"source": sources, "target": targets}))
    evaluation = Dataset.from_dict({"source": ["ab", "cd"], "target": [["ab"], []]})
    with pytest.raises(ValueError, match=r"^eval_dataset row 1: column 'target' holds an empty list"):
        SCSTTrainer(model=tiny_model("t5"), args=make_config(SeqRLConfig, tmp_path), reward_funcs="chrf",
                    processing_class=byt5_tokenizer(), train_dataset=text_data(), eval_dataset=evaluation)


# ---- a teacher that does not load, LoRA targets the model lacks, a token-level reward for MRT -----------------

def test_a_teacher_hub_id_offline_names_teacher_model_and_keeps_the_loaders_message(tmp_path, monkeypatch):
    import huggingface_hub

    from hf_seqrl import DistillationConfig, DistillationTrainer

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OSError, match=r"(?s)teacher_model='some-org/no-such-teacher' \(the trainer's teacher_model "
                                      r"argument; hf-seqrl train --teacher_model\), loaded with "
                                      r"DistillationConfig.teacher_model_init_kwargs, could not be loaded: .*"
                                      r"HF_HUB_OFFLINE is set") as error:
        DistillationTrainer(model=tiny_model("t5"), args=make_config(DistillationConfig, tmp_path),
                            teacher_model="some-org/no-such-teacher", processing_class=byt5_tokenizer(),
                            train_dataset=text_data())
    assert isinstance(error.value.__cause__, OSError)  # the loader's own error, kept


def with_lora(tmp_path, model, peft_config):
    return SCSTTrainer(model=model, args=make_config(SeqRLConfig, tmp_path), reward_funcs="chrf",
                       processing_class=byt5_tokenizer(), train_dataset=text_data(), peft_config=peft_config)


def test_lora_target_modules_the_model_lacks_are_named_with_the_ones_it_has(tmp_path):
    peft = pytest.importorskip("peft")

    for targets in (["q", "vv"], ["query"]):  # peft drops "vv" from the first without a word
        with pytest.raises(ValueError, match=r"peft_config.target_modules=.* \(hf-seqrl train --lora_target_modules\): "
                                             r"'(vv|query)' is no module of the model. The linear layers of "
                                             r"T5ForConditionalGeneration, by the names target_modules takes: k, "
                                             r"lm_head, o, q, v, wi, wo\."):
            with_lora(tmp_path, tiny_model("t5"), peft.LoraConfig(r=2, target_modules=targets))
    # no target_modules and no default of peft's for the model type
    with pytest.raises(ValueError, match=r"target_modules=None .*Please specify `target_modules`.*MarianMTModel.* "
                                         r"q_proj, v_proj"):
        with_lora(tmp_path, tiny_model("marian"), peft.LoraConfig(r=2))


@pytest.mark.parametrize("rewards", ["token_match", ["chrf", "token_match"], "guarded"])
def test_mrt_refuses_a_token_level_reward_when_it_is_built(tmp_path, rewards):
    from hf_seqrl import MRTConfig, MRTTrainer
    from hf_seqrl.rewards import guard, token_match_reward

    if rewards == "guarded":
        rewards = guard(token_match_reward(), "length_ratio")
    with pytest.raises(ValueError, match=r"MRTTrainer: reward_funcs holds the token-level reward 'token_match', which "
                                         r"MRT cannot use.*SCSTTrainer"):
        MRTTrainer(model=tiny_model("t5"), args=make_config(MRTConfig, tmp_path, num_samples=2), reward_funcs=rewards,
                   processing_class=byt5_tokenizer(), train_dataset=text_data())


def test_hf_seqrl_train_names_a_model_that_does_not_load(tmp_path, capsys, monkeypatch):
    from hf_seqrl.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_jsonl(tmp_path / "train.jsonl", [{"source": "a", "target": "b"}])
    assert main(["train", "--model_name_or_path", "nobody/no-such-model", "--train_file", str(tmp_path / "train.jsonl"),
                 "--output_dir", str(tmp_path / "out"), "--max_steps", "1", "--report_to", "none"]) == 2
    err = capsys.readouterr().err
    assert "--model_name_or_path 'nobody/no-such-model'" in err and "could not be loaded" in err
