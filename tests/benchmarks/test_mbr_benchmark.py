"""The MBR benchmark (benchmarks/mbr.py): its settings and goal check, and its --quick mode end to end on a slice of
Multi30k (slow tier; skips without ../shared/data)."""

import json
import math
import os
import sys

import pytest

from helpers import REPO, SHARED_DATA

sys.path.insert(0, str(REPO / "benchmarks"))
import mbr  # noqa: E402
import quality_lib  # noqa: E402
from quality_lib.decodes import decodings  # noqa: E402


def test_protocol_sizes():
    c = quality_lib.SETTINGS[("translation", False)]
    cpu = mbr.protocol_settings(False, "cpu")
    # C is the quality benchmark's translation C, trained by its protocol
    assert all(getattr(cpu, name) == getattr(c, name) for name in quality_lib.C_FIELDS)
    assert (cpu.anneal_lr, cpu.anneal_max_steps) == (c.anneal_lr, c.anneal_max_steps)
    assert cpu.seeds == (0, 1, 2) and (cpu.mbr_samples, cpu.mbr_utility, cpu.mbr_epsilon) == (16, "chrf", 0.02)
    assert set(mbr.ARMS) <= set(quality_lib.ARM_TRAINERS)


def _arm(mean, low, high):
    return {"greedy": {"bleu": {"mean": mean, "min": low, "max": high}}}


def test_mbr_target_by_hand():
    decodes = {"test": {"mbr16": {"bleu": 22.0}}}
    arms = {"xe": _arm(20.0, 19.5, 20.4), "mbr_offline": _arm(21.6, 21.2, 21.9), "mbr_online": _arm(21.0, 20.2, 21.5)}
    target = mbr.mbr_target(arms, decodes)
    # mbr_offline is the better by mean: 21.6 - 20.0 = +1.6, its worst seed 21.2 above xe's best 20.4, and C's MBR
    # decoding 22.0 is 0.4 above it (within 0.5)
    assert target == {"best_arm": "mbr_offline", "gain_over_xe": 1.6, "outside_xe_spread": True, "c_decoding": "mbr16",
                      "c_decoding_bleu": 22.0, "distance_to_c_decoding": 0.4, "met": True}
    # alone, mbr_online gains +1.0 but its worst seed 20.2 lies inside xe's spread, and it is 1.0 below C's MBR
    online = mbr.mbr_target({"xe": arms["xe"], "mbr_online": arms["mbr_online"]}, decodes)
    assert online["gain_over_xe"] == 1.0 and not online["outside_xe_spread"] and online["distance_to_c_decoding"] == 1.0
    assert not online["met"]
    assert mbr.mbr_target({"xe": arms["xe"]}, decodes) == {}  # no MBR arm to compare


FIELDS = ("steps", "positions", "train_seconds", "unit_seconds", "dev", "greedy", "beam4", "diagnostics")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED_DATA, "multi30k")),
                    reason="../shared/data/multi30k is absent")
def test_mbr_quick(tmp_path, capsys, monkeypatch):
    out = tmp_path / "m.json"
    argv = ["--quick", "--data-dir", SHARED_DATA, "--work-dir", str(tmp_path / "w"), "--output", str(out),
            "--jobs", "1", "--threads", "1", "--c-threads", "1"]
    results = mbr.main(argv)
    assert list(results["arms"]) == list(mbr.ARMS)
    assert sorted(r["arm"] for r in results["runs"]) == sorted(mbr.ARMS)
    budget = results["settings"]["budget_positions"]
    for run in results["runs"]:
        assert all(field in run for field in FIELDS) and run["positions"] >= budget
        for decoding in ("dev", "greedy", "beam4"):
            assert all(math.isfinite(run[decoding][m]) and 0 <= run[decoding][m] <= 100 for m in ("bleu", "chrf"))
    # the offline arm's picks: decoded once, their decoder positions in its budget
    offline = next(r for r in results["runs"] if r["arm"] == "mbr_offline")
    assert offline["decode_positions"] == results["mbr_picks"]["decode_positions"] > 0
    assert results["mbr_picks"]["rows"] == results["settings"]["mbr_train_sources"]
    # the decodes table: every decoding on test and dev, scored, with its cost per source
    for split in ("test", "dev"):
        assert list(results["decodes"][split]) == list(decodings())
        for name, row in results["decodes"][split].items():
            assert 0 <= row["bleu"] <= 100 and 0 <= row["chrf"] <= 100 and row["positions"] > 0
            assert row["candidate_seconds"] > 0 and row["selection_seconds"] >= 0
    test = results["decodes"]["test"]
    assert test["mbr32"]["candidates"] == 32 and test["qe16"]["selection"]["qe_reward"] == "teacher_likelihood"
    assert test["qe16"]["candidate_seconds"] == test["mbr16"]["candidate_seconds"]  # the same samples
    assert set(results["target"]) >= {"best_arm", "gain_over_xe", "outside_xe_spread", "distance_to_c_decoding", "met"}
    assert results["target_chrf"]["c_decoding_chrf"] == results["decodes"]["test"]["mbr16"]["chrf"]
    assert results["command"].startswith("python benchmarks/mbr.py --quick")
    assert "| mbr16 | 16 |" in results["markdown"] and "unit 4/4" in capsys.readouterr().out
    with open(out) as f:
        assert json.load(f)["runs"] == results["runs"]

    # the same command again resumes from the cache: nothing trained, decoded or scored again
    def refuse(*args, **kwargs):
        raise AssertionError("a cached stage or unit ran again")

    monkeypatch.setattr(quality_lib.checkpoint, "train_stage", refuse)
    monkeypatch.setattr(mbr, "run_arm", refuse)
    monkeypatch.setattr(mbr, "evaluate", refuse)
    monkeypatch.setattr("hf_seqrl.evaluation.write_teacher_outputs", refuse)
    monkeypatch.setattr("hf_seqrl.candidates.source_candidates", refuse)
    monkeypatch.setattr("hf_seqrl.evaluation.generate_texts", refuse)
    again = mbr.main(argv)
    assert again["runs"] == results["runs"] and again["decodes"] == results["decodes"]
    assert again["stage_seconds"] == results["stage_seconds"]
    assert "units: 4 of 4 cached, 0 to run" in capsys.readouterr().out
