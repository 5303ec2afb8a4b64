"""The guards: `length_ratio` (the ratio, the band, the closest reference, the source fallback, by name and by
factory), `repetition`, `source_copy` and `target_language` on hand-made outputs, and a reward gated by them."""

import math
import pickle

import pytest

from hf_seqrl.rewards import BUILTIN_REWARDS, build_reward, get_reward, length_ratio, length_ratio_reward
from hf_seqrl.rewards.builtin import GUARD_REWARDS
from hf_seqrl.rewards.convention import check_reward_spec
from hf_seqrl.rewards.guards import (SOURCE_COPY_THRESHOLD, band_value, closest_length, overlap_penalty,
                                     repetition_rate, text_length)


def test_length_counts_words_or_characters_other_than_whitespace():
    assert text_length("the cat  sat\n") == 3
    assert text_length("ab c", unit="chars") == 3
    assert text_length("猫が 座った", unit="chars") == 5
    with pytest.raises(ValueError, match="bytes"):
        text_length("a", unit="bytes")


def test_length_ratio_is_prediction_over_reference():
    assert length_ratio("a b c", "a b c d") == 0.75
    assert length_ratio("ab c", "abcd e", unit="chars") == 3 / 5
    assert length_ratio("a b c d e f", "a b c") == 2.0
    # an empty reference: equal when both are empty, infinitely long otherwise
    assert length_ratio("", " ") == 1.0
    assert length_ratio("a", "") == math.inf


def test_band_value_is_one_inside_and_linear_outside():
    assert band_value(1.0) == 1.0 and band_value(0.8) == 1.0 and band_value(1.2) == 1.0
    assert band_value(0.4) == pytest.approx(0.5)            # 0.4 / 0.8
    assert band_value(0.0) == 0.0                           # an empty output
    assert band_value(1.5) == pytest.approx(0.75)           # 1 - (1.5 - 1.2) / 1.2
    assert band_value(2.4) == pytest.approx(0.0)            # twice `high`
    assert band_value(7.0) == 0.0 and band_value(math.inf) == 0.0
    assert band_value(0.5, low=0.5, high=2.0) == 1.0 and band_value(3.0, low=0.5, high=2.0) == pytest.approx(0.5)


def test_the_closest_reference_length_counts_ties_going_to_the_shorter():
    assert closest_length(5, [3, 7]) == 3
    assert closest_length(5, [4, 7]) == 4
    assert closest_length(6, [4, 7]) == 7


def test_the_reward_by_name_takes_the_best_reference_then_the_source():
    reward = get_reward("length_ratio")
    assert reward.__name__ == "length_ratio"
    predictions = ["a b c d e", "a b", "a b", "a b c", "", "a b c d e f g h i j"]
    references = [["a b c", "a b c d e f g"],  # 5 words: 5/3 -> 1 - (5/3 - 6/5)/(6/5) = 11/18, 5/7 -> (5/7)/0.8 = 25/28
                  ["x y"],                    # 2/2: inside the band
                  [""],                       # no reference: the source's 4 words, 2/4 = 0.5 -> 0.5/0.8
                  [],                         # nothing to measure against: no reward
                  ["x y z"],                  # empty output: 0
                  ["x y z w v"]]              # 10/5 = 2: 1 - 0.8/1.2
    sources = ["s", "s", "w x y z", "", "s", "s"]
    values = reward(predictions, references, sources)
    assert values == [pytest.approx(25 / 28), 1.0, pytest.approx(0.625), None, 0.0, pytest.approx(1 / 3)]
    # without sources, a prediction with no reference gets none
    assert reward(["a b"], [[]]) == [None]
    # 12 words: the 5-word reference is the closer in length (12/5 = 2.4 -> 0), the 20-word one scores 12/20 -> 0.75;
    # a reference added never lowers the reward
    twelve = " ".join("w" * 12)
    assert reward([twelve], [["a " * 5, "a " * 20]]) == reward([twelve], [["a " * 20]]) == [pytest.approx(0.75)]
    assert reward.ratio(twelve, ["a " * 5, "a " * 20]) == pytest.approx(2.4)  # the logged ratio: the closest length


def test_the_factory_sets_the_band_and_the_unit():
    wide = length_ratio_reward(low=0.5, high=2.0)
    assert wide(["a b c d"], [["a b"]]) == [1.0]                 # ratio 2
    assert wide(["a"], [["a b c d"]]) == [pytest.approx(0.5)]    # ratio 0.25 -> 0.25 / 0.5
    chars = length_ratio_reward(unit="chars")
    assert chars(["abcdef"], [["abcd"]]) == [pytest.approx(1 - (1.5 - 1.2) / 1.2)]
    for bad in (dict(low=0.0), dict(low=1.5, high=1.2), dict(high=math.inf), dict(unit="tokens")):
        with pytest.raises(ValueError, match="length_ratio_reward"):
            length_ratio_reward(**bad)
    restored = pickle.loads(pickle.dumps(wide))  # reward_workers pickles it
    assert restored(["a b c d"], [["a b"]]) == [1.0] and repr(restored) == repr(wide)


def test_length_ratio_is_a_reward_name_but_no_corpus_metric():
    assert "length_ratio" in GUARD_REWARDS and "length_ratio" not in BUILTIN_REWARDS
    check_reward_spec(["bleu", "length_ratio"])
    combined = build_reward(["bleu", "length_ratio"], [0.0, 1.0])
    assert combined.parts(["a b c"], [["a b c d"]])["length_ratio"] == [pytest.approx(0.9375)]  # 0.75 / 0.8
    assert combined(["a b c"], [["a b c d"]]) == [pytest.approx(0.9375)]
    with pytest.raises(ValueError, match="length_ratio"):
        get_reward("length_ratios")


def test_repetition_rate_counts_the_ngrams_that_repeat_an_earlier_one():
    # "the cat sat on" x 3: 10 trigrams, 4 distinct -> 6 repeats / 10
    assert repetition_rate("the cat sat on the cat sat on the cat sat on") == pytest.approx(0.6)
    assert repetition_rate("a dog runs in the park") == 0.0 and repetition_rate("two words") == 0.0
    assert repetition_rate("go go go go", n=1) == pytest.approx(0.75)
    reward = get_reward("repetition")
    # "a bike" x 4: 6 trigrams, 2 distinct -> 4 repeats / 6, the reward 1 - 2/3
    assert reward(["a man rides a bike", "a bike a bike a bike a bike"], [["x"], ["x"]]) == [1.0, pytest.approx(1 / 3)]
    assert pickle.loads(pickle.dumps(reward)).n == 3


def test_source_copy_penalizes_overlap_with_the_source_above_the_threshold():
    assert overlap_penalty(0.2, 0.4) == 1.0 and overlap_penalty(1.0, 0.4) == 0.0
    assert overlap_penalty(0.7, 0.4) == pytest.approx(0.5)  # halfway from the threshold to a full copy
    reward = get_reward("source_copy")
    source = "Ein Mann fährt mit dem Fahrrad die Straße entlang."
    copied, translated = reward([source, "A man rides his bike down the street."], [["x"], ["x"]], [source, source])
    assert copied == 0.0 and translated == 1.0
    assert reward(["a"], [["x"]], [""]) == [None]  # no source: nothing to compare with
    with pytest.raises(ValueError, match="add a `sources` column"):
        reward(["a"], [["x"]])
    assert 0 < SOURCE_COPY_THRESHOLD < 1


def test_target_language_is_the_share_of_letters_in_target_language_sentences():
    pytest.importorskip("py3langid")
    from hf_seqrl.rewards import target_language_reward

    reward = target_language_reward("en")
    german = "Ein Mann fährt mit dem Fahrrad die Straße entlang."
    english = "A man rides his bike down the street."
    values = reward([english, german, f"{english} {german}", "Hund", ""], [["x"]] * 5)
    letters = (sum(c.isalpha() for c in english), sum(c.isalpha() for c in german))
    assert values[:2] == [1.0, 0.0]
    assert values[2] == pytest.approx(letters[0] / sum(letters))  # half the output in the wrong language
    assert values[3:] == [1.0, 1.0]  # too short to tell: no penalty
    restricted = pickle.loads(pickle.dumps(target_language_reward("de", ["en", "de"])))
    assert restricted([german], [["x"]]) == [1.0] and restricted.languages == ["en", "de"]
    with pytest.raises(ValueError, match="not among py3langid"):
        target_language_reward("xx")


def test_a_gated_reward_multiplies_by_its_guards_and_logs_each_part():
    from hf_seqrl.rewards import call_reward_parts, guard
    from hf_seqrl.rewards.convention import CombinedReward

    def quality(predictions, references, sources=None, **columns):
        return [0.8, 0.6, None]

    gated = guard(quality, "source_copy", "repetition")
    assert isinstance(gated, CombinedReward) and gated.__name__ == "quality*source_copy*repetition"
    source = "Zwei Hunde spielen im Schnee."
    predictions = ["Two dogs play in the snow.", source, "Two dogs."]
    parts = call_reward_parts(gated, predictions, [["x"]] * 3, [source, source, ""])
    assert parts == {"quality": [0.8, 0.6, None], "source_copy": [1.0, 0.0, None], "repetition": [1.0, 1.0, 1.0]}
    assert gated.combine(parts) == [0.8, 0.0, None]  # the copy scores 0; the reward's None stays None
    with pytest.raises(ValueError, match="normalize_then_sum"):
        gated.part_weights()
    with pytest.raises(ValueError, match="at least one guard"):
        guard(quality)


def test_a_reward_gated_by_the_target_language_scores_a_german_output_zero():
    pytest.importorskip("py3langid")
    from hf_seqrl.rewards import call_reward_parts, guard, target_language_reward

    def quality(predictions, references, sources=None, **columns):
        return [0.9, 0.7]

    gated = guard(quality, target_language_reward("en"), "source_copy")
    source = "Ein Mann fährt mit dem Fahrrad die Straße entlang."
    # German that shares no words with its source: the language guard alone takes its value
    predictions = ["A man rides his bike down the street.", "Zwei Kinder spielen heute im Garten hinter dem Haus."]
    parts = call_reward_parts(gated, predictions, [["x"]] * 2, [source, source])
    assert parts["target_language"] == [1.0, 0.0] and parts["source_copy"] == [1.0, 1.0]
    assert gated.combine(parts)[0] == pytest.approx(0.9) and gated.combine(parts)[1] == 0.0


def test_a_trainer_refuses_a_gated_reward_with_normalize_then_sum_when_built(tmp_path):
    from helpers import TRAIN_DEFAULTS, byt5_tokenizer, tiny_model, toy_dataset, toy_pairs
    from hf_seqrl import SCSTTrainer, SeqRLConfig
    from hf_seqrl.rewards import guard

    tok = byt5_tokenizer()
    args = SeqRLConfig(output_dir=str(tmp_path), **{**TRAIN_DEFAULTS, "max_steps": 1}, baseline="mean", num_samples=2,
                       multi_objective_aggregation="normalize_then_sum")
    with pytest.raises(ValueError, match="is a gate.*sum_then_normalize"):
        SCSTTrainer(model=tiny_model(), args=args, reward_funcs=guard("chrf", "repetition"),
                    train_dataset=toy_dataset(tok, *toy_pairs(4)), processing_class=tok)
