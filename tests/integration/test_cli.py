"""The `hf-seqrl` command line: every subcommand parses snake_case flags into a dataclass, `train` runs the recipes'
code path, `evaluate` scores a checkpoint."""

import json
import os

import pytest

from helpers import REPO
from hf_seqrl.cli import main

ROOT = REPO


def test_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("demo", "train", "evaluate", "diagnose"))
    with pytest.raises(SystemExit) as exit_info:
        main(["nonsense"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("command, flags", [
    ("demo", ["--output_dir", "--seed", "--quick"]),
    ("evaluate", ["--model", "--data", "--source_column", "--target_column", "--metrics", "--num_beams",
                  "--batch_size", "--max_new_tokens", "--max_source_length", "--max_examples", "--output",
                  "--predictions", "--device"]),
    ("diagnose", ["--model", "--data", "--source_column", "--target_column", "--output_dir", "--max_examples",
                  "--metric", "--max_horizon", "--inject_positions", "--batch_size", "--max_new_tokens", "--device"]),
])
def test_each_subcommand_help_lists_its_snake_case_flags(command, flags, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: hf-seqrl {command}")
    assert all(flag in out for flag in flags), [flag for flag in flags if flag not in out]


def test_subcommands_parse_into_dataclasses_and_validate_fields(monkeypatch, capsys):
    import hf_seqrl.cli.demo
    import hf_seqrl.cli.diagnose
    import hf_seqrl.cli.evaluate

    seen = {}
    monkeypatch.setattr(hf_seqrl.cli.demo, "run_demo", lambda output_dir, seed, quick: seen.update(demo=(output_dir, seed,
                                                                                                      quick)))
    monkeypatch.setattr(hf_seqrl.cli.evaluate, "evaluate_from_args", lambda args: seen.update(evaluate=args) or 0)
    monkeypatch.setattr(hf_seqrl.cli.diagnose, "diagnose_from_args", lambda args: seen.update(diagnose=args) or 0)
    assert main(["demo", "--output_dir", "x", "--seed", "3", "--quick"]) == 0 and seen["demo"] == ("x", 3, True)
    assert main(["evaluate", "--model", "m", "--data", "d.jsonl", "--metrics", "chrf", "rougeL", "--num_beams",
                 "4"]) == 0
    assert (seen["evaluate"].metrics, seen["evaluate"].num_beams, seen["evaluate"].batch_size) == (["chrf", "rougeL"],
                                                                                                   4, 32)
    assert main(["diagnose", "--model", "m", "--data", "d.jsonl", "--inject_positions", "0", "3"]) == 0
    args = seen["diagnose"]
    assert (args.inject_positions, args.metric, args.output_dir, args.max_horizon) == ([0, 3], "bleu",
                                                                                       "hf_seqrl_diagnostics", 20)
    # a field's rule, broken on the command line: one line naming it, exit status 2, no traceback
    for argv, message in ((["evaluate", "--model", "m", "--data", "d", "--metrics", "bleu", "meteor"],
                           "metrics: unknown or no metric ['meteor']"),
                          (["evaluate", "--model", "m", "--data", "d", "--num_beams", "0"], "num_beams must be >= 1"),
                          (["diagnose", "--model", "m", "--data", "d", "--metric", "meteor"],
                           "metric='meteor' is not supported"),
                          (["diagnose", "--model", "m", "--data", "d", "--inject_positions", "-1"],
                           "inject_positions must all be >= 0"),
                          (["diagnose", "--model", "m", "--data", "d", "--batch_size", "0"], "batch_size must be >= 1")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"hf-seqrl {argv[0]}: error: ") and message in err and "Traceback" not in err
    with pytest.raises(SystemExit):  # --model is required
        main(["diagnose", "--data", "d"])


def test_train_subcommand_runs_a_yaml_config(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the tiny config names its data files relative to the repository
    config = os.path.join("recipes", "configs", "tiny_offline_translation.yaml")
    assert main(["train", "--config", config, "--output_dir", str(tmp_path), "--max_steps", "2",
                 "--warmup_xe_steps", "1", "--max_train_samples", "8", "--max_eval_samples", "4",
                 "--max_test_samples", "4", "--eval_strategy", "no"]) == 0
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "README.md").exists()
    results = json.loads((tmp_path / "all_results.json").read_text())
    assert any(key.startswith("test_") for key in results)


def test_train_xe_is_plain_cross_entropy_and_an_scst_run_all_in_its_warm_up_says_so(tmp_path, monkeypatch):
    """`--algorithm xe` (a teacher, a sequence-level KD student) trains with cross-entropy alone, the YAML's reward
    ignored with a warning; the default SCST with `warmup_xe_steps >= max_steps` is cross-entropy too, and its card
    and seqrl_run.json say so, not SCST with a reward and a baseline."""
    monkeypatch.chdir(ROOT)
    config = os.path.join("recipes", "configs", "tiny_offline_translation.yaml")
    common = ["--max_steps", "2", "--max_train_samples", "8", "--eval_strategy", "no", "--validation_file", "",
              "--test_file", "", "--tiny_d_model", "32"]
    with pytest.warns(UserWarning, match=r"reward_funcs=\['chrf'\] apply to the rewarded algorithms; algorithm='xe'"):
        assert main(["train", "--config", config, "--algorithm", "xe", "--output_dir", str(tmp_path / "xe"),
                     *common]) == 0
    assert main(["train", "--config", config, "--output_dir", str(tmp_path / "scst"), *common]) == 0  # warm-up: 200
    for name, trainer in (("xe", "CrossEntropyTrainer"), ("scst", "SCSTTrainer")):
        card = (tmp_path / name / "README.md").read_text()
        training = json.loads((tmp_path / name / "seqrl_run.json").read_text())["training"]
        assert "fine-tuned with **Cross-entropy**" in card and "- Reward:" not in card and "- Baseline:" not in card
        assert (training["trainer"], training["algorithm"], training["reward"], training["baseline"]) == (
            trainer, "xe", None, None)
    assert "SCSTTrainer's REINFORCE with leave-one-out baseline never ran: warmup_xe_steps=200 covers all 2" in \
        (tmp_path / "scst" / "README.md").read_text()


@pytest.mark.slow
def test_train_distills_from_a_teacher_folder(tmp_path, monkeypatch, capsys):
    """`--algorithm distill --teacher_model FOLDER` on the tiny YAML: a student trained toward a saved teacher (with
    the YAML's chrF reward beside it), whose card names the teacher; a teacher given to a trainer that takes none and
    distillation without a teacher are refused."""
    from helpers import tiny_model

    monkeypatch.chdir(ROOT)
    tiny_model("t5", seed=3, d_model=64).save_pretrained(tmp_path / "teacher")
    config = os.path.join("recipes", "configs", "tiny_offline_translation.yaml")
    common = ["--output_dir", str(tmp_path / "out"), "--max_steps", "2", "--warmup_xe_steps", "1",
              "--max_train_samples", "8", "--max_eval_samples", "4", "--max_test_samples", "4", "--eval_strategy",
              "no", "--max_new_tokens", "8", "--generation_max_length", "8"]
    assert main(["train", "--config", config, "--algorithm", "distill", "--teacher_model", str(tmp_path / "teacher"),
                 "--beta", "0.5", *common]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"- Teacher: `{tmp_path / 'teacher'}`" in card and "- Reward: `chrf`" in card
    assert "fine-tuned with **On-policy distillation**" in card
    for flags, message in ((["--algorithm", "scheduled_sampling", "--teacher_model", "x"], "takes no teacher"),
                           (["--algorithm", "distill"], "algorithm='distill' needs teacher_model")):
        capsys.readouterr()
        assert main(["train", "--config", config, *flags, *common]) == 2
        assert message in capsys.readouterr().err


def test_evaluate_subcommand_scores_against_every_reference(tmp_path, capsys):
    from helpers import byt5_tokenizer, tiny_model
    from hf_seqrl.evaluation import corpus_scores

    model, tok = tiny_model("marian"), byt5_tokenizer()
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    sources = ["abc", "a much longer source", "xy"]
    references = [["abc", "abd"], ["a longer one"], ["xy"]]
    data = tmp_path / "test.jsonl"
    data.write_text("\n".join(json.dumps({"src": s, "refs": r}) for s, r in zip(sources, references)))
    out, preds = tmp_path / "scores.json", tmp_path / "preds.jsonl"
    assert main(["evaluate", "--model", str(tmp_path / "model"), "--data", str(data), "--source_column", "src",
                 "--target_column", "refs", "--metrics", "chrf", "rougeL", "--num_beams", "2", "--batch_size", "2",
                 "--max_new_tokens", "6", "--output", str(out), "--predictions", str(preds)]) == 0
    rows = [json.loads(line) for line in preds.read_text().splitlines()]
    assert [r["source"] for r in rows] == sources and [r["references"] for r in rows] == references
    # the same outputs, one source at a time with a plain generate call
    expected = [tok.decode(model.generate(**tok(s, return_tensors="pt"), num_beams=2, do_sample=False,
                                          max_new_tokens=6)[0], skip_special_tokens=True).strip() for s in sources]
    assert [r["prediction"] for r in rows] == expected
    scores = json.loads(out.read_text())
    assert scores["scores"] == corpus_scores(expected, references, ("chrf", "rougeL"))
    assert scores["decoding"] == "beam 2" and scores["num_examples"] == 3
    assert "chrf" in capsys.readouterr().out


def distill_data_files(tmp_path, rows=None):
    """Returns `(rows, argv)`: a tiny T5 teacher saved in `tmp_path/teacher`, a data file of `rows` and the
    `hf-seqrl distill-data` argv that decodes it (beam 2, 6 new tokens) into `tmp_path/teacher.jsonl`."""
    from helpers import byt5_tokenizer, tiny_model

    tiny_model("t5", seed=3).save_pretrained(tmp_path / "teacher")
    byt5_tokenizer().save_pretrained(tmp_path / "teacher")
    data = tmp_path / "pairs.jsonl"
    rows = rows or [{"source": s, "target": t, "id": i} for i, (s, t) in enumerate(
        [("abc", "cba"), ("dd", "dd"), ("abcd", "dcba"), ("b", "b"), ("ca", "ac")])]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows, ["distill-data", "--teacher", str(tmp_path / "teacher"), "--data", str(data), "--output",
                  str(tmp_path / "teacher.jsonl"), "--num_beams", "2", "--max_new_tokens", "6", "--device", "cpu"]


def test_distill_data_writes_the_teachers_beams_and_continues_where_it_stopped(tmp_path, capsys):
    """`hf-seqrl distill-data`: every column of the data kept, the teacher's beam decode beside it and the decode
    settings in a record beside the file; a second run with the same settings on a longer slice continues the file
    (the first rows untouched), a file from other data is refused."""
    rows, common = distill_data_files(tmp_path)
    output = tmp_path / "teacher.jsonl"
    assert main([*common, "--max_examples", "3"]) == 0
    first = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["id"] for r in first] == [0, 1, 2] and all(r["target"] == rows[r["id"]]["target"] for r in first)
    assert all(isinstance(r["teacher_target"], str) for r in first)
    record = json.loads((tmp_path / "teacher.jsonl.settings.json").read_text())
    assert (record["num_beams"], record["max_new_tokens"], record["teacher"]) == (2, 6, str(tmp_path / "teacher"))
    assert main(common) == 0
    assert "wrote 2 rows" in capsys.readouterr().out
    lines = output.read_text().splitlines()
    assert len(lines) == 5 and [json.loads(line) for line in lines[:3]] == first
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({**row, "source": row["source"] + "x"}) + "\n" for row in rows))
    assert main([*common[:4], str(other), *common[5:]]) == 2
    assert "row 0 is not the decode of the data's row 0" in capsys.readouterr().err


def with_flags(argv: list[str], **flags) -> list[str]:
    """Returns `argv` with each `--name value` of `flags` replaced or added (a value of True: a bare flag)."""
    argv = list(argv)
    for name, value in flags.items():
        if f"--{name}" in argv:
            argv[argv.index(f"--{name}") + 1] = str(value)
        else:
            argv += [f"--{name}"] if value is True else [f"--{name}", str(value)]
    return argv


def test_distill_data_refuses_a_file_begun_with_other_settings_naming_them_unless_overwrite(tmp_path, capsys):
    """A file begun with another beam width, length limit or teacher is refused, each differing setting named old →
    new and the file untouched; one without a settings record too; `--overwrite` decodes every row again, giving the
    file a fresh run with those settings writes."""
    from helpers import byt5_tokenizer, tiny_model

    _, common = distill_data_files(tmp_path)
    output, record = tmp_path / "teacher.jsonl", tmp_path / "teacher.jsonl.settings.json"
    assert main([*common, "--max_examples", "3"]) == 0
    begun = output.read_text()
    capsys.readouterr()
    assert main(with_flags(common, num_beams=3, max_new_tokens=5)) == 2
    err = capsys.readouterr().err
    assert "num_beams: 2 → 3" in err and "max_new_tokens: 6 → 5" in err and "--overwrite" in err
    assert "teacher_weights" not in err and output.read_text() == begun
    tiny_model("t5", seed=4).save_pretrained(tmp_path / "retrained")  # another teacher, with the same tokenizer
    byt5_tokenizer().save_pretrained(tmp_path / "retrained")
    assert main(with_flags(common, teacher=tmp_path / "retrained")) == 2
    err = capsys.readouterr().err
    assert "teacher_weights: " in err and str(tmp_path / "retrained") in err and "num_beams" not in err
    assert main(with_flags(common, teacher=tmp_path / "retrained", num_beams=3, overwrite=True)) == 0
    assert json.loads(record.read_text())["num_beams"] == 3 and len(output.read_text().splitlines()) == 5
    fresh = with_flags(common, teacher=tmp_path / "retrained", num_beams=3, output=tmp_path / "fresh.jsonl")
    assert main(fresh) == 0 and output.read_text() == (tmp_path / "fresh.jsonl").read_text()
    record.unlink()  # a file without its record (written before settings were recorded) cannot be continued
    assert main(with_flags(common, teacher=tmp_path / "retrained", num_beams=3)) == 2
    assert "no record of the settings" in capsys.readouterr().err


def test_sequence_level_kd_trains_on_the_teachers_decodes_and_evaluates_on_the_gold_references(tmp_path,
                                                                                               monkeypatch):
    """distill-data, then `hf-seqrl train --target_column teacher_target --eval_target_column target`: the student's
    training rows are the teacher's decodes, the validation (JSON lines) and test (.txt) splits the gold pairs, whose
    loss the final evaluation reports. Without `--eval_target_column` the validation file is refused naming it."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from helpers import target_loss
    from hf_seqrl.cli import train as train_cli

    rows, argv = distill_data_files(tmp_path)
    assert main(argv) == 0
    decoded = [json.loads(line)["teacher_target"] for line in (tmp_path / "teacher.jsonl").read_text().splitlines()]
    gold = [("abcab", "bacba"), ("cd", "dc"), ("bbd", "dbb")]
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps({"source": s, "target": t}) + "\n" for s, t in gold))
    (tmp_path / "test.txt").write_text("".join(f"{t}\t{s}\n" for s, t in gold))  # other pairs than dev's
    built, build_trainer = [], train_cli.build_trainer
    monkeypatch.setattr(train_cli, "build_trainer", lambda *args: built.append(build_trainer(*args)) or built[-1])
    common = ["train", "--tiny_model", "t5", "--train_file", str(tmp_path / "teacher.jsonl"), "--validation_file",
              str(tmp_path / "dev.jsonl"), "--test_file", str(tmp_path / "test.txt"), "--target_column",
              "teacher_target", "--algorithm", "xe", "--max_steps", "2",
              "--learning_rate", "1e-2", "--output_dir", str(tmp_path / "student"), "--report_to", "none",
              "--save_strategy", "no", "--generation_max_length", "4", "--dataloader_pin_memory", "false"]
    assert main([*common, "--eval_target_column", "target"]) == 0
    trainer = built[0]
    assert trainer.train_dataset["references"] == [[text] for text in decoded] and decoded != [r["target"] for r in rows]
    assert trainer.eval_dataset["references"] == [[t] for _, t in gold]
    results = json.loads((tmp_path / "student" / "all_results.json").read_text())
    student, tok = (auto.from_pretrained(tmp_path / "student") for auto in (AutoModelForSeq2SeqLM, AutoTokenizer))
    assert results["eval_loss"] == pytest.approx(target_loss(student, tok, *zip(*gold)), rel=1e-4)
    assert results["test_loss"] == pytest.approx(target_loss(student, tok, *zip(*[(t, s) for s, t in gold])), rel=1e-4)
    with pytest.raises(ValueError, match="validation split of .*dev.jsonl has no column 'teacher_target' .*Set "
                                         "--eval_target_column to one of them"):
        main(common)
