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
    assert all(name in out for name in ("demo", "train", "diagnose"))
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
