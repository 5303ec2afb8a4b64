"""The decoder-input math of the input-schedule trainers, on hand-made tensors (no model)."""

import pytest
import torch

from hf_seqrl.functional import decoder_inputs as di
from hf_seqrl.schedules import corruption_rate

# One sequence of 4 targets + EOS (1) and one of 2 + EOS, right-padded; gold inputs = start (0) + labels[:-1].
LABELS = torch.tensor([[5, 6, 7, 8, 1],
                       [9, 4, 1, -100, -100]])
GOLD = torch.tensor([[0, 5, 6, 7, 8],
                     [0, 9, 4, 1, 0]])


def test_replaceable_positions_skip_the_start_token_and_padding():
    # position t stands for labels[t-1]: row 2's position 4 stands for padding
    assert di.replaceable_positions(LABELS).tolist() == [[False, True, True, True, True],
                                                         [False, True, True, True, False]]


def test_feed_back_puts_the_prediction_at_t_minus_1_into_t():
    predicted = torch.tensor([[50, 51, 52, 53, 54]])
    feed = torch.tensor([[False, True, False, True, False]])
    assert di.feed_back(GOLD[:1], predicted, feed).tolist() == [[0, 50, 6, 52, 8]]
    # a pass over the first 3 positions only can feed positions 1..3
    short = di.feed_back(GOLD[:1], predicted[:, :3], torch.tensor([[False, False, False, True, False]]))
    assert short.tolist() == [[0, 5, 6, 52, 8]]


def test_corruption_mask_extremes_never_touch_start_or_padding():
    assert not di.corruption_mask(LABELS, 0.0).any()
    assert torch.equal(di.corruption_mask(LABELS, 1.0), di.replaceable_positions(LABELS))
    # per-token levels σ_t ~ U(0, 1): still only replaceable positions
    labels = LABELS.repeat(50, 1)
    mask = di.corruption_mask(labels, 1.0, per_token_levels=True, generator=torch.Generator().manual_seed(0))
    assert not (mask & ~di.replaceable_positions(labels)).any() and mask.any()


@pytest.mark.parametrize("rate", [0.2, 0.6, 1.0])
def test_constant_rate_replaces_each_input_with_probability_rate(rate):
    gen = torch.Generator().manual_seed(1)
    labels = torch.randint(2, 50, (4000, 21))
    frac = di.corruption_mask(labels, rate, generator=gen)[:, 1:].float().mean().item()
    # 80,000 Bernoulli(rate) draws: standard error <= 0.0018
    assert frac == pytest.approx(rate, abs=0.008)


@pytest.mark.parametrize("rate", [0.3, 0.6])
def test_noise_level_forcing_corrupted_fraction_follows_the_stated_law(rate):
    # Each position draws σ_t ~ U(0, rate) and is corrupted with probability σ_t, independently of the others, so
    # each token is marginally Bernoulli(p), p = E[σ_t] = rate/2, independent across tokens. The corrupted fraction
    # F of a sequence with L replaceable inputs is Binomial(L, p)/L:
    #   E[F] = p,  Var[F] = p(1-p)/L.
    # rate 0.6, L = 20: E[F] = 0.3, Var[F] = 0.21/20 = 0.0105. One level per *sequence* instead would give
    # Var[F] = E[σ(1-σ)]/L + Var[σ] = (rate/2 - rate²/3)/L + rate²/12 = 0.009 + 0.03 = 0.039 (almost 4x).
    n, length = 20000, 20
    labels = torch.randint(2, 50, (n, length + 1))  # position 0 is the start token: L = 20 replaceable inputs
    mask = di.corruption_mask(labels, rate, per_token_levels=True, generator=torch.Generator().manual_seed(2))
    fraction = mask[:, 1:].float().mean(dim=1).double()
    p = rate / 2
    mean, var = p, p * (1 - p) / length
    # standard errors over 20,000 sequences: of the mean sqrt(var/n) <= 7.3e-4; of the variance about
    # var*sqrt(2/n) <= 1.1e-4
    assert fraction.mean().item() == pytest.approx(mean, abs=4 * (var / n) ** 0.5)
    assert fraction.var().item() == pytest.approx(var, rel=0.04)
    per_sequence_var = (rate / 2 - rate**2 / 3) / length + rate**2 / 12
    assert fraction.var().item() < 0.5 * per_sequence_var
    # and positions are independent: the corruption of neighbours is uncorrelated
    x = mask[:, 1:].float()
    correlation = torch.corrcoef(torch.stack([x[:, :-1].flatten(), x[:, 1:].flatten()]))[0, 1].item()
    assert abs(correlation) < 0.01


def test_random_replacements_never_draw_special_tokens():
    vocabulary = di.replacement_vocabulary(12, {0, 1, 2, 11, None, 40})  # ids outside the range are ignored
    assert vocabulary.tolist() == [3, 4, 5, 6, 7, 8, 9, 10]
    tokens = di.random_tokens((500, 16), vocabulary, generator=torch.Generator().manual_seed(3))
    counts = torch.bincount(tokens.flatten(), minlength=12)
    assert counts[[0, 1, 2, 11]].sum() == 0
    # uniform over the 8 allowed ids: 1000 each expected out of 8000
    assert counts[3:11].min() > 850 and counts[3:11].max() < 1150
    with pytest.raises(ValueError, match="special token"):
        di.replacement_vocabulary(2, {0, 1})


def test_corruption_rate_ramps_up_as_teacher_forcing_decays():
    # σ = max_rate · (1 - ε), ε with lower bound 0: linear k = 10 -> σ = 0.4 · min(1, s/10)
    assert [corruption_rate(s, 0.4, "linear", 10) for s in (0, 5, 10, 30)] == pytest.approx([0, 0.2, 0.4, 0.4])
    assert corruption_rate(7, 0.4, "constant", 10) == 0.4
    # exponential: σ = 0.4 (1 - e^(-1)) at s = k
    assert corruption_rate(10, 0.4, "exponential", 10) == pytest.approx(0.4 * (1 - 0.36787944117))


# ---- k-step rollout ------------------------------------------------------------------------------------------

def test_rollout_rows_and_labels_by_hand():
    # k = 2: anchors 0, 2, 4; chunks {1}, {3}, {5 -> outside T = 5}.
    # row 1 has real labels at 0..2 only: its chunk {3} is padding, so anchor 2 needs no row there.
    source, anchor = di.rollout_rows(LABELS, 2)
    assert source.tolist() == [0, 0, 1] and anchor.tolist() == [0, 2, 0]
    assert di.anchor_labels(LABELS, 2).tolist() == [[5, -100, 7, -100, 1], [9, -100, 1, -100, -100]]
    assert di.chunk_labels(LABELS, source, anchor, 2).tolist() == [[-100, 6, -100, -100, -100],
                                                                    [-100, -100, -100, 8, -100],
                                                                    [-100, 4, -100, -100, -100]]
    assert di.offset_positions(anchor, 1, 5).tolist() == [[False, True, False, False, False],
                                                           [False, False, False, True, False],
                                                           [False, True, False, False, False]]
    # shared row, k = 2: offset 1 = odd positions that are replaceable
    assert di.chunk_offset_positions(LABELS, 2, 1).tolist() == [[False, True, False, True, False],
                                                                [False, True, False, True, False]]


@pytest.mark.parametrize("k", [2, 3, 4, 7])
def test_every_real_target_is_trained_exactly_once(k):
    labels = torch.tensor([[3, 4, 5, 6, 7, 8, 1],
                           [3, 4, 1, -100, -100, -100, -100],
                           [9, 1, -100, -100, -100, -100, -100]])
    source, anchor = di.rollout_rows(labels, k)
    chunks = di.chunk_labels(labels, source, anchor, k)
    counts = (di.anchor_labels(labels, k) != -100).long()
    counts.index_add_(0, source, (chunks != -100).long())
    assert torch.equal(counts, (labels != -100).long())
