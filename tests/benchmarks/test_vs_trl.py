"""benchmarks/vs_trl.py's equivalence check: on identical samples, hf-seqrl's leave-one-out step and TRL's RLOOTrainer
have the same advantages and the same gradient. TRL comes with the `dev` extra, so `.ci/run` runs it (slow tier); it
skips where TRL is not installed."""

import os
import sys

import pytest

from helpers import REPO

pytest.importorskip("trl")
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
pytestmark = pytest.mark.slow


def test_leave_one_out_gradient_equals_trl_rloo_on_identical_samples():
    import vs_trl

    result = vs_trl.equivalence()
    assert result["samples"] == vs_trl.PROMPTS_PER_STEP * vs_trl.NUM_GENERATIONS
    assert result["advantages_max_abs_diff"] < 1e-6
    assert result["grad_max_abs"] > 1e-3  # a real gradient, not two zeros
    assert result["grad_equal"], result
