"""benchmarks/gpu_check.py --device cpu --quick runs every check end to end (no compilation) and writes its JSON and
its markdown table; the values it reports hold together."""

from __future__ import annotations

import json

import pytest

from helpers import run_benchmark


@pytest.mark.slow
def test_gpu_check_runs_on_the_cpu_at_tiny_shapes(tmp_path):
    output = tmp_path / "gpu_check.json"
    result, seconds = run_benchmark("gpu_check.py", "--device", "cpu", "--quick", "--output", output, timeout=120)
    print(f"gpu_check.py --device cpu --quick: {seconds:.0f} s")
    assert result.returncode == 0, result.stderr[-4000:]
    assert seconds < 120
    data = json.loads(output.read_text())
    assert data["command"] == f"python benchmarks/gpu_check.py --device cpu --quick --output {output}"
    assert data["errors"] == {}  # every check ran
    decode = {(row["model"], row["rows"]): row for row in data["decode"]}
    assert set(decode) == {(model, rows) for model in ("seq2seq", "causal") for rows in (4, 8)}
    for row in decode.values():
        assert row["hf_seqrl_ms_per_token"] > 0 and row["generate_ms_per_token"] > 0
        assert "generate_static_compiled_ms_per_token" not in row  # --quick compiles nothing
        # a decode of 4 tokens looks at the device once (SYNC_EVERY = 4) plus its fixed syncs around the loop
        assert 0 < row["syncs_per_token"] <= 2
    assert {(row["model"], row["gradient_checkpointing"]) for row in data["scst_step"]} == {
        (model, on) for model in ("seq2seq", "causal") for on in (False, True)}
    assert all(row["step_s"] > 0 for row in data["scst_step"])
    invariance = data["batch_invariance"]
    assert 0 <= invariance["equal_rows_compaction_on_vs_off"] <= 1
    assert 0 <= invariance["equal_rows_one_decode_vs_four"] <= 1
    assert data["comet"]["ms_per_sample"] > 0
    table = output.with_suffix(".md").read_text()
    assert "| decode ms/token, hf-seqrl | seq2seq, 4 rows |" in table and "COMET ms/sample" in table
    assert result.stdout.count("\n| ") >= 20  # the table, printed
