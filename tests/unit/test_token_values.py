"""Token-level rewards by hand: the values a reward may return (checked, malformed ones refused), spans mapped to
tokens through the text each token adds (crossing token boundaries, empty spans, Unicode), weighted sums of sentence
and token parts, the per-token advantages, and the lexical `token_match` reward's alignment."""

import math

import pytest
import sacrebleu
import torch

from hf_seqrl.functional.advantages import token_level_advantages
from hf_seqrl.rewards import WeightedReward, call_reward, get_reward
from hf_seqrl.rewards.spans import TokenScore, span_token_values, token_char_spans
from hf_seqrl.rewards.token_match import aligned_words
from hf_seqrl.rewards.spans import sentence_score, token_score, weighted_sum
from hf_seqrl.rewards.token_match import token_match_reward


def test_token_char_spans_cover_what_each_token_adds():
    text = "a cat sat"
    prefixes = ["a", "a cat", "a cat sat", "a cat sat"]  # the last token (EOS) adds nothing
    assert token_char_spans(prefixes, text) == [(0, 1), (1, 5), (5, 9), (9, 9)]
    # a prefix that is no prefix of the text (a byte-level token cut inside "é": a replacement character) counts by
    # the part it shares; the token that holds the first byte of "é" gets the span of "é", as the next one does
    assert token_char_spans(["caf", "caf\ufffd", "café", "café"], "café") == [(0, 3), (3, 4), (3, 4), (4, 4)]


def test_spans_give_their_value_to_every_token_they_touch():
    tokens = [(0, 1), (1, 5), (5, 9), (9, 9)]  # "a", " cat", " sat", EOS
    # a span across the boundary of " cat" and " sat" touches both; two spans on one token add up
    assert span_token_values([(3, 7, -1.0)], tokens) == [0.0, -1.0, -1.0, 0.0]
    assert span_token_values([(2, 4, -1.0), (4, 5, -2.0)], tokens) == [0.0, -3.0, 0.0, 0.0]
    # an empty span (an omission) goes to the token holding its position, or at the end of the text to the last
    assert span_token_values([(2, 2, -5.0), (9, 9, -1.0)], tokens) == [0.0, -5.0, 0.0, -1.0]
    assert span_token_values([], tokens) == [0.0] * 4


def test_returned_values_are_checked_and_malformed_spans_refused_with_the_reward_and_the_prediction():
    text = "Zwei Hunde"
    assert token_score({"score": 0.5, "spans": [(0, 4, -1)]}, text, "r", 0) == TokenScore(0.5, ((0, 4, -1.0),))
    assert token_score([0.1, -0.2], text, "r", 0) == TokenScore(0.0, (), (0.1, -0.2))
    assert token_score({"score": None, "spans": [(5, 10, -2.0)]}, text, "r", 0).score is None
    for bad, problem in [({"score": 0.5, "spans": [(0, 11, -1)]}, "outside the text of 10 characters"),
                         ({"score": 0.5, "spans": [(4, 2, -1)]}, "or starts after it ends"),
                         ({"score": 0.5, "spans": [(0, 2, math.nan)]}, "not a finite number"),
                         ({"score": 0.5, "spans": [(0, 2)]}, r"is not \(start, end, value\)"),
                         ({"score": 0.5}, "needs the keys 'score' and 'spans'"),
                         ({"score": None, "spans": []}, "no score and no span"),
                         ([0.1, "x"], "not a finite number")]:
        with pytest.raises(ValueError, match=problem) as info:
            token_score(bad, text, "errors", 3)
        assert "reward 'errors', prediction 3 ('Zwei Hunde')" in str(info.value), bad

    def spans_reward(predictions, references, sources=None, **columns):
        return [{"score": 1.0, "spans": [(0, 99, -1.0)]} for _ in predictions]

    with pytest.raises(ValueError, match="reward 'spans_reward', prediction 0"):
        call_reward(spans_reward, ["abc"], [["abc"]])


def test_a_weighted_sum_keeps_sentence_and_token_parts():
    spans = TokenScore(0.5, ((0, 2, -1.0),))
    tokens = TokenScore(0.0, (), (1.0, 2.0))
    total = weighted_sum([(0.5, 0.8), (2.0, spans), (1.0, tokens)])
    assert total == TokenScore(0.4 + 1.0 + 0.0, ((0, 2, -2.0),), (1.0, 2.0))
    assert weighted_sum([(0.5, 0.8), (0.5, 0.2)]) == 0.5  # numbers only: a number
    assert sentence_score(TokenScore(None, ((0, 1, -1.0),))) == 0.0 and sentence_score(0.3) == 0.3
    assert total.token_values([(0, 1), (1, 2)]) == [1.0 - 2.0, 2.0 - 2.0]  # both tokens touch the span [0, 2)
    with pytest.raises(ValueError, match="2 per-token values for a prediction of 3 tokens"):
        tokens.token_values([(0, 1), (1, 2), (2, 2)])

    def words(predictions, references, sources=None, **columns):
        return [{"score": 0.5, "spans": [(0, 1, -1.0)]} for _ in predictions]

    combined = WeightedReward(["chrf", words], [0.5, 0.5])
    (value,) = combined(["a b"], [["a b"]])
    assert isinstance(value, TokenScore) and value.spans == ((0, 1, -0.5),)
    assert value.score == pytest.approx(0.5 * 1.0 + 0.5 * 0.5)


def test_per_token_advantages_add_each_tokens_value_to_the_sentence_advantage():
    sentence = torch.tensor([0.5, -1.0])
    values = torch.tensor([[0.0, -1.0, 0.0], [2.0, 0.0, 9.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    adv = token_level_advantages(sentence, values, mask)
    assert torch.equal(adv, torch.tensor([[0.5, -0.5, 0.5], [1.0, -1.0, 0.0]]))
    to_go = token_level_advantages(sentence, values, mask, reward_to_go=True)
    # values summed from each token to the end: [-1, -1, 0] and [2, 0] (the masked 9 counts nowhere)
    assert torch.equal(to_go, torch.tensor([[-0.5, -0.5, 0.5], [1.0, -1.0, 0.0]]))


def test_token_match_penalizes_the_words_outside_the_longest_common_subsequence():
    # "a man rides a red bike" against "a man rides his bike": "a" and "red" are not in the LCS
    assert aligned_words("A man rides a red bike .".split(), "A man rides his bike .".split()) == \
        [True, True, True, False, False, True, True]
    assert aligned_words(["Bike,", "man"], ["man", "bike"]) == [False, True]  # order matters; one of them aligns
    reward = get_reward("token_match")
    prediction, references = "A man rides a red bike .", ["A man rides his bike .", "x y", "A dog ."]
    (value,) = reward([prediction], [references])
    assert value["spans"] == [(12, 13, -0.1), (14, 17, -0.1)]  # against the best reference, the first of three
    best = max(sacrebleu.sentence_chrf(prediction, [r]).score for r in references)
    assert value["score"] == pytest.approx(best / 100) and 0 < value["score"] < 1
    assert get_reward("token_match")(["same words"], [["same words"]])[0]["spans"] == []
    (heavier,) = token_match_reward(word_penalty=0.5)(["A man rides a red bike ."], [["A man rides his bike ."]])
    assert heavier == {"score": value["score"], "spans": [(12, 13, -0.5), (14, 17, -0.5)]}
    with pytest.raises(ValueError, match="word_penalty=-1.0 must be >= 0"):
        token_match_reward(word_penalty=-1.0)
