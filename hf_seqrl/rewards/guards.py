"""Guards: rewards that keep outputs in shape beside a quality reward. `length_ratio` scores how far an output's length
strays from its reference's; `repetition` how much of it repeats itself; `source_copy` how much it copies its source;
`target_language` how much of it is in the language it should be in. `combine.GuardedReward` gates a reward by them.

A policy trained on one learned metric finds what the metric forgives: an embedding similarity or a BERTScore rewards
long outputs, and a quality-estimation metric never sees the reference's length at all. A guard mixed in with a small
weight (`reward_funcs=["bleu", "length_ratio"]`) makes that drift cost something.

Pure Python at import (`builtin.get_reward` names them): `source_copy` imports sacrebleu when called, and
`target_language` the language identifier `py3langid` (an extra) when built.
"""

from __future__ import annotations

import math
import re
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


# ---- repetition, source copying, the target language ----------------------------------------------------------------

def repetition_rate(text: str, n: int = 3) -> float:
    """Returns the share of `text`'s word `n`-grams that repeat an earlier one: `(count - distinct) / count`, 0.0 for
    a text of fewer than `n` words (nothing can repeat) and close to 1.0 for one phrase over and over."""
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 0.0 if not grams else (len(grams) - len(set(grams))) / len(grams)


class RepetitionReward:
    """The `repetition` guard (`repetition_reward`); a class so that `reward_workers` can pickle it."""

    def __init__(self, n: int = 3):
        if n < 1:
            raise ValueError(f"repetition_reward: n={n} must be >= 1 (the n-gram order).")
        self.n = n
        self.__name__ = "repetition"

    def __call__(self, predictions: list[str], references=None, sources=None, **columns: Any) -> list[float]:
        return [1.0 - repetition_rate(prediction, self.n) for prediction in predictions]


def repetition_reward(n: int = 3) -> RepetitionReward:
    """Returns the guard against repeated phrases: `1 - repetition_rate(output, n)`, the share of the output's word
    `n`-grams that are not a repeat of an earlier one (1.0 without repetition). `get_reward("repetition")` is this at
    `n=3`."""
    return RepetitionReward(n)


def overlap_penalty(overlap: float, threshold: float) -> float:
    """Returns 1.0 for an `overlap` (in [0, 1]) at or below `threshold`, falling linearly to 0.0 at full overlap."""
    if overlap <= threshold:
        return 1.0
    return max(0.0, 1.0 - (overlap - threshold) / (1.0 - threshold))


# Sentence chrF (0-1) of a reference against its source that 99% of Multi30k de->en training pairs stay at or below
# (benchmarks/guard_calibration.py): an output above it looks more like its source than translations do.
SOURCE_COPY_THRESHOLD = 0.317


class SourceCopyReward:
    """The `source_copy` guard (`source_copy_reward`); a class so that `reward_workers` can pickle it."""

    def __init__(self, threshold: float = SOURCE_COPY_THRESHOLD):
        if not 0.0 <= threshold < 1.0:
            raise ValueError(f"source_copy_reward: threshold={threshold} must be in [0, 1).")
        self.threshold = float(threshold)
        self.__name__ = "source_copy"

    def __call__(self, predictions: list[str], references=None, sources: list[str] | None = None,
                 **columns: Any) -> list[float | None]:
        if sources is None:
            raise ValueError("source_copy compares each output with its source: add a `sources` column (or text "
                             "columns) to the dataset.")
        import sacrebleu  # the chrF every chrF in the package computes; not needed to import the guards

        return [overlap_penalty(sacrebleu.sentence_chrf(prediction, [source]).score / 100, self.threshold)
                if source else None for prediction, source in zip(predictions, sources)]


def source_copy_reward(threshold: float = SOURCE_COPY_THRESHOLD) -> SourceCopyReward:
    """Returns the guard against copying the source: 1.0 while the output's sentence chrF against its source stays at
    or below `threshold`, falling linearly to 0.0 for an exact copy (`overlap_penalty`). A row without a source gets
    None. `get_reward("source_copy")` is this with the default threshold, measured on Multi30k de->en (names and
    numbers carry over between languages, so translations overlap their sources a little)."""
    return SourceCopyReward(threshold)


SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+")


class TargetLanguageReward:
    """The `target_language` guard (`target_language_reward`)."""

    def __init__(self, lang: str, languages: Sequence[str] | None = None, min_letters: int = 12):
        try:
            from py3langid.langid import MODEL_FILE, LanguageIdentifier
        except ImportError as err:
            raise ImportError("target_language_reward identifies languages with py3langid, which ships its model: "
                              "pip install 'hf-seqrl[langid]' (or pip install py3langid).") from err
        self.identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        known = set(self.identifier.nb_classes)
        wanted = [lang, *(languages or [])]
        unknown = sorted(set(wanted) - known)
        if unknown:
            raise ValueError(f"target_language_reward: {unknown} not among py3langid's ISO 639-1 codes (e.g. 'en', "
                             "'de', 'fr', 'zh').")
        if languages:
            self.identifier.set_languages(sorted(set(wanted)))
        self.lang, self.languages, self.min_letters = lang, list(languages or []), min_letters
        self.__name__ = "target_language"

    def share(self, text: str) -> float:
        """Returns the share of `text`'s letters in sentences identified as the target language; 1.0 when no
        sentence has `min_letters` letters (too short to tell)."""
        total = target = 0
        for sentence in SENTENCE_END.split(text.strip()):
            letters = sum(char.isalpha() for char in sentence)
            if letters < self.min_letters:
                continue
            total += letters
            target += letters if self.identifier.classify(sentence)[0] == self.lang else 0
        return 1.0 if total == 0 else target / total

    def __call__(self, predictions: list[str], references=None, sources=None, **columns: Any) -> list[float]:
        return [self.share(prediction) for prediction in predictions]

    def __getstate__(self):  # the identifier is rebuilt in a worker process rather than pickled
        return {"lang": self.lang, "languages": self.languages, "min_letters": self.min_letters}

    def __setstate__(self, state):
        self.__init__(state["lang"], state["languages"], state["min_letters"])


def target_language_reward(lang: str, languages: Sequence[str] | None = None,
                           min_letters: int = 12) -> TargetLanguageReward:
    """Returns the guard against off-target output: the share of the output's letters in sentences that `py3langid`
    (an extra: `pip install 'hf-seqrl[langid]'`; its model ships with it, no download) identifies as `lang`.

    Sentences with fewer than `min_letters` letters are not identified (a name, a number, two words: language ID
    guesses there), and an output with no longer sentence scores 1.0; pair the guard with `length_ratio` against
    outputs that are short on purpose. `languages` restricts the identifier to those candidates and `lang` (e.g.
    `["de", "en"]` for a German-English model: a confusion with a third language then counts for neither).

    Args:
        lang (`str`): the target language's ISO 639-1 code (`"en"`, `"de"`, ...).
        languages (`list[str]`, *optional*): the only languages to tell apart; all 97 of py3langid's by default.
        min_letters (`int`, *optional*, defaults to `12`): the shortest sentence identified.
    """
    return TargetLanguageReward(lang, languages, min_letters)
