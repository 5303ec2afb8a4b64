"""benchmarks/gpu_check.py --device cpu --quick runs every check end to end (no compilation) and writes its JSON and
its markdown table; the values it reports hold together. A quick run writes where it is told, else into a temporary
folder, never into benchmarks/results; its deliberate whole-logits arm warns of nothing; its table says what each row
should show on a CPU and on a GPU."""

from __future__ import annotations

import json
import logging
import os
import sys

import pytest

from helpers import REPO, run_benchmark

sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_check  # noqa: E402

RESULTS = os.path.realpath(REPO / "benchmarks" / "results")


def test_a_quick_run_writes_where_it_is_told_or_into_a_temporary_folder_never_into_the_results(tmp_path):
    quick = gpu_check.parse_args(["--device", "cpu", "--quick"])
    folder = os.path.dirname(os.path.realpath(quick.output))
    assert os.path.isdir(folder) and not folder.startswith(RESULTS) and quick.output.endswith("gpu_check.json")
    named = gpu_check.parse_args(["--quick", "--output_dir", str(tmp_path)])
    assert named.output == str(tmp_path / "gpu_check.json")
    assert gpu_check.parse_args([]).output == os.path.join(gpu_check.RESULTS, "gpu_check.json")  # a full run
    for where in (["--output_dir", str(REPO / "benchmarks" / "results")],
                  ["--output", str(REPO / "benchmarks" / "results" / "quick.json")]):
        with pytest.raises(SystemExit):
            gpu_check.parse_args(["--quick", *where])


def test_the_deliberate_whole_logits_arm_warns_of_nothing(caplog, monkeypatch):
    from hf_seqrl.models import heads

    monkeypatch.setattr(heads, "_warned", set())
    with caplog.at_level(logging.WARNING):
        memory = gpu_check.check_scoring_memory(gpu_check.QUICK, "cpu", 2, 4)
    assert memory["chunked_peak_mib"] >= 0 and memory["whole_logits_peak_mib"] >= 0
    assert not [r for r in caplog.records if r.name.startswith("hf_seqrl")], caplog.text


def test_the_table_says_what_each_row_should_show_on_a_cpu_and_on_a_gpu():
    results = {"errors": {}, "decode": [{"model": "seq2seq", "rows": 4, "hf_seqrl_ms_per_token": 1.0,
                                         "generate_ms_per_token": 2.0, "syncs_per_token": 1.25}],
               "scoring_memory": {"rows": 4, "tokens": 8, "vocab": 8192, "chunked_peak_mib": 9.0,
                                  "chunked_over_logits": 9.0, "whole_logits_peak_mib": 6.0,
                                  "whole_logits_over_logits": 6.0},
               "scst_step": [{"model": "seq2seq", "gradient_checkpointing": True, "bf16": True, "step_s": 0.1,
                              "peak_mib": 3.0}],
               "batch_invariance": {"rows": 8, "equal_rows_compaction_on_vs_off": 1.0,
                                    "equal_rows_one_decode_vs_four": 1.0},
               "comet": {"shape": "tiny", "dtype": "bfloat16", "samples": 4, "ms_per_sample": 3.0}}
    table = gpu_check.markdown(results)
    assert "| check | setting | value | expected on CPU | expected on GPU |" in table
    assert "VmHWM" in table.split("\n")[0]  # the legend: what a CPU's peaks are
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 9
    for cells in rows:
        assert len(cells) == 5 and all(cell.strip(" |") for cell in cells[3:]), cells  # both columns filled
    chunked = next(cells for cells in rows if cells[0] == "| scoring pass peak / logits, chunked")
    assert "above the whole-logits row" in chunked[3] and "below 1" in chunked[4]


@pytest.mark.slow
def test_gpu_check_runs_on_the_cpu_at_tiny_shapes(tmp_path):
    output = tmp_path / "gpu_check.json"
    result, seconds = run_benchmark("gpu_check.py", "--device", "cpu", "--quick", "--output", output, timeout=120)
    print(f"gpu_check.py --device cpu --quick: {seconds:.0f} s")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "whole logits tensor" not in result.stderr  # the whole-logits arm is deliberate
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
