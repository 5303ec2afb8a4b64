"""Rewards equal the reference implementations; combinations, callables and errors."""

import math

import numpy as np
import pytest
import sacrebleu
import torch
from rouge_score import rouge_scorer

from hf_seqrl import data, evaluation, rewards
from hf_seqrl.rewards import BUILTIN_REWARDS, build_reward, call_reward, call_reward_parts, combine_parts, get_reward
from hf_seqrl.rewards import builtin
from hf_seqrl.rewards.builtin import SACREBLEU_INTERNALS
from hf_seqrl.rewards.convention import CombinedReward, check_finite, part_weights

PREDS = [
    "the cat sat on the mat",
    "a dog is running in the park",
    "two men are playing guitars on stage",
    "",
    "   ",
]
REFS = [
    ["the cat is sitting on the mat", "a cat sat on the mat"],
    ["a dog runs through a park"],
    ["two men play guitar on a stage", "musicians perform", "two guys playing guitars"],
    ["nothing here"],
    ["whitespace only"],
]


def test_bleu_and_chrf_match_sacrebleu():
    bleu = get_reward("bleu")(PREDS, REFS)
    chrf = get_reward("chrf")(PREDS, REFS)
    for i, (p, r) in enumerate(zip(PREDS, REFS)):
        if p.strip():
            assert bleu[i] == pytest.approx(sacrebleu.sentence_bleu(p, r).score / 100, abs=1e-12)
            assert chrf[i] == pytest.approx(sacrebleu.sentence_chrf(p, r).score / 100, abs=1e-12)
        else:
            assert bleu[i] == 0.0 and chrf[i] == 0.0
    assert 0 < bleu[0] < 1 and 0 < chrf[2] < 1


@pytest.mark.parametrize("kind", ["rouge1", "rouge2", "rougeL", "rougeLsum"])
def test_rouge_matches_rouge_score_multi(kind):
    scorer = rouge_scorer.RougeScorer([kind], use_stemmer=True)
    values = get_reward(kind)(PREDS, REFS)
    for i, (p, r) in enumerate(zip(PREDS, REFS)):
        expected = scorer.score_multi(r, p)[kind].fmeasure if p.strip() else 0.0
        assert values[i] == expected
    # stemming on: "running"/"runs" share the stem "run"
    assert get_reward("rouge1")(["dogs running"], [["dog runs"]])[0] == 1.0


def test_sacrebleu_internals_are_still_there():
    # The built-in BLEU/chrF prepare a reference set once through these private steps of `sentence_score`;
    # setup.cfg bounds sacrebleu's version. If this fails, a new sacrebleu changed them: check the values below,
    # then widen the bound (or drop the caching: the public-API fallback gives the same values, slower).
    from sacrebleu.metrics import BLEU, CHRF

    for metric in (BLEU(effective_order=True), CHRF()):
        missing = [name for name in SACREBLEU_INTERNALS if not hasattr(metric, name)]
        assert not missing, f"sacrebleu {sacrebleu.__version__} has no {missing} on {type(metric).__name__}"


def test_public_api_fallback_gives_the_same_values(monkeypatch):
    cached = get_reward("bleu")(PREDS, REFS), get_reward("chrf")(PREDS, REFS)
    monkeypatch.setattr(builtin, "SACREBLEU_INTERNALS", ("_no_such_method",))  # the public sentence_score path
    assert (get_reward("bleu")(PREDS, REFS), get_reward("chrf")(PREDS, REFS)) == cached


def test_multi_reference_takes_the_best():
    one = get_reward("bleu")(["a cat sat on the mat"], [["the dog ran away quickly"]])[0]
    two = get_reward("bleu")(["a cat sat on the mat"], [["the dog ran away quickly", "a cat sat on the mat"]])[0]
    assert two == 1.0 and one < 0.2


def test_weighted_combination():
    combo = build_reward(["bleu", "rougeL"], [0.25, 0.75])
    b, r = get_reward("bleu")(PREDS, REFS), get_reward("rougeL")(PREDS, REFS)
    assert combo(PREDS, REFS) == pytest.approx([0.25 * x + 0.75 * y for x, y in zip(b, r)])
    equal = build_reward(["bleu", "rougeL"])
    assert equal(PREDS, REFS) == pytest.approx([(x + y) / 2 for x, y in zip(b, r)])


def test_reward_parts_sum_with_the_weights_to_the_total_exactly():
    combo = build_reward(["bleu", "rougeL", "bleu"], [0.25, 0.7, 0.05])
    parts = call_reward_parts(combo, PREDS, REFS, name="combo", step=3)
    # a repeated reward gets a numbered key; every part holds the reward's own values
    assert list(parts) == ["bleu_reward", "rougeL_reward", "bleu_reward_2"]
    assert parts["bleu_reward"] == parts["bleu_reward_2"] == get_reward("bleu")(PREDS, REFS)
    assert parts["rougeL_reward"] == get_reward("rougeL")(PREDS, REFS)
    total = combine_parts(combo, parts)
    assert total == combo(PREDS, REFS)  # bitwise: the same sums in the same order
    assert total == [0.0 + 0.25 * b + 0.7 * r + 0.05 * b2 for b, r, b2 in zip(*parts.values())]
    # a single reward is its own one part, named as the trainer names it
    single = build_reward("chrf")
    assert call_reward_parts(single, PREDS, REFS, name="chrf_reward") == {"chrf_reward": single(PREDS, REFS)}
    assert combine_parts(single, {"chrf_reward": [0.5]}) == [0.5]
    # the weight of each part in the total
    assert part_weights(combo, parts) == {"bleu_reward": 0.25, "rougeL_reward": 0.7, "bleu_reward_2": 0.05}
    assert part_weights(single, {"chrf_reward": [0.5]}) == {"chrf_reward": 1.0}
    # a part that breaks the convention is named, and the combination that called it
    broken = build_reward(["bleu", lambda predictions, **_: [1.0]], [0.5, 0.5])
    with pytest.raises(RuntimeError, match=r"reward '0.5\*bleu_reward\+0.5\*<lambda>' raised ValueError at training step 3 on 5 rows, "
                                           r"the first prediction .*: reward '<lambda>' returned 1 values for 5"):
        call_reward_parts(broken, PREDS, REFS, name=broken.__name__, step=3)


def test_callable_and_module_path_rewards():
    def length_reward(predictions, references, sources=None):
        return [len(p.split()) / 10 for p in predictions]

    assert build_reward(length_reward)(["a b"], [["x"]]) == [0.2]
    mixed = build_reward([length_reward, "bleu"], [1.0, 0.0])
    assert mixed(["a b c"], [["zzz"]]) == [pytest.approx(0.3)]
    fn = get_reward("hf_seqrl.rewards:bleu_reward")
    assert fn is rewards.bleu_reward


def test_unknown_reward_lists_valid_names():
    with pytest.raises(ValueError) as err:
        get_reward("bluee")
    for name in BUILTIN_REWARDS:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="cannot import"):
        get_reward("no_such_module_xyz:fn")
    with pytest.raises(ValueError, match="reward_weights has 1 values for 2 reward_funcs"):
        build_reward(["bleu", "chrf"], [1.0])


def test_call_reward_validates_output():
    preds, refs = ["a", "b"], [["a"], ["b"]]
    assert call_reward(lambda predictions, **_: np.array([0.5, 1.0]), preds, refs) == [0.5, 1.0]
    assert call_reward(lambda predictions, **_: torch.tensor([0.5, 1.0]), preds, refs) == [0.5, 1.0]
    with pytest.raises(ValueError, match="returned 1 values for 2 predictions"):
        call_reward(lambda predictions, **_: [1.0], preds, refs, name="short")
    with pytest.raises(TypeError, match=r"reward 'strings' returned '1' \(str\) at index 0"):
        call_reward(lambda predictions, **_: ["1", "0"], preds, refs, name="strings")
    # None: the reward does not apply to that prediction (the trainers leave the sample out)
    assert call_reward(lambda predictions, **_: [0.5, None], preds, refs) == [0.5, None]
    with pytest.raises(TypeError, match=r"returned True \(bool\) at index 0"):
        call_reward(lambda predictions, **_: [True, False], preds, refs)
    with pytest.raises(ValueError, match=r"shape \(2, 1\).*shape \(2,\)"):
        call_reward(lambda predictions, **_: torch.ones(2, 1), preds, refs)
    with pytest.raises(TypeError, match="must return a list of numbers"):
        call_reward(lambda predictions, **_: "0.5", preds, refs)
    values = call_reward(lambda predictions, **_: [math.nan, 1.0], preds, refs)
    with pytest.raises(ValueError, match="non-finite"):
        check_finite(values, "nanny")


def test_normalize_references():
    assert data.normalize_references(["a", ["b", "c"]]) == [["a"], ["b", "c"]]
    with pytest.raises(ValueError, match=r"references\[1\] is an empty list"):
        data.normalize_references(["a", []])
    with pytest.raises(TypeError, match=r"references\[0\] contains a int"):
        data.normalize_references([["a", 3]])
    with pytest.raises(TypeError, match=r"references\[0\] is a int"):
        data.normalize_references([5])


def test_bleu_brevity_by_hand():
    # 4 output tokens against 6 reference tokens: bp = exp(1 - 6/4) = exp(-0.5)
    out = evaluation.bleu_brevity(["a cat sat down"], [["the cat sat on the mat"]])
    assert out["ratio"] == pytest.approx(4 / 6) and out["bp"] == pytest.approx(math.exp(-0.5))
    # as long as the closest reference or longer: no penalty; the second source has one reference only
    out = evaluation.bleu_brevity(["a cat sat on the mat", "a dog runs"], [["the cat sat on the mat", "cat"],
                                                                          ["a dog runs"]])
    assert out == {"bp": 1.0, "ratio": 1.0}


def test_corpus_scores_use_every_reference():
    preds = ["the cat sat on the mat", "a dog runs in a park"]
    refs = [["a cat sat on the mat", "the cat sat on the mat"], ["a dog runs through a park"]]
    streams = [["a cat sat on the mat", "a dog runs through a park"], ["the cat sat on the mat", None]]
    scores = evaluation.corpus_scores(preds, refs, ("bleu", "chrf", "rougeL"))
    assert scores["bleu"] == sacrebleu.corpus_bleu(preds, streams).score
    assert scores["chrf"] == sacrebleu.corpus_chrf(preds, streams).score
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    expected = 100 * sum(scorer.score_multi(r, p)["rougeL"].fmeasure for p, r in zip(preds, refs)) / 2
    assert scores["rougeL"] == pytest.approx(expected)


def _real_pairs():
    """Returns summarization-like (predictions, references): SciTLDR dev when ../shared/data has it."""
    import json
    import os

    from helpers import SHARED_DATA

    path = os.path.join(SHARED_DATA, "scitldr", "dev.jsonl")
    if not os.path.exists(path):
        return PREDS * 8, REFS * 8
    with open(path) as f:
        rows = [json.loads(line) for _, line in zip(range(40), f)]
    # Each abstract's first sentence as a "sample" against its TL;DRs, plus a TL;DR of another paper.
    predictions = [r["source"][0] for r in rows] + [rows[i - 1]["target"][0] for i in range(len(rows))]
    return predictions, [r["target"] for r in rows] * 2


@pytest.mark.parametrize("spec", ["bleu", "chrf", "rougeL", ["bleu", "rouge2"]])
def test_pooled_reward_equals_in_process(spec):
    predictions, references = _real_pairs()
    pooled = rewards.PooledReward(spec, None, workers=2, min_pairs=8)
    try:
        assert pooled(predictions, references) == build_reward(spec)(predictions, references)
        # below min_pairs it scores in-process, same values
        assert pooled(predictions[:3], references[:3]) == build_reward(spec)(predictions[:3], references[:3])
        # the workers return each part's values, which the pool sums with the weights as the in-process reward
        local = build_reward(spec)
        parts = call_reward_parts(pooled, predictions, references)
        assert parts == call_reward_parts(local, predictions, references, name=pooled.__name__)
        assert combine_parts(pooled, parts) == local(predictions, references)
    finally:
        if pooled._pool is not None:
            pooled._pool.shutdown()
    assert isinstance(pooled_trainer(spec).reward_fn, rewards.PooledReward)


def pooled_trainer(reward_funcs):
    """Returns an SCST trainer with `reward_workers=2` on a tiny model (the trainer chooses the process pool)."""
    from helpers import byt5_tokenizer, tiny_model, toy_dataset, toy_pairs
    from hf_seqrl import SCSTTrainer, SeqRLConfig

    tokenizer = byt5_tokenizer()
    args = SeqRLConfig(output_dir="unused", reward_workers=2, report_to=[], use_cpu=True)
    return SCSTTrainer(model=tiny_model(), args=args, reward_funcs=reward_funcs, processing_class=tokenizer,
                       train_dataset=toy_dataset(tokenizer, *toy_pairs(4)))


def test_pooled_reward_needs_a_picklable_reward():
    with pytest.raises(ValueError, match="reward_workers=2 needs a picklable reward"):
        pooled_trainer(lambda predictions, **_: [0.0] * len(predictions))


def test_combined_rewards_declare_the_protocol_the_trainers_read():
    """`WeightedReward` and `PooledReward` are `CombinedReward`s (parts, combine, part_weights); a plain callable is
    its own single part with weight 1."""
    weighted = rewards.WeightedReward(["bleu", "chrf"], [0.25, 0.75])
    pooled = rewards.PooledReward(["bleu", "chrf"], [0.25, 0.75], workers=2)
    assert isinstance(weighted, CombinedReward) and isinstance(pooled, CombinedReward)
    assert weighted.part_weights() == pooled.part_weights() == {"bleu_reward": 0.25, "chrf_reward": 0.75}
    assert not isinstance(rewards.get_reward("bleu"), CombinedReward)
    single = rewards.PooledReward("bleu", None, workers=2)
    assert part_weights(single, {"bleu_reward": [0.5]}) == {"bleu_reward": 1.0}
    parts = rewards.call_reward_parts(weighted, ["a b c"], [["a b c"]])
    assert rewards.combine_parts(weighted, parts) == weighted(["a b c"], [["a b c"]])
