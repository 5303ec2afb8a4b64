"""Every benchmark script takes `--device` (and creates its tensors there); scoring_pass.py runs end to end."""

from __future__ import annotations

import json

import pytest

from helpers import REPO, run_benchmark

# Every script of benchmarks/ but the helper module the others import (no command line of its own) and the guards'
# calibration, which reads text and makes no tensor.
NO_DEVICE = ("counting.py", "guard_calibration.py")
SCRIPTS = sorted(path.name for path in (REPO / "benchmarks").glob("*.py") if path.name not in NO_DEVICE)


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_takes_a_device(script):
    result, _ = run_benchmark(script, "--help", timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--device" in result.stdout


@pytest.mark.slow
def test_scoring_pass_benchmark_compares_chunked_and_whole_logits(tmp_path):
    output = tmp_path / "scoring_pass.json"
    result, _ = run_benchmark("scoring_pass.py", "--rounds", "1", "--steps", "1", "--cases", "t5-small:4",
                              "--device", "cpu", "--output", output, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(output.read_text())
    (row,) = data["rows"]
    assert data["device"] == "cpu" and data["command"].startswith("python benchmarks/scoring_pass.py --rounds 1")
    assert row["chunked_s"] > 0 and row["whole_logits_s"] > 0 and row["logits_mib"] > 0
    # the whole-logits path holds the logits (and their gradient) at once; the chunked one a chunk's worth. At 4
    # samples per source the logits (157 MiB) outweigh the noise of the resident peak; at 1 (63 MiB) they do not
    # (benchmarks/results/scoring_pass.json: 283 MiB chunked, 259 MiB whole).
    assert row["chunked_peak_mib"] < row["whole_logits_peak_mib"]
