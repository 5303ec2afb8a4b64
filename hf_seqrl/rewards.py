"""Sentence-level rewards, and how the trainers call them.

A reward is a callable called with keywords, one value per prediction:

    f(predictions: list[str], references: list[list[str]], sources: list[str] | None, **columns) -> list[float]

`columns` holds every other column of the training rows (a length budget, a domain, a glossary, ...), one entry per
prediction. A reward may declare `**kwargs` and read only what it needs. Built-ins are returned by `get_reward(name)`:

- `"bleu"`: sacrebleu `sentence_bleu` (exp smoothing, effective order) / 100.
- `"chrf"`: sacrebleu `sentence_chrf` / 100.
- `"rouge1"`, `"rouge2"`, `"rougeL"`, `"rougeLsum"`: rouge-score F1 with stemming; with several references,
  `score_multi` (the best reference).

An empty (or whitespace-only) prediction scores 0.0. An `evaluate.EvaluationModule` becomes a reward through
`EvaluateReward`. `build_reward` turns what a trainer's `reward_funcs` holds (a name, a callable, a module, or a
list of them) into one callable; `call_reward` calls it and checks what comes back.
"""

from __future__ import annotations

import importlib
import math
import numbers
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

RewardFn = Callable[..., Sequence[float]]

BUILTIN_REWARDS = ("bleu", "chrf", "rouge1", "rouge2", "rougeL", "rougeLsum")


def _unit(score: float) -> float:
    # sacrebleu scores are in [0, 100]; /100 can land a rounding error above 1.
    return min(1.0, score / 100.0)


# sacrebleu's own steps of `sentence_score`, called separately so that a reference set is prepared once. setup.cfg
# bounds the sacrebleu version; tests/test_rewards.py fails loudly if these internals change.
SACREBLEU_INTERNALS = ("_cache_references", "_compute_segment_statistics", "_preprocess_segment",
                       "_aggregate_and_compute")


def _sacrebleu_scores(metric, predictions: list[str], references: list[list[str]]) -> list[float]:
    """Returns `metric.sentence_score(pred, refs).score / 100` per pair, preparing each reference set once.

    The `n` samples of a source share its references: their n-gram statistics are extracted once and reused,
    with the same steps as sacrebleu's `sentence_score` (exact same values; see tests). Without those internals
    (another sacrebleu version) it calls the public `sentence_score` per pair.
    """
    if not all(hasattr(metric, name) for name in SACREBLEU_INTERNALS):
        return [_unit(metric.sentence_score(p, list(r)).score) if p.strip() else 0.0
                for p, r in zip(predictions, references)]
    prepared: dict[tuple[str, ...], Any] = {}
    scores = []
    for pred, refs in zip(predictions, references):
        if not pred.strip():
            scores.append(0.0)
            continue
        key = tuple(refs)
        if key not in prepared:
            prepared[key] = metric._cache_references([[r] for r in key])[0]
        stats = [metric._compute_segment_statistics(metric._preprocess_segment(pred), prepared[key])]
        scores.append(_unit(metric._aggregate_and_compute(stats).score))
    return scores


def bleu_reward(predictions: list[str], references: list[list[str]], sources: list[str] | None = None,
                **columns: Any) -> list[float]:
    """Returns sacrebleu sentence BLEU / 100 of each prediction against its references."""
    from sacrebleu.metrics import BLEU

    # effective_order=True and exp smoothing: the defaults of sacrebleu.sentence_bleu.
    return _sacrebleu_scores(BLEU(effective_order=True), predictions, references)


def chrf_reward(predictions: list[str], references: list[list[str]], sources: list[str] | None = None,
                **columns: Any) -> list[float]:
    """Returns sacrebleu sentence chrF / 100 of each prediction against its references."""
    from sacrebleu.metrics import CHRF

    return _sacrebleu_scores(CHRF(), predictions, references)


class _CachedTokenizer:
    """rouge-score's tokenizer (with Porter stemming) memoized: references and repeated samples are tokenized once."""

    def __init__(self, base, max_entries: int = 100_000):
        self.base = base
        self.max_entries = max_entries
        self.cache: dict[str, list[str]] = {}

    def tokenize(self, text: str) -> list[str]:
        tokens = self.cache.get(text)
        if tokens is None:
            if len(self.cache) >= self.max_entries:
                self.cache.clear()
            tokens = self.cache[text] = self.base.tokenize(text)
        return tokens


_ROUGE_SCORERS: dict[str, Any] = {}


def _rouge_scorer(rouge_type: str):
    if rouge_type not in _ROUGE_SCORERS:
        from rouge_score import rouge_scorer, tokenizers

        tokenizer = _CachedTokenizer(tokenizers.DefaultTokenizer(use_stemmer=True))
        _ROUGE_SCORERS[rouge_type] = rouge_scorer.RougeScorer([rouge_type], tokenizer=tokenizer)
    return _ROUGE_SCORERS[rouge_type]


def rouge_reward(rouge_type: str) -> RewardFn:
    """Returns the reward computing rouge-score F1 (`rouge_type`, stemming on, best reference)."""

    def reward(predictions: list[str], references: list[list[str]], sources: list[str] | None = None,
               **columns: Any) -> list[float]:
        scorer = _rouge_scorer(rouge_type)
        return [
            scorer.score_multi(list(refs), pred)[rouge_type].fmeasure if pred.strip() else 0.0
            for pred, refs in zip(predictions, references)
        ]

    reward.__name__ = reward.__qualname__ = f"{rouge_type}_reward"
    return reward


def get_reward(name: str) -> RewardFn:
    """Returns the reward callable named `name`: a built-in name or a `"module:function"` path."""
    if not isinstance(name, str):
        raise TypeError(f"get_reward expects a reward name (str), got {type(name).__name__}.")
    if name == "bleu":
        return bleu_reward
    if name == "chrf":
        return chrf_reward
    if name in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        return rouge_reward(name)
    if ":" in name:
        # Imported only because the user named it explicitly.
        module_name, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"reward {name!r}: cannot import {attr!r} from module {module_name!r} ({err}).") from err
        if not callable(fn):
            raise ValueError(f"reward {name!r} is not callable.")
        return fn
    raise ValueError(
        f"Unknown reward {name!r}. Valid names: {', '.join(BUILTIN_REWARDS)}, or 'module:function' for your own, "
        "or pass a callable f(predictions, references, sources, **columns) -> list[float]."
    )


def is_evaluation_module(obj: Any) -> bool:
    """Returns True for an `evaluate.EvaluationModule` (checked without importing `evaluate`)."""
    evaluate = sys.modules.get("evaluate")
    return evaluate is not None and isinstance(obj, evaluate.EvaluationModule)


def check_reward_spec(spec: Any, weights: Sequence[float] | None = None) -> None:
    """Raises a clear error if `spec` (what `reward_funcs` takes) or `weights` is invalid.

    Built-in names are checked without importing the metric libraries.
    """
    items = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    if not items:
        raise ValueError("reward_funcs is an empty list: name at least one reward, e.g. reward_funcs='bleu'.")
    for item in items:
        if callable(item) or is_evaluation_module(item) or (isinstance(item, str) and ":" in item):
            continue
        if not isinstance(item, str) or item not in BUILTIN_REWARDS:
            raise ValueError(
                f"reward_funcs: unknown reward {item!r}. Valid names: {', '.join(BUILTIN_REWARDS)}, a "
                "'module:function' path, a callable, or an evaluate.EvaluationModule."
            )
    if weights is not None:
        if len(weights) != len(items):
            raise ValueError(
                f"SeqRLConfig.reward_weights has {len(weights)} values for {len(items)} reward_funcs: give one weight "
                "per reward, or None for equal weights."
            )
        if any(not math.isfinite(float(w)) for w in weights):
            raise ValueError("SeqRLConfig.reward_weights must be finite numbers.")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def as_reward(item: Any) -> RewardFn:
    """Returns the callable for one entry of `reward_funcs`: a name, a callable or an `evaluate` module."""
    if is_evaluation_module(item):
        from .reward_wrappers import EvaluateReward

        return EvaluateReward(item)
    return item if callable(item) else get_reward(item)


class WeightedReward:
    """A weighted sum of rewards; with no weights given, every reward has weight `1 / k` (their mean)."""

    def __init__(self, rewards: Sequence[Any], weights: Sequence[float] | None = None):
        check_reward_spec(list(rewards), weights)
        self.rewards = [as_reward(r) for r in rewards]
        self.names = [reward_name(r) for r in self.rewards]
        k = len(self.rewards)
        self.weights = [float(w) for w in weights] if weights is not None else [1.0 / k] * k
        self.__name__ = "+".join(f"{w:g}*{n}" for w, n in zip(self.weights, self.names))

    def __call__(self, predictions, references, sources=None, **columns) -> list[float]:
        total = [0.0] * len(predictions)
        for fn, name, weight in zip(self.rewards, self.names, self.weights):
            values = call_reward(fn, predictions, references, sources, columns, name=name)
            total = [t + weight * v for t, v in zip(total, values)]
        return total


def reward_name(reward: Any) -> str:
    """Returns a readable name of a reward spec."""
    if isinstance(reward, str):
        return reward
    if is_evaluation_module(reward):
        return reward.name
    return getattr(reward, "__name__", None) or type(reward).__name__


def build_reward(spec: Any, weights: Sequence[float] | None = None, workers: int = 0) -> RewardFn:
    """Returns one callable for `reward_funcs`: a name, a callable, an `evaluate` module, or a list of those.

    A list is combined with `weights` (`None`: their mean). `workers >= 2` scores large batches in that many
    worker processes (`PooledReward`).
    """
    if workers >= 2:
        from .reward_wrappers import PooledReward

        return PooledReward(spec, weights, workers)
    if isinstance(spec, (list, tuple)):
        if len(spec) == 1 and weights is None:
            spec = spec[0]
        else:
            return WeightedReward(spec, weights)
    check_reward_spec(spec, weights)
    fn = as_reward(spec)
    if weights is not None and float(weights[0]) != 1.0:
        return WeightedReward([fn], weights)
    return fn


def normalize_references(references: Any, field_name: str = "references", offset: int = 0) -> list[list[str]]:
    """Returns references as a list (one per source) of non-empty lists of non-empty strings.

    Each row may be a string or a list of strings. Raises a clear error naming the row (counted from `offset`)
    otherwise.
    """
    rows = []
    for i, row in enumerate(references, start=offset):
        refs = [row] if isinstance(row, str) else row
        if not isinstance(refs, (list, tuple)):
            raise TypeError(
                f"{field_name}[{i}] is a {type(row).__name__}; each row must be a string or a list of strings."
            )
        if len(refs) == 0:
            raise ValueError(f"{field_name}[{i}] is an empty list: give at least one reference per source.")
        for ref in refs:
            if not isinstance(ref, str):
                raise TypeError(
                    f"{field_name}[{i}] contains a {type(ref).__name__} ({ref!r}); references must be strings."
                )
            if not ref.strip():
                raise ValueError(
                    f"{field_name}[{i}] contains an empty reference string: every prediction would score 0 "
                    "against it. Drop it or the row."
                )
        rows.append(list(refs))
    return rows


def call_reward(
    reward_fn: RewardFn,
    predictions: list[str],
    references: list[list[str]],
    sources: list[str] | None = None,
    columns: dict[str, list] | None = None,
    name: str | None = None,
    batch_index: int | None = None,
) -> list[float]:
    """Returns `reward_fn(predictions=, references=, sources=, **columns)` as a list of floats, checked.

    Accepts a list, tuple, numpy array or 1-D tensor of real numbers (a NaN or inf passes through; the caller
    decides). A wrong count, a value that is not a real number (a string, None, a bool, a nested list), a tensor
    that is not 1-D, or an exception inside the reward raises an error naming the reward, the index and the batch.
    """
    name = name or reward_name(reward_fn)
    where = "" if batch_index is None else f" on batch {batch_index}"
    try:
        values = reward_fn(predictions=predictions, references=references, sources=sources, **(columns or {}))
    except Exception as err:
        hint = ""
        if isinstance(err, TypeError) and "unexpected keyword argument" in str(err):
            hint = (" (rewards are called with keywords: predictions, references, sources and every other dataset "
                    "column; declare **kwargs to take the columns you do not use)")
        raise RuntimeError(f"reward {name!r} raised {type(err).__name__}{where}: {err}{hint}") from err
    if hasattr(values, "detach"):
        values = values.detach().cpu()
    if hasattr(values, "ndim") and values.ndim != 1:
        raise ValueError(f"reward {name!r} returned an array of shape {tuple(values.shape)}{where}: return one number "
                         f"per prediction, shape ({len(predictions)},).")
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"reward {name!r} must return a list of numbers{where}, got {type(values).__name__}.")
    values = list(values)
    if len(values) != len(predictions):
        raise ValueError(
            f"reward {name!r} returned {len(values)} values for {len(predictions)} predictions{where}: it must return "
            "exactly one float per prediction."
        )
    for i, value in enumerate(values):
        if not _is_number(value):
            raise TypeError(f"reward {name!r} returned {value!r} ({type(value).__name__}) at index {i}{where}: every "
                            "value must be a real number (int or float; not a string, None or a bool).")
    return [float(v) for v in values]


def check_finite(values: Sequence[float], name: str) -> None:
    """Raises a clear error if any reward value is NaN or inf."""
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    if bad:
        raise ValueError(
            f"reward {name!r} returned non-finite values (NaN or inf) at sample indices {bad[:10]}: fix the reward, "
            "or set SeqRLConfig.nonfinite_rewards='drop' to give those samples zero advantage."
        )


_WRAPPERS = ("EvaluateReward", "PooledReward", "accepts_reference_lists")


def __getattr__(name):
    # The wrappers build on this module, so they are imported on first use (a spawned worker may import either
    # module first).
    if name in _WRAPPERS:
        from . import reward_wrappers

        return getattr(reward_wrappers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
