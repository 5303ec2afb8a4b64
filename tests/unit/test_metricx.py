"""MetricX-24's arithmetic: the input text, the clamp, the reward of a score, the EOS removal (the model is tested in
tests/integration/test_metricx_model.py)."""

import pytest

from hf_seqrl.rewards.metricx import METRICX_SCORE_TOKEN_ID, clamp_score, drop_eos, metricx_input, reward_from_score


def test_the_input_text_is_metricx24s():
    assert metricx_input("Das ist gut.", "This is good.", "That is good.") == \
        "source: Das ist gut. candidate: This is good. reference: That is good."
    # quality estimation: no reference part at all (not an empty one)
    assert metricx_input("Das ist gut.", "This is good.") == "source: Das ist gut. candidate: This is good."
    # reference-only data: the source is empty, as MetricX-24 takes it
    assert metricx_input("", "a", "b") == "source:  candidate: a reference: b"


def test_the_score_is_clamped_to_0_25_and_negated_or_normalized():
    assert METRICX_SCORE_TOKEN_ID == 250089  # <extra_id_10>
    assert clamp_score(-3.0) == 0.0 and clamp_score(7.5) == 7.5 and clamp_score(30.0) == 25.0
    assert reward_from_score(7.5) == -7.5
    assert reward_from_score(-3.0) == 0.0          # clamped to 0: a perfect score
    assert reward_from_score(30.0) == -25.0
    assert reward_from_score(7.5, normalize=True) == pytest.approx(0.7)    # 1 - 7.5 / 25
    assert reward_from_score(30.0, normalize=True) == 0.0
    assert reward_from_score(-3.0, normalize=True) == 1.0


def test_only_a_final_eos_is_dropped():
    assert drop_eos([5, 6, 1], eos_token_id=1) == [5, 6]
    assert drop_eos([5, 1, 6], eos_token_id=1) == [5, 1, 6]   # a tokenizer that appends none: nothing to drop
    assert drop_eos([], eos_token_id=1) == []
    assert drop_eos([5, 6], eos_token_id=None) == [5, 6]
