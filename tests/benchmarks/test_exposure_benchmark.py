"""benchmarks/exposure.py --quick end to end: every remedy from one C on the demo task, the comparison table."""

import importlib.util
import json
import math
import os
import sys

import pytest

from helpers import REPO



def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_exposure_quick_runs_every_remedy_from_one_checkpoint(tmp_path):
    exposure = load("exposure")
    out = tmp_path / "exposure.json"
    results = exposure.main(["--task", "demo", "--quick", "--work-dir", str(tmp_path / "work"), "--output", str(out)])
    rows = {row["arm"]: row for row in results["table"]["rows"]}
    assert set(rows) == set(exposure.ARMS)
    assert rows["xe"]["cost_vs_teacher_forcing"] == 1.0
    budget = results["settings"]["budget_positions"]
    for run in results["runs"]:
        assert run["positions"] >= budget and run["steps"] >= 1  # the same budget of decoder positions for all
    for row in rows.values():
        assert row["cost_vs_teacher_forcing"] > 0 and row["seconds_per_step"] > 0
        assert 0 <= row["greedy"]["mean"] <= 100 and 0 <= row["beam4"]["mean"] <= 100
        assert math.isfinite(row["jacobian_growth"]["mean"]) and row["jacobian_growth"]["mean"] > 0
        assert 0 <= row["recovery_rate"]["mean"] <= 1
    with open(out) as f:
        assert json.load(f)["markdown"] == results["markdown"]
    assert results["markdown"].count("\n") == len(rows) + 2  # header, rule, C, one row per remedy
    # The cost of a step, every arm timed in a fresh process from the same C
    cost = exposure.main(["--task", "demo", "--quick", "--work-dir", str(tmp_path / "work"), "--cost",
                          "--arms", "xe", "pc", "kstep2", "--cost-steps", "2", "--cost-rounds", "1",
                          "--output", str(tmp_path / "cost.json")])
    rows = {row["arm"]: row for row in cost["rows"]}
    assert set(rows) == {"xe", "pc", "kstep2"} and rows["xe"]["cost_vs_teacher_forcing"] == 1.0
    for row in rows.values():
        assert len(row["step_seconds"]) == 2 and min(row["step_seconds"]) > 0
    assert rows["kstep2"]["positions_per_step"] > rows["xe"]["positions_per_step"]  # a row per anchor
    assert rows["pc"]["positions_per_step"] == rows["xe"]["positions_per_step"]  # one pass, the same rows


def test_exposure_arms_read_their_settings(tmp_path):
    # Each remedy's trainer gets the benchmark's settings of that arm (professor forcing's adversarial weight,
    # MIXER's rate, mixing weight, temperature and centering, which also name its runs).
    sys.path.insert(0, str(REPO / "benchmarks"))
    import quality_lib as quality
    settings, _ = quality.apply_overrides(quality.SETTINGS[("demo", True)], [
        "pf_adversarial_weight=0.1", "rl_lr=3e-4", "rl_weight=0.5", "rl_temperature=0.7", "center_advantages=true"])
    splits = quality.load_task(settings, str(tmp_path))
    tokenizer = quality.build_tokenizer(settings, splits["train"], str(tmp_path / "tokenizer"))
    dataset = quality.to_dataset(splits["train"][:16], tokenizer, settings)

    def trainer(arm):
        model = quality.build_model(settings, tokenizer)
        return quality.arm_trainer(arm, model, tokenizer, dataset, settings, str(tmp_path / arm), 0, 8.0)

    assert trainer("pf").args.adversarial_weight == 0.1
    mixer = trainer("mixer").args
    assert (mixer.learning_rate, mixer.rl_weight, mixer.temperature, mixer.center_advantages) == (3e-4, 0.5, 0.7, True)
