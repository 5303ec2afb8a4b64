"""The `hf-seqrl` command line: subcommands parse, `train` runs the recipes' code path."""

import json
import os

import pytest

from hf_seqrl.cli import build_parser, main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("demo", "train", "evaluate", "diagnose"))
    args = build_parser().parse_args(["demo", "--output-dir", "x", "--quick"])
    assert (args.output_dir, args.quick) == ("x", True)


def test_train_subcommand_runs_a_yaml_config(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the tiny config names its data files relative to the repository
    config = os.path.join("recipes", "configs", "tiny_offline_translation.yaml")
    assert main(["train", "--config", config, "--output_dir", str(tmp_path), "--max_steps", "2",
                 "--warmup_xe_steps", "1", "--max_train_samples", "8", "--max_eval_samples", "4",
                 "--max_test_samples", "4", "--eval_strategy", "no"]) == 0
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "README.md").exists()
    results = json.loads((tmp_path / "all_results.json").read_text())
    assert any(key.startswith("test_") for key in results)


def test_evaluate_subcommand_scores_against_every_reference(tmp_path, capsys):
    from conftest import byt5_tokenizer, tiny_model
    from hf_seqrl.metrics import corpus_scores

    model, tok = tiny_model("marian"), byt5_tokenizer()
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    sources = ["abc", "a much longer source", "xy"]
    references = [["abc", "abd"], ["a longer one"], ["xy"]]
    data = tmp_path / "test.jsonl"
    data.write_text("\n".join(json.dumps({"src": s, "refs": r}) for s, r in zip(sources, references)))
    out, preds = tmp_path / "scores.json", tmp_path / "preds.jsonl"
    assert main(["evaluate", "--model", str(tmp_path / "model"), "--data", str(data), "--source-column", "src",
                 "--target-column", "refs", "--metrics", "chrf", "rougeL", "--num-beams", "2", "--batch-size", "2",
                 "--max-new-tokens", "6", "--output", str(out), "--predictions", str(preds)]) == 0
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
