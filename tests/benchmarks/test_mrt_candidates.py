"""benchmarks/mrt_candidates.py: the entropy of Q and the per-source statistics (hand-computed), and a run on the
quick Multi30k C (skips without ../shared/data)."""

import math
import os
import sys

import pytest

from helpers import REPO, SHARED_DATA

sys.path.insert(0, str(REPO / "benchmarks"))
import mrt_candidates  # noqa: E402


def test_q_entropy_is_in_units_of_log_of_the_set_size():
    assert mrt_candidates.q_entropy([-3.0, -3.0, -3.0], 1.0) == pytest.approx(1.0)
    # Q = (0.75, 0.25): H = -(0.75 ln 0.75 + 0.25 ln 0.25) = 0.562335; over ln 2 = 0.811278.
    assert mrt_candidates.q_entropy([math.log(0.75), math.log(0.25)], 1.0) == pytest.approx(0.811278, abs=1e-6)
    # alpha = 0.5 on log-probs (ln 0.9, ln 0.1): Q ∝ (0.9^0.5, 0.1^0.5) = (0.75, 0.25).
    assert mrt_candidates.q_entropy([math.log(0.9), math.log(0.1)], 0.5) == pytest.approx(0.811278, abs=1e-6)
    assert mrt_candidates.q_entropy([-1.0], 1.0) == 0.0


def test_summarize_set_leaves_duplicates_out_of_q():
    stats = mrt_candidates.summarize_set(
        scores=[40.0, 100.0, 40.0], logprobs=[math.log(0.75), math.log(0.25), math.log(0.75)], lengths=[4, 6, 4],
        reference_length=5, texts=["a b c d", "a b c d e f", "a b c d"], alphas=[1.0])
    assert stats["first"] == 40.0 and stats["oracle"] == 100.0 and stats["mean"] == pytest.approx(60.0)
    assert stats["beats_first"] == 1.0 and stats["reaches_reference"] == 1.0 and stats["distinct"] == 2
    assert stats["length_ratio"] == pytest.approx(14 / 3 / 5)
    assert stats["q_entropy@1"] == pytest.approx(0.811278, abs=1e-6)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED_DATA, "multi30k")), reason="../shared/data is absent")
def test_candidate_sets_of_the_quick_c(tmp_path):
    import quality_lib as quality

    work = tmp_path / "w"
    quality.main(["--task", "translation", "--quick", "--data-dir", SHARED_DATA, "--work-dir", str(work),
                  "--runs-only", "--arms", "xe", "--seeds", "0", "--jobs", "1", "--set", "budget_positions=200"])
    settings = quality.SETTINGS[("translation", True)]
    splits = quality.load_task(settings, SHARED_DATA)
    tokenizer = quality.build_tokenizer(settings, splits["train"], str(work / "tokenizer"))
    model = quality.load_model(settings, quality.c_folder(settings, str(work)))
    rows = splits["dev"][:6]
    for kind in ("beam", "sample"):
        sets = list(mrt_candidates.candidate_sets(model, tokenizer, rows, kind, 3, settings, batch_size=4))
        assert [row for row, *_ in sets] == rows
        for row, texts, logprobs, lengths in sets:
            assert len(texts) == len(logprobs) == len(lengths) == 3
            assert all(lp <= 0 and math.isfinite(lp) for lp in logprobs)
