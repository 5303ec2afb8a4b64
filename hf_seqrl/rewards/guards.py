"""Guards: rewards that keep outputs in shape beside a quality reward. `length_ratio` scores how far an output's length
strays from its reference's.

A policy trained on one learned metric finds what the metric forgives: an embedding similarity or a BERTScore rewards
long outputs, and a quality-estimation metric never sees the reference's length at all. A guard mixed in with a small
weight (`reward_funcs=["bleu", "length_ratio"]`) makes that drift cost something.

Pure Python, no import beyond the standard library, so `builtin.get_reward` can name it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

LENGTH_UNITS = ("words", "chars")


def text_length(text: str, unit: str = "words") -> int:
    """Returns the length of `text`: its whitespace-separated words (`unit="words"`), or its characters other than
    whitespace (`unit="chars"`, for scripts written without spaces; spacing that detokenization changes does not
    count)."""
    if unit == "words":
        return len(text.split())
    if unit == "chars":
        return sum(not char.isspace() for char in text)
    raise ValueError(f"length unit {unit!r} is not one of {LENGTH_UNITS}.")


def length_ratio(prediction: str, reference: str, unit: str = "words") -> float:
    """Returns `text_length(prediction) / text_length(reference)`: 1.0 for equal lengths, 0.5 for half as long. An empty
    reference gives 1.0 for an empty prediction and `inf` for any other."""
    predicted, wanted = text_length(prediction, unit), text_length(reference, unit)
    if wanted == 0:
        return 1.0 if predicted == 0 else math.inf
    return predicted / wanted


def closest_length(length: int, lengths: Sequence[int]) -> int:
    """Returns the entry of `lengths` closest to `length`; of two equally close, the shorter (as BLEU's brevity penalty
    picks its reference length)."""
    return min(lengths, key=lambda candidate: (abs(candidate - length), candidate))


def band_value(ratio: float, low: float = 0.8, high: float = 1.2) -> float:
    """Returns 1.0 for a `ratio` inside `[low, high]`, falling linearly outside it by the distance to the band's edge
    relative to that edge: `ratio / low` below the band (0 for an empty output), `1 - (ratio - high) / high` above it
    (0 at twice `high`, and beyond)."""
    if ratio < low:
        return ratio / low
    if ratio > high:
        return max(0.0, 1.0 - (ratio - high) / high)
    return 1.0


class LengthRatioReward:
    """The `length_ratio` reward (see `length_ratio_reward`); a class so that `reward_workers` can pickle it."""

    def __init__(self, low: float = 0.8, high: float = 1.2, unit: str = "words"):
        if unit not in LENGTH_UNITS:
            raise ValueError(f"length_ratio_reward: unit={unit!r} is not one of {LENGTH_UNITS}.")
        if not (0 < low <= high and math.isfinite(high)):
            raise ValueError(f"length_ratio_reward: the band needs 0 < low <= high < inf, got low={low}, high={high}.")
        self.low, self.high, self.unit = float(low), float(high), unit
        self.__name__ = "length_ratio"

    def lengths(self, references: Sequence[str], source: str | None = None) -> list[int]:
        """Returns the lengths a prediction is measured against: its non-empty references', or `source`'s when it has
        none; empty when neither is there."""
        lengths = [length for length in (text_length(ref, self.unit) for ref in references) if length > 0]
        if not lengths and source is not None and text_length(source, self.unit) > 0:
            lengths = [text_length(source, self.unit)]
        return lengths

    def ratio(self, prediction: str, references: Sequence[str], source: str | None = None) -> float | None:
        """Returns the prediction's length over the length of its closest non-empty reference (as BLEU's brevity
        penalty picks it), or of `source` when it has none; None when neither is there. The ratio `rl/length_ratio`
        logs."""
        lengths = self.lengths(references, source)
        if not lengths:
            return None
        predicted = text_length(prediction, self.unit)
        return predicted / closest_length(predicted, lengths)

    def value(self, prediction: str, references: Sequence[str], source: str | None = None) -> float | None:
        """Returns the reward of `prediction`: `band_value` of its length ratio to each non-empty reference (or to
        `source` when it has none), the best of them, as every reward takes the best reference; None when there is
        nothing to measure against."""
        lengths = self.lengths(references, source)
        if not lengths:
            return None
        predicted = text_length(prediction, self.unit)
        return max(band_value(predicted / length, self.low, self.high) for length in lengths)

    def __call__(self, predictions: list[str], references: list[list[str]], sources: list[str] | None = None,
                 **columns: Any) -> list[float | None]:
        return [self.value(prediction, references[i] if references else [], None if sources is None else sources[i])
                for i, prediction in enumerate(predictions)]

    def __repr__(self) -> str:
        return f"length_ratio_reward(low={self.low:g}, high={self.high:g}, unit={self.unit!r})"


def length_ratio_reward(low: float = 0.8, high: float = 1.2, unit: str = "words") -> LengthRatioReward:
    """Returns the reward that keeps an output's length near its reference's: 1.0 while the output is `low` to `high`
    times as long as the reference, falling linearly outside (`band_value`). `get_reward("length_ratio")` is this with
    the defaults.

    With several references the best value counts (an output inside the band of any reference scores 1.0); a
    prediction without a non-empty reference is measured against its source (quality-estimation setups, where the
    rows have no reference), and gets None (no reward, it leaves the loss) when it has no source either.

    Args:
        low (`float`, *optional*, defaults to `0.8`), high (`float`, *optional*, defaults to `1.2`): the band of length
            ratios that scores 1.0; `0 < low <= high`. Against a source in another language, set it to that language
            pair's usual ratio.
        unit (`str`, *optional*, defaults to `"words"`): `"words"` (whitespace-separated) or `"chars"` (characters
            other than whitespace: Chinese, Japanese, Thai).
    """
    return LengthRatioReward(low, high, unit)
