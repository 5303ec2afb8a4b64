"""Bad input met before the first step (or at the failing reward call) with a message naming the field or row and the
fix: ids outside the model's embeddings, empty datasets, rows the CLI reads but cannot train on, a reward that raises
(and the checkpoint it leaves), an `evaluate` metric that needs the Hub."""

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

    from hf_seqrl.rewards import check_reward_spec, load_evaluate_module

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
