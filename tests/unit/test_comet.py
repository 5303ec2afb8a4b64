"""The native COMET (`hf_seqrl.rewards.comet`) against unbabel-comet 2.2.7 itself.

tests/fixtures/comet holds tiny random checkpoints of each COMET class that unbabel-comet built and scored in an
environment of its own (transformers 4; `make_fixtures.py` says how to run it); unbabel-comet is not installed here.
Every score must equal its `predict` to 1e-5, at batch sizes 1 and 8, with and without references where the class
allows both, and xCOMET's error spans and MQM scores must be its own.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from hf_seqrl.rewards import CometReward
from hf_seqrl.rewards.comet import CometModel, load_comet, read_checkpoint, sparsemax

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "comet"
RECORD = json.loads((FIXTURES / "scores.json").read_text(encoding="utf-8"))
TRIPLES = RECORD["triples"]
CASES = [(name, mode, batch_size) for name, entry in RECORD["models"].items()
         for mode in ("with_references", "without_references") if mode in entry for batch_size in (1, 8)]


@pytest.fixture(scope="module")
def models():
    return {name: load_comet(FIXTURES / name) for name in RECORD["models"]}


def span_keys(spans):
    return [[(s["text"], s["severity"], s["start"], s["end"]) for s in found] for found in spans]


@pytest.mark.parametrize("name, mode, batch_size", CASES)
def test_comet_reward_equals_unbabel_comet_predict(models, name, mode, batch_size):
    recorded = RECORD["models"][name][mode][str(batch_size)]
    with_references = mode == "with_references"
    reward = CometReward(models[name], batch_size=batch_size, use_references=with_references)
    values = reward([t["mt"] for t in TRIPLES], [[t["ref"]] for t in TRIPLES], [t["src"] for t in TRIPLES])
    torch.testing.assert_close(torch.tensor(values, dtype=torch.float64),
                               torch.tensor(recorded["scores"], dtype=torch.float64), atol=1e-5, rtol=0)
    spans = recorded["metadata"].get("error_spans")
    if spans is not None:  # xCOMET: the spans its scores count, each one COMET's own
        assert span_keys(reward.last_error_spans) == span_keys(spans)
        confidences = [s["confidence"] for found in reward.last_error_spans for s in found]
        assert confidences == pytest.approx([s["confidence"] for found in spans for s in found], abs=1e-5)
        assert sum(map(len, spans)) > 50 and {s["severity"] for found in spans for s in found} == {
            "minor", "major", "critical"}
        result = models[name].score([t["src"] for t in TRIPLES], [t["mt"] for t in TRIPLES],
                                    [t["ref"] for t in TRIPLES] if with_references else None, batch_size)
        assert result.mqm_scores == pytest.approx(recorded["metadata"]["mqm_scores"], abs=1e-6)
    else:
        assert reward.last_error_spans is None
    assert "comet" not in sys.modules  # unbabel-comet played no part


def test_the_fixtures_take_every_branch():
    """The recorded scores are spread (so 1e-5 is a sharp test), xCOMET clips some regression scores at 1, and the
    unified scores with references are the mean of the three inputs' scores COMET reports."""
    for name, entry in RECORD["models"].items():
        for mode, by_size in entry.items():
            if mode != "class":
                scores = by_size["8"]["scores"]
                assert max(scores) - min(scores) > 0.05, (name, mode)
    xcomet = RECORD["models"]["xcomet"]["with_references"]["8"]["metadata"]
    assert 0 < sum(s > 1 for s in xcomet["src_scores"]) < len(TRIPLES)
    unified = RECORD["models"]["unified"]["with_references"]["8"]
    parts = (unified["metadata"][k] for k in ("src_scores", "ref_scores", "unified_scores"))
    means = [sum(row) / 3 for row in zip(*parts)]
    assert unified["scores"] == pytest.approx(means, abs=1e-6)


def test_tokenization_equals_unbabel_comet(models):
    from transformers import XLMRobertaTokenizer

    model = models["regression"]
    texts = list(RECORD["token_ids"])
    expected = [RECORD["token_ids"][t] for t in texts]
    assert [ids for ids, _ in model.tokenize(texts)] == expected
    assert max(map(len, expected)) == model.max_positions - 2  # the long texts were truncated
    # transformers 5's own XLM-R pipeline (what a folder without tokenizer.json gets) gives the same ids
    rebuilt = XLMRobertaTokenizer.from_pretrained(FIXTURES / "encoder-xlmr")
    assert rebuilt(texts, truncation=True, max_length=model.max_positions - 2)["input_ids"] == expected


def test_sparsemax_by_hand():
    # (0.3, -0.9, 0.6): the two largest are kept, tau = (0.6 + 0.3 - 1) / 2 = -0.05 -> (0.35, 0, 0.65)
    torch.testing.assert_close(sparsemax(torch.tensor([0.3, -0.9, 0.6])), torch.tensor([0.35, 0.0, 0.65]))
    # far apart: all the mass on the largest; equal: uniform
    torch.testing.assert_close(sparsemax(torch.tensor([2.0, 0.0, -1.0])), torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(sparsemax(torch.full((4,), 0.7)), torch.full((4,), 0.25))


def test_loads_a_checkpoint_file_a_folder_and_a_hub_id(models, monkeypatch):
    import huggingface_hub

    asked = {}

    def snapshot_download(repo_id, allow_patterns=None, **kwargs):
        asked.update(repo_id=repo_id, allow_patterns=allow_patterns)
        return str(FIXTURES / "referenceless")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    sources, translations = [t["src"] for t in TRIPLES], [t["mt"] for t in TRIPLES]
    expected = models["referenceless"].score(sources, translations).scores
    for name in (FIXTURES / "referenceless" / "checkpoints" / "model.ckpt", "Unbabel/wmt20-comet-qe-da"):
        assert load_comet(name).score(sources, translations).scores == pytest.approx(expected, abs=1e-6)
    assert asked == {"repo_id": "Unbabel/wmt20-comet-qe-da", "allow_patterns": ["hparams.yaml", "checkpoints/model.ckpt"]}


def test_pretrained_model_comes_from_the_argument_when_the_checkpoint_names_no_reachable_folder(models, tmp_path):
    moved = tmp_path / "regression"
    shutil.copytree(FIXTURES / "regression", moved)  # its "../encoder-xlmr" is not beside it any more
    with pytest.raises(OSError):
        load_comet(moved)
    model = load_comet(moved, pretrained_model=FIXTURES / "encoder-xlmr")
    triple = TRIPLES[1]
    assert model.score([triple["src"]], [triple["mt"]], [triple["ref"]]).scores[0] == pytest.approx(
        RECORD["models"]["regression"]["with_references"]["1"]["scores"][1], abs=1e-5)


EXECUTED = []


def run_on_load(message):
    EXECUTED.append(message)


class Planted:
    """An object whose unpickling would call `run_on_load`: the loader must not build it."""

    def __reduce__(self):
        return run_on_load, ("unpickled",)


class Namespace:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


def test_a_checkpoint_with_other_objects_is_read_without_building_them(tmp_path):
    folder = tmp_path / "unified"
    shutil.copytree(FIXTURES / "unified", folder)
    (folder / "hparams.yaml").write_text((folder / "hparams.yaml").read_text().replace(
        "../encoder-xlmr", str(FIXTURES / "encoder-xlmr")))
    path = folder / "checkpoints" / "model.ckpt"
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["loops"] = Planted()
    checkpoint["hyper_parameters"] = Namespace(**checkpoint["hyper_parameters"])
    torch.save(checkpoint, path)
    state, hparams = read_checkpoint(path)
    assert hparams is None and not EXECUTED  # the hyper-parameters come from hparams.yaml instead
    assert torch.equal(state["estimator.ff.0.weight"], checkpoint["state_dict"]["estimator.ff.0.weight"])
    values = load_comet(folder).score([t["src"] for t in TRIPLES], [t["mt"] for t in TRIPLES]).scores
    expected = RECORD["models"]["unified"]["without_references"]["8"]["scores"]
    assert values == pytest.approx(expected, abs=1e-5) and not EXECUTED


def test_bfloat16_runs_the_encoder_in_bfloat16_and_the_heads_in_float32():
    reward = CometReward(FIXTURES / "regression", dtype="bfloat16")
    assert reward.model.encoder.dtype == torch.bfloat16 and reward.model.estimator.ff[0].weight.dtype == torch.float32
    values = reward([t["mt"] for t in TRIPLES], [[t["ref"]] for t in TRIPLES], [t["src"] for t in TRIPLES])
    expected = RECORD["models"]["regression"]["with_references"]["8"]["scores"]
    assert values == pytest.approx(expected, abs=0.1) and values != pytest.approx(expected, abs=1e-5)


def test_what_a_model_cannot_do_is_refused(models, tmp_path):
    with pytest.raises(ValueError, match="needs references"):
        models["regression"].score(["a"], ["b"])
    with pytest.raises(ValueError, match="use_references=False"):
        CometReward(models["regression"], use_references=False)
    with pytest.raises(ValueError, match="use_references=True"):
        CometReward(models["referenceless"], use_references=True)
    with pytest.raises(TypeError, match="CometModel"):
        CometReward(torch.nn.Linear(2, 2))
    folder = tmp_path / "ranking"
    shutil.copytree(FIXTURES / "regression", folder)
    (folder / "hparams.yaml").write_text("class_identifier: ranking_metric\n")
    with pytest.raises(ValueError, match="ranking_metric"):
        load_comet(folder)
    assert isinstance(models["xcomet"], CometModel) and models["xcomet"].encoder.__class__.__name__ == "XLMRobertaXLModel"


def test_a_comet_model_given_to_reward_funcs_becomes_a_comet_reward(models):
    from hf_seqrl.rewards import build_reward

    reward = build_reward(models["referenceless"])
    assert isinstance(reward, CometReward) and reward.model is models["referenceless"]


def test_xcomet_token_rewards_are_its_scores_and_its_error_spans_by_severity(models):
    """`CometReward(token_rewards=True)` on the xCOMET fixture: each value is the score unbabel-comet gave with the
    spans it found, valued by severity; every span lies inside its prediction, so the trainers map it to tokens."""
    recorded = RECORD["models"]["xcomet"]["with_references"]["8"]
    weights = {"minor": -0.1, "major": -0.5, "critical": -1.0}
    reward = CometReward(models["xcomet"], batch_size=8, token_rewards=True, severity_weights=weights)
    predictions = [t["mt"] for t in TRIPLES]
    values = reward(predictions, [[t["ref"]] for t in TRIPLES], [t["src"] for t in TRIPLES])
    assert [v["score"] for v in values] == pytest.approx(recorded["scores"], abs=1e-5)
    expected = [[(s["start"], s["end"], weights[s["severity"]]) for s in found]
                for found in recorded["metadata"]["error_spans"]]
    assert [v["spans"] for v in values] == expected
    from hf_seqrl.rewards import call_reward

    checked = call_reward(reward, predictions, [[t["ref"]] for t in TRIPLES], [t["src"] for t in TRIPLES])
    assert sum(len(v.spans) for v in checked) > 50  # every span inside its prediction: none refused
    default = CometReward(models["xcomet"], batch_size=8, token_rewards=True)
    assert default.severity_weights == {"minor": -0.04, "major": -0.2, "critical": -0.4}
    with pytest.raises(ValueError, match="needs an xCOMET checkpoint"):
        CometReward(models["regression"], token_rewards=True)
    with pytest.raises(ValueError, match="severity_weights"):
        CometReward(models["xcomet"], token_rewards=True, severity_weights={"fatal": -1.0})
