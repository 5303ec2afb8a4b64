"""Teacher-forcing ratio schedules at hand-computed points."""

import math

import pytest

from hf_seqrl.schedules import teacher_forcing_ratio


def test_linear():
    # ε = max(min, 1 - step/k), k = 100
    assert teacher_forcing_ratio(0, "linear", 100, 0.2) == 1.0
    assert teacher_forcing_ratio(30, "linear", 100, 0.2) == pytest.approx(0.7)
    assert teacher_forcing_ratio(90, "linear", 100, 0.2) == 0.2  # clamped


def test_exponential():
    # ε = min + (1 - min) e^(-step/k): step = k -> 0.5 + 0.5/e
    assert teacher_forcing_ratio(0, "exponential", 10, 0.5) == 1.0
    assert teacher_forcing_ratio(10, "exponential", 10, 0.5) == pytest.approx(0.5 + 0.5 / math.e)


def test_inverse_sigmoid():
    # ε = k / (k + e^(step/k)): step 0 -> k/(k+1); step = k ln k -> 1/2
    assert teacher_forcing_ratio(0, "inverse_sigmoid", 10, 0.0) == pytest.approx(10 / 11)
    assert teacher_forcing_ratio(10 * math.log(10), "inverse_sigmoid", 10, 0.0) == pytest.approx(0.5)
    assert teacher_forcing_ratio(10_000, "inverse_sigmoid", 10, 0.1) == 0.1  # clamped, no overflow


def test_constant_and_errors():
    assert teacher_forcing_ratio(123, "constant", 5, 0.75) == 0.75
    with pytest.raises(ValueError, match="Unknown schedule"):
        teacher_forcing_ratio(0, "cosine", 5)
    with pytest.raises(ValueError, match="step must be >= 0"):
        teacher_forcing_ratio(-1, "linear", 5)


@pytest.mark.parametrize("schedule", ["linear", "exponential", "inverse_sigmoid"])
def test_monotone_non_increasing_and_bounded(schedule):
    values = [teacher_forcing_ratio(s, schedule, 50, 0.3) for s in range(0, 500, 7)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert all(0.3 <= v <= 1.0 for v in values)
