"""`hf-seqrl evaluate` reproduces the trainer's own evaluation from the settings saved with the model
(`seqrl_run.json`), its flags win over them, and prompts that tokenize to nothing are refused with their rows named."""

import json
from functools import partial

import numpy as np
import pytest

from helpers import byt5_tokenizer, make_config, tiny_causal_model, tiny_model, toy_pairs
from hf_seqrl.cli import main
from hf_seqrl.evaluation import RUN_SETTINGS_FILE, build_compute_metrics, settings_changes

STEPS = 200


def write_pairs(path, sources, references):
    with open(path, "w") as f:
        for source, refs in zip(sources, references):
            f.write(json.dumps({"source": source, "target": refs}) + "\n")


def evaluate_cli(*argv):
    """Returns the predictions and the scores file of `hf-seqrl evaluate argv`."""
    assert main(["evaluate", *argv]) == 0
    predictions = argv[argv.index("--predictions") + 1]
    output = argv[argv.index("--output") + 1]
    with open(predictions) as f:
        rows = [json.loads(line) for line in f]
    with open(output) as f:
        return [row["prediction"] for row in rows], json.load(f)


@pytest.mark.parametrize("family", ["seq2seq", "causal"])
def test_evaluate_of_a_saved_run_equals_the_trainers_evaluation(family, tmp_path):
    from datasets import Dataset

    from hf_seqrl import SCSTTrainer, SeqRLConfig

    tok = byt5_tokenizer()
    causal = family == "causal"
    model = tiny_causal_model("llama") if causal else tiny_model("t5", seed=1)
    mark = "=" if causal else ""  # where a decoder-only model's prompt ends
    # Trained to copy 2-5 letters: sources cut to 7 tokens lose nothing in training, but the held-out ones (8-11
    # letters) lose their end (encoder-decoder: the tail; decoder-only: the prompt's start), so cutting changes outputs.
    sources, targets = toy_pairs(16 * STEPS, seed=0, alphabet="abcd", lengths=(2, 5))
    train = Dataset.from_dict({"source": [s + mark for s in sources], "target": targets})
    held_sources, held_targets = toy_pairs(12, seed=5, alphabet="abcd", lengths=(8, 11))
    held_sources = [s + mark for s in held_sources]
    references = [[t, t[::-1]] for t in held_targets]
    held = Dataset.from_dict({"source": held_sources, "target": references})
    limit = {"max_prompt_length": 7} if causal else {"max_source_length": 7}
    args = make_config(SeqRLConfig, tmp_path, max_steps=STEPS, warmup_xe_steps=STEPS, per_device_train_batch_size=16,
                       learning_rate=3e-3, logging_steps=STEPS, predict_with_generate=True, generation_max_length=12,
                       per_device_eval_batch_size=5, save_strategy="steps", save_steps=STEPS, task="translation",
                       **limit)
    trainer = SCSTTrainer(model=model, args=args, reward_funcs="chrf", train_dataset=train, eval_dataset=held,
                          processing_class=tok,
                          compute_metrics=build_compute_metrics(tok, ("bleu", "chrf"), references))
    trainer.train()
    metrics = trainer.evaluate()
    ids = trainer.predict(trainer.eval_dataset).predictions
    expected = [t.strip() for t in tok.batch_decode(np.where(ids < 0, tok.pad_token_id, ids), skip_special_tokens=True)]
    trainer.save_model()
    out = tmp_path / "out"
    saved = json.loads((out / RUN_SETTINGS_FILE).read_text())
    assert saved["family"] == family and saved["generation_max_length"] == 12
    assert saved["max_prompt_length" if causal else "max_source_length"] == 7
    assert (out / f"checkpoint-{STEPS}" / RUN_SETTINGS_FILE).exists()  # checkpoints can be evaluated alike

    data = tmp_path / "heldout.jsonl"
    write_pairs(data, held_sources, references)
    files = ["--predictions", str(tmp_path / "p.jsonl"), "--output", str(tmp_path / "s.json")]
    predictions, scores = evaluate_cli("--model", str(out), "--data", str(data), *files)
    assert predictions == expected
    # the same numbers as the trainer's eval_* metrics (0-100), metrics chosen as the run's task reports them
    assert scores["scores"] == pytest.approx({"bleu": metrics["eval_bleu"], "chrf": metrics["eval_chrf"]}, abs=1e-9)
    assert 0 < metrics["eval_chrf"] <= 100 and 0 < metrics["eval_rl/reward"] <= 1  # rewards keep their 0-1 scale
    assert sorted(scores["from_run_settings"]) == ["max_length", "max_source_length", "task"]

    # Without the run's settings the sources are read whole and decoding has the model's own limit: other outputs.
    uncut, _ = evaluate_cli("--model", str(out), "--data", str(data), "--no_run_settings", *files)
    assert uncut != expected
    # A flag wins over the file: sources cut longer than the run did, the run's generation_max_length kept.
    longer, scores = evaluate_cli("--model", str(out), "--data", str(data), "--max_source_length", "64", *files)
    assert longer != expected and scores["settings"]["max_source_length"] == 64
    assert sorted(scores["from_run_settings"]) == ["max_length", "task"]


def test_run_settings_resolve_by_family_and_flags(tmp_path):
    from types import SimpleNamespace

    from hf_seqrl.cli import parse_command
    from hf_seqrl.cli.evaluate import EvaluateArguments, resolve_settings, task_metrics
    from hf_seqrl.evaluation import read_run_settings, write_run_settings

    config = SimpleNamespace(task="summarization", max_source_length=256, max_prompt_length=None,
                             generation_max_length=64, generation_num_beams=4)
    write_run_settings(str(tmp_path), config, "causal", {"prompt_template": "TL;DR {prompt}", "source_prefix": ""})
    saved = read_run_settings(str(tmp_path))
    assert saved["max_target_length"] is None and "source_prefix" not in saved  # unset pipeline settings left out

    def resolve(*flags, family="causal"):
        return resolve_settings(parse_command("evaluate", EvaluateArguments,
                                              ["--model", str(tmp_path), "--data", "d.jsonl", *flags]), family)

    # A decoder-only run without max_prompt_length cut its prompts to max_source_length (the train pipeline does).
    settings, from_run = resolve()
    assert settings == {"max_source_length": 256, "max_length": 64, "num_beams": 4, "task": "summarization",
                        "prompt_template": "TL;DR {prompt}"}
    assert task_metrics(settings["task"]) == ["rouge1", "rouge2", "rougeL"] and task_metrics(None) == ["bleu", "chrf"]
    settings, from_run = resolve("--num_beams", "1", "--max_new_tokens", "9", "--prompt_template", "{prompt} =")
    assert settings["num_beams"] == 1 and "max_length" not in settings and settings["prompt_template"] == "{prompt} ="
    assert sorted(from_run) == ["max_source_length", "task"]
    assert resolve("--no_run_settings") == ({}, [])
    assert read_run_settings(str(tmp_path / "elsewhere")) == {}


def test_prepare_sources_shapes_text_as_the_pipeline_does():
    from hf_seqrl.evaluation import prepare_sources

    assert prepare_sources(["a"], "seq2seq", source_prefix="summarize: ") == ["summarize: a"]
    assert prepare_sources(["a"], "causal", source_prefix="tl;dr ") == ["tl;dr a"]
    assert prepare_sources(["a"], "causal", prompt_template="{prompt} =", use_chat_template=True) == [
        [{"role": "user", "content": "a ="}]]


def bpe_tokenizer():
    """A tokenizer that reads only the letters a, b, c and silently drops every other character (a BPE model
    without an unknown token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(vocab={"<pad>": 0, "</s>": 1, "a": 2, "b": 3, "c": 4}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>")


def test_prompts_that_tokenize_to_nothing_are_refused_with_their_rows():
    from hf_seqrl.evaluation import generate_texts

    with pytest.raises(ValueError, match=r"2 of 4 prompts tokenize to no token .*rows 1, 3, counted from 0"):
        generate_texts(tiny_causal_model("llama"), bpe_tokenizer(), ["ab", "xyz", "a b", "zz"], max_new_tokens=2,
                       progress=False)


def test_evaluate_refuses_a_folder_whose_tokenizer_reads_no_prompt(tmp_path):
    # A ByT5 tokenizer saved beside a Qwen2 model reloads as Qwen2's own tokenizer, which has none of its tokens.
    folder = tmp_path / "model"
    tiny_causal_model("qwen2").save_pretrained(folder)
    byt5_tokenizer().save_pretrained(folder)
    data = tmp_path / "d.jsonl"
    write_pairs(data, ["abc", "de"], [["abc"], ["de"]])
    with pytest.raises(ValueError, match=r"2 of 2 prompts tokenize to no token .*Qwen2Tokenizer; rows 0, 1"):
        main(["evaluate", "--model", str(folder), "--data", str(data), "--max_new_tokens", "2", "--batch_size", "1"])
    with pytest.raises(ValueError, match=r"2 of 2 prompts tokenize to no token"):
        main(["diagnose", "--model", str(folder), "--data", str(data), "--max_new_tokens", "2",
              "--output_dir", str(tmp_path / "diag")])



def test_the_pipelines_prompt_template_is_saved_with_the_run(tmp_path):
    from hf_seqrl.cli.train import train_main

    sources, targets = toy_pairs(8, seed=0)
    write_pairs(tmp_path / "train.jsonl", sources, targets)
    train_main(["--tiny_model", "llama", "--train_file", str(tmp_path / "train.jsonl"), "--output_dir",
                str(tmp_path / "out"), "--max_steps", "1", "--per_device_train_batch_size", "4", "--report_to", "none",
                "--prompt_template", "{prompt} => ", "--max_new_tokens", "4", "--save_strategy", "no",
                "--algorithm", "scst"])
    saved = json.loads((tmp_path / "out" / RUN_SETTINGS_FILE).read_text())
    assert saved["prompt_template"] == "{prompt} => " and saved["family"] == "causal"


def test_teacher_outputs_are_each_rows_own_beam_decode_in_batches_and_chunks(tmp_path, capsys):
    """`write_teacher_outputs` batches sources of several lengths (`batch_size`), appends `chunk` rows at a time
    behind a progress bar, and each line's decode is the teacher's beam search on that row alone."""
    import torch

    from hf_seqrl.evaluation import write_teacher_outputs

    tok, teacher = byt5_tokenizer(), tiny_model("t5", seed=1)
    with torch.no_grad():  # larger weights: a random model whose decode depends on its source
        for weight in teacher.parameters():
            weight.mul_(3)
    sources, _ = toy_pairs(7, seed=5, alphabet="abcd", lengths=(1, 6))
    rows = [{"source": s, "id": i} for i, s in enumerate(sources)]
    output = tmp_path / "teacher.jsonl"
    assert write_teacher_outputs(teacher, tok, rows, "source", str(output), num_beams=2, batch_size=2, chunk=3,
                                 max_new_tokens=6) == 7
    assert "teacher outputs: 100%" in capsys.readouterr().err
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert [{k: r[k] for k in ("source", "id")} for r in written] == rows
    assert len({r["teacher_target"] for r in written}) > 1  # decodes that differ row to row
    for row in written:
        with torch.no_grad():
            ids = teacher.generate(**tok([row["source"]], return_tensors="pt"), num_beams=2, do_sample=False,
                                   max_new_tokens=6)
        assert row["teacher_target"] == tok.decode(ids[0], skip_special_tokens=True).strip()


def test_settings_changes_name_each_setting_that_differs_old_to_new():
    old = {"num_beams": 4, "max_new_tokens": None, "teacher": "a", "generation_config": {"length_penalty": 1.2}}
    new = {"num_beams": 5, "max_new_tokens": None, "teacher": "b", "generation_config": {"forced_bos_token_id": 7}}
    # the generation config's entries compare one by one; a setting one record lacks reads None
    assert settings_changes(old, new, ignore=("teacher",)) == [
        "num_beams: 4 → 5", "generation_config.forced_bos_token_id: None → 7",
        "generation_config.length_penalty: 1.2 → None"]
    assert settings_changes(old, dict(old)) == []


def test_teacher_outputs_refuse_to_continue_with_other_language_codes_generation_config_or_weights(tmp_path):
    """What `write_teacher_outputs` records beside the file decides whether it continues: the same settings continue
    it; another target language (the tokenizer's code and the forced first token), or retrained weights, are refused
    by name, the file untouched, unless `overwrite=True`."""
    import torch

    from hf_seqrl.evaluation import write_teacher_outputs

    tok, teacher = byt5_tokenizer(), tiny_model("t5", seed=1)
    rows = [{"source": s} for s in toy_pairs(4, seed=5, alphabet="abcd")[0]]
    output = tmp_path / "teacher.jsonl"
    write = partial(write_teacher_outputs, teacher, tok, source_column="source", output=str(output), num_beams=2,
                    max_new_tokens=4, progress=False)
    assert write(rows[:2]) == 2 and write(rows) == 2  # the same settings: continued
    begun = output.read_text()
    tok.tgt_lang, teacher.generation_config.forced_bos_token_id = "en", 5
    with pytest.raises(ValueError, match="tgt_lang: None → 'en'; generation_config.forced_bos_token_id: None → 5"):
        write(rows)
    tok.tgt_lang, teacher.generation_config.forced_bos_token_id = None, None
    with torch.no_grad():
        next(teacher.parameters()).add_(0.01)
    with pytest.raises(ValueError, match=r"teacher_weights: '[0-9a-f]{16}' → '[0-9a-f]{16}'\. Continue it with"):
        write(rows)
    assert output.read_text() == begun
    assert write(rows, overwrite=True) == 4 and len(output.read_text().splitlines()) == 4
