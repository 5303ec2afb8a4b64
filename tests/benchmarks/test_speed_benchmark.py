"""benchmarks/speed.py --quick runs end to end: every arm of both tasks, its table and its JSON."""

from __future__ import annotations

import json
import math

import pytest

from helpers import run_benchmark



@pytest.mark.slow
def test_quick_speed_benchmark_runs_every_arm(tmp_path):
    output = tmp_path / "speed.json"
    result, seconds = run_benchmark("speed.py", "--quick", "--threads", "1", "--output", output)
    print(f"speed.py --quick: {seconds:.0f} s")
    assert result.returncode == 0, result.stderr[-4000:]
    data = json.loads(output.read_text())
    rows = {(row["task"], row["arm"]): row for row in data["results"]}
    arms = ("xe", "seqrl_scst", "seqrl_loo4", "reference_scst", "reference_loo4")
    assert set(rows) == {(task, arm) for task in ("translation", "summarization") for arm in arms}
    for (task, arm), row in rows.items():
        assert row["step_s"] > 0 and row["peak_mem_mib"] > 0, (task, arm)
        assert row["peak_over_logits"] > 0, (task, arm)
        if arm != "xe":
            assert row["parts_s"]["decode"] > 0 and row["parts_s"]["forward_backward"] > 0, (task, arm)
            assert row["syncs_per_token"] > 0, (task, arm)  # counted over a whole step, per decoded position
    header = next(line for line in result.stdout.splitlines() if line.startswith("shape"))
    assert "vs ref" in header and "decode vs" in header and "mem vs XE" in header
    assert "mem/logits" in header and "syncs/tok" in header
    assert data["command"].startswith("python benchmarks/speed.py --quick")
    seqrl_lines = [line.split() for line in result.stdout.splitlines() if " seqrl_" in line]
    assert len(seqrl_lines) == 4 and all(math.isfinite(float(value)) for line in seqrl_lines for value in line[-3:])


@pytest.mark.slow
def test_quick_rollout_batching_benchmark_times_both_arms(tmp_path):
    output = tmp_path / "speed_rollout_batching.json"
    result, _ = run_benchmark("speed.py", "--rollout-batching", "--quick", "--threads", "1", "--rounds", "1",
                              "--output", output)
    assert result.returncode == 0, result.stderr[-4000:]
    data = json.loads(output.read_text())
    arms = data["arms"]
    assert set(arms) == {"per_micro_batch", "batched"}
    assert arms["per_micro_batch"]["steps_per_generation"] == 1 and arms["batched"]["steps_per_generation"] == 4
    for row in arms.values():
        assert row["step_s"] > 0 and row["decode_s"] > 0 and row["decode_ms_per_token"] > 0
        # a timed step decodes 4 micro-batches x 2 sources x (1 sample + greedy), at most 16 tokens each
        assert 0 < row["rounds"][0]["tokens"][0] <= 4 * 2 * 2 * 16
    # the same samples in both arms (per-row keys), so the same tokens written
    assert arms["batched"]["rounds"][0]["tokens"] == arms["per_micro_batch"]["rounds"][0]["tokens"]
    assert arms["per_micro_batch"]["decode_vs_per_micro_batch"] == 1.0
    assert "rows/decode" in result.stdout and data["command"].startswith("python benchmarks/speed.py --rollout-batching")
