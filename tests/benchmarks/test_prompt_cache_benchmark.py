"""benchmarks/prompt_cache.py runs end to end: both arms timed, the same completion ids, the command recorded."""

from __future__ import annotations

import json

import pytest

from helpers import run_benchmark


@pytest.mark.slow
def test_prompt_cache_benchmark_times_both_arms_with_the_same_outputs(tmp_path):
    output = tmp_path / "x.json"
    result, _ = run_benchmark("prompt_cache.py", "--rounds", "1", "--prompt-tokens", "31", "--output", output,
                              timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(output.read_text())
    (row,) = data["rows"]
    assert data["device"] == "cpu" and data["command"].startswith("python benchmarks/prompt_cache.py --rounds 1")
    assert row["prompt_tokens"] == 31 and row["shared_ms"] > 0 and row["per_row_ms"] > 0
    assert row["identical_outputs"] and row["all_rows_full"]
    # the shared arm reads the prompts in one more forward call than the per-row arm
    assert row["forward_calls"]["shared"] == row["forward_calls"]["per_row"] + 1
    assert "| 31 |" in result.stdout
