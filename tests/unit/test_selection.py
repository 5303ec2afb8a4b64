"""MBR and QE selection (`hf_seqrl.selection`) against picks computed by hand."""

import math

import numpy as np
import pytest

from hf_seqrl.rewards import chrf_reward
from hf_seqrl.selection import Selection, expected_utilities, fastchrf_available, mbr_select, qe_select, \
    utility_matrices

CALLS = []


def overlap(predictions, references, sources=None, **columns):
    """Word-set Jaccard overlap with the first reference: symmetric, easy to write down."""
    CALLS.append(len(predictions))
    values = []
    for pred, refs in zip(predictions, references):
        a, b = set(pred.split()), set(refs[0].split())
        values.append(len(a & b) / len(a | b) if a | b else 0.0)
    return values


def test_mbr_pick_and_matrix_by_hand():
    # Jaccard: "a b" vs "a c" = 1/3, "a b" vs "a b d" = 2/3, "a c" vs "a b d" = 1/4.
    # Means over the others: "a b": (1/3 + 2/3) / 2 = 1/2; "a c": (1/3 + 1/4) / 2 = 7/24; "a b d": (2/3 + 1/4) / 2.
    CALLS.clear()
    (picked,) = mbr_select([["a b", "a c", "a b d"]], overlap, keep_matrix=True)
    assert picked.index == 0 and picked.text == "a b"
    assert picked.score == pytest.approx(0.5)
    assert picked.scores == pytest.approx((0.5, 7 / 24, 11 / 24))
    assert picked.matrix[0][1] == pytest.approx(1 / 3) and picked.matrix[2][1] == pytest.approx(1 / 4)
    assert all(math.isnan(picked.matrix[i][i]) for i in range(3))
    assert CALLS == [6]  # one call over the n * (n - 1) pairs


def test_mbr_scores_every_source_in_one_call_and_breaks_ties_to_the_first():
    CALLS.clear()
    first, second = mbr_select([["x y", "x z"], ["p", "q", "p"]], overlap)
    assert CALLS == [2 + 6]
    assert first.index == 0 and first.score == pytest.approx(1 / 3)  # a tie: both 1/3
    # "p" at 0 and 2 support each other: means (1 + 0) / 2 = 1/2, 0, 1/2 -> the first "p".
    assert second.index == 0 and second.scores == pytest.approx((0.5, 0.0, 0.5))


def test_mbr_with_a_symmetric_utility_ignores_candidate_order():
    cands = ["the cat sat", "a cat sat down", "the dog ran", "the cat sat down", "cat"]
    picks = {mbr_select([list(order)], overlap)[0].text
             for order in (cands, cands[::-1], [cands[i] for i in (2, 4, 0, 3, 1)])}
    assert picks == {"the cat sat down"}


def test_mbr_with_one_candidate_and_the_candidate_left_out_of_its_own_mean():
    (only,) = mbr_select([["alone"]], overlap)
    assert only.index == 0 and only.score == 0.0
    # Against itself "a b" would add a Jaccard of 1; left out, its mean stays 1/3.
    assert expected_utilities(np.array([[np.nan, 1 / 3], [1 / 3, np.nan]])) == pytest.approx([1 / 3, 1 / 3])


def test_mbr_with_a_builtin_name_uses_that_reward():
    cands = ["the cat sat on the mat", "a cat sat on a mat", "dogs bark"]
    (matrix,) = utility_matrices([cands], "bleu")
    from hf_seqrl.rewards import bleu_reward

    assert matrix[0, 1] == pytest.approx(bleu_reward([cands[0]], [[cands[1]]])[0])
    assert mbr_select([cands], "bleu")[0].index == int(np.argmax(np.nanmean(matrix, axis=1)))


def test_mbr_refuses_a_none_pair_and_malformed_candidates():
    with pytest.raises(ValueError, match="returned None"):
        mbr_select([["a", "b"]], lambda predictions, references, sources=None, **kw: [None] * len(predictions))
    with pytest.raises(TypeError, match="one list of candidate strings per source"):
        mbr_select(["a", "b"], overlap)
    with pytest.raises(ValueError, match="no candidate"):
        mbr_select([["a"], []], overlap)


@pytest.mark.skipif(not fastchrf_available(), reason="fastchrf is not installed")
def test_fastchrf_matrix_equals_the_chrf_reward():
    cands = ["the cat sat on the mat", "a cat sat on a mat.", "Dogs are barking!", "the the the", "", "x"]
    (fast,) = utility_matrices([cands], "chrf")
    slow = [[chrf_reward([h], [[r]])[0] if i != j else np.nan for j, r in enumerate(cands)]
            for i, h in enumerate(cands)]
    np.testing.assert_allclose(fast, np.array(slow), atol=1e-9)


def test_chrf_without_fastchrf_falls_back_to_the_reward(monkeypatch):
    import hf_seqrl.selection as selection

    monkeypatch.setattr(selection, "fastchrf_available", lambda: False)
    cands = ["the cat sat", "a cat sat", "a dog"]
    (matrix,) = selection.utility_matrices([cands], "chrf")
    assert matrix[0, 1] == pytest.approx(chrf_reward([cands[0]], [[cands[1]]])[0])


def length_qe(predictions, references, sources, **columns):
    # A reference-free score by hand: minus the distance between the word counts of prediction and source.
    return [-abs(len(p.split()) - len(s.split())) if p != "skip" else None for p, s in zip(predictions, sources)]


def test_qe_pick_threshold_and_unscored_candidates():
    cands = [["a", "a b c", "a b"], ["skip", "x y z w", "x"], ["skip"]]
    first, second, third = qe_select(cands, ["one two three", "s", "t"], length_qe)
    assert (first.index, first.text, first.score) == (1, "a b c", 0)
    assert first.scores == (-2.0, 0.0, -1.0)
    assert (second.index, second.score) == (2, 0.0) and math.isnan(second.scores[0])
    assert third == Selection(None, None, None, (third.scores[0],)) and math.isnan(third.scores[0])
    # "x y z w" is the closest to a 6-word source, 2 words off: below the threshold, so nothing is picked.
    below = qe_select(cands[:2], ["one two three", "a b c d e f"], length_qe, threshold=-0.5)
    assert below[0].index == 1 and below[1].index is None and below[1].text is None and below[1].score == -2.0


def test_qe_ties_go_to_the_first_and_columns_repeat_per_candidate():
    seen = {}

    def reward(predictions, references, sources, domain):
        seen["domain"] = domain
        return [1.0] * len(predictions)

    picks = qe_select([["u", "v"], ["w"]], ["s", "t"], reward, columns={"domain": ["med", "law"]})
    assert [p.index for p in picks] == [0, 0]
    assert seen["domain"] == ["med", "med", "law"]


def test_length_gain_of_the_selected_samples_by_hand():
    import torch

    from hf_seqrl.objectives.best_of_n import length_gain

    lengths = torch.tensor([[2, 4], [3, 5]])
    # picks 4 and 3 tokens (mean 3.5) among samples of mean 3 and 4 (mean 3.5)
    assert length_gain(lengths, torch.tensor([1, 0]), torch.tensor([True, True])).item() == pytest.approx(1.0)
    # the second source left out: its pick of 4 tokens over its samples' mean of 3
    assert length_gain(lengths, torch.tensor([1, 0]), torch.tensor([True, False])).item() == pytest.approx(4 / 3)
    assert length_gain(lengths, torch.tensor([1, 1]), torch.tensor([True, True])).item() == pytest.approx(9 / 7)
    assert math.isnan(length_gain(lengths, torch.tensor([1, 0]), torch.tensor([False, False])).item())
