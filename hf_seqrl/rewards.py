"""Sentence-level rewards.

A reward is any callable `f(predictions: list[str], references: list[list[str]], sources: list[str] | None = None)
-> list[float]` returning one value per prediction. Built-ins are returned by `get_reward(name)`:

- `"bleu"`: sacrebleu `sentence_bleu` (exp smoothing, effective order) / 100.
- `"chrf"`: sacrebleu `sentence_chrf` / 100.
- `"rouge1"`, `"rouge2"`, `"rougeL"`, `"rougeLsum"`: rouge-score F1 with stemming; with several references,
  `score_multi` (the best reference).

An empty (or whitespace-only) prediction scores 0.0.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any

RewardFn = Callable[..., Sequence[float]]

BUILTIN_REWARDS = ("bleu", "chrf", "rouge1", "rouge2", "rougeL", "rougeLsum")


def _unit(score: float) -> float:
    # sacrebleu scores are in [0, 100]; /100 can land a rounding error above 1.
    return min(1.0, score / 100.0)


def _sacrebleu_scores(metric, predictions: list[str], references: list[list[str]]) -> list[float]:
    """Returns `metric.sentence_score(pred, refs).score / 100` per pair, preparing each reference set once.

    The `n` samples of a source share its references: their n-gram statistics are extracted once and reused,
    with the same steps as sacrebleu's `sentence_score` (exact same values; see tests).
    """
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


def bleu_reward(predictions: list[str], references: list[list[str]], sources: list[str] | None = None) -> list[float]:
    """Returns sacrebleu sentence BLEU / 100 of each prediction against its references."""
    from sacrebleu.metrics import BLEU

    # effective_order=True and exp smoothing: the defaults of sacrebleu.sentence_bleu.
    return _sacrebleu_scores(BLEU(effective_order=True), predictions, references)


def chrf_reward(predictions: list[str], references: list[list[str]], sources: list[str] | None = None) -> list[float]:
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

    def reward(predictions: list[str], references: list[list[str]], sources: list[str] | None = None) -> list[float]:
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
        "or pass a callable f(predictions, references, sources=None) -> list[float]."
    )


def check_reward_spec(spec: Any, weights: Sequence[float] | None = None) -> None:
    """Raises a clear error if `spec` (a name, callable, or list of them) or `weights` is invalid.

    Built-in names are checked without importing the metric libraries.
    """
    items = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    if not items:
        raise ValueError("SeqRLConfig.reward is an empty list: name at least one reward, e.g. reward='bleu'.")
    for item in items:
        if callable(item) or (isinstance(item, str) and ":" in item):
            continue
        if not isinstance(item, str) or item not in BUILTIN_REWARDS:
            raise ValueError(
                f"SeqRLConfig.reward: unknown reward {item!r}. Valid names: {', '.join(BUILTIN_REWARDS)}, "
                "a 'module:function' path, or a callable."
            )
    if weights is not None:
        if len(weights) != len(items):
            raise ValueError(
                f"SeqRLConfig.reward_weights has {len(weights)} values for {len(items)} rewards: give one weight "
                "per reward, or None for equal weights."
            )
        if any(not math.isfinite(float(w)) for w in weights):
            raise ValueError("SeqRLConfig.reward_weights must be finite numbers.")


class WeightedReward:
    """A weighted sum of rewards; with no weights given, every reward has weight `1 / k` (their mean)."""

    def __init__(self, rewards: Sequence[Any], weights: Sequence[float] | None = None):
        check_reward_spec(list(rewards), weights)
        self.rewards = [r if callable(r) else get_reward(r) for r in rewards]
        self.names = [reward_name(r) for r in rewards]
        k = len(self.rewards)
        self.weights = [float(w) for w in weights] if weights is not None else [1.0 / k] * k
        self.__name__ = "+".join(f"{w:g}*{n}" for w, n in zip(self.weights, self.names))

    def __call__(self, predictions, references, sources=None) -> list[float]:
        total = [0.0] * len(predictions)
        for fn, name, weight in zip(self.rewards, self.names, self.weights):
            values = call_reward(fn, predictions, references, sources, name=name)
            total = [t + weight * v for t, v in zip(total, values)]
        return total


def reward_name(reward: Any) -> str:
    """Returns a readable name of a reward spec."""
    if isinstance(reward, str):
        return reward
    return getattr(reward, "__name__", None) or type(reward).__name__


def build_reward(spec: Any, weights: Sequence[float] | None = None, workers: int = 0) -> RewardFn:
    """Returns one callable for a reward spec: a name, a callable, or a list of those (weighted).

    `workers >= 2` scores large batches in that many worker processes (`PooledReward`).
    """
    if workers >= 2:
        return PooledReward(spec, weights, workers)
    if isinstance(spec, (list, tuple)):
        if len(spec) == 1 and weights is None:
            spec = spec[0]
        else:
            return WeightedReward(spec, weights)
    check_reward_spec(spec, weights)
    fn = spec if callable(spec) else get_reward(spec)
    if weights is not None and float(weights[0]) != 1.0:
        return WeightedReward([fn], weights)
    return fn


_WORKER_REWARDS: dict[str, RewardFn] = {}


def _score_chunk(spec: Any, weights: Sequence[float] | None, predictions, references, sources) -> list[float]:
    """Worker side of `PooledReward`: builds the reward once per process (keeping its caches) and scores a chunk."""
    key = repr((spec, weights))
    if key not in _WORKER_REWARDS:
        _WORKER_REWARDS[key] = build_reward(spec, weights)
    return call_reward(_WORKER_REWARDS[key], predictions, references, sources)


class PooledReward:
    """A reward spec scored in `workers` processes when a batch has at least `min_pairs` predictions.

    Sentence BLEU, chrF and ROUGE are pure Python: one process scores about 1-5k pairs a second, which a
    large batch of summaries turns into a noticeable part of a step. Chunks are contiguous, so the samples of
    a source usually land in the same worker and share its prepared references. The pool (spawned, so it
    shares nothing with torch or CUDA state) starts on first use and lives until the process exits. Values
    are exactly those of the in-process reward.

    Args:
        spec: what `build_reward` takes; callables must be picklable (module-level functions, not lambdas).
        weights (`list[float]`, *optional*): as in `build_reward`.
        workers (`int`): worker processes.
        min_pairs (`int`, *optional*, defaults to `256`): smaller batches are scored in-process.
    """

    def __init__(self, spec: Any, weights: Sequence[float] | None, workers: int, min_pairs: int = 256):
        import pickle

        try:
            pickle.dumps((spec, weights))
        except Exception as err:
            raise ValueError(
                f"reward_workers={workers} needs a picklable reward (a name, 'module:function', or a module-level "
                f"function), got {spec!r}: {err}. Set reward_workers=0 to score in-process."
            ) from err
        self.spec, self.weights, self.workers, self.min_pairs = spec, weights, workers, min_pairs
        self.local = build_reward(spec, weights)
        self.__name__ = reward_name(self.local)
        self._pool = None

    def _executor(self):
        if self._pool is None:
            import atexit
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
            atexit.register(self._pool.shutdown, cancel_futures=True)
        return self._pool

    def __call__(self, predictions, references, sources=None) -> list[float]:
        if len(predictions) < self.min_pairs:
            return call_reward(self.local, predictions, references, sources, name=self.__name__)
        size = -(-len(predictions) // self.workers)
        chunks = [slice(start, start + size) for start in range(0, len(predictions), size)]
        futures = [self._executor().submit(_score_chunk, self.spec, self.weights, list(predictions[c]),
                                           list(references[c]), None if sources is None else list(sources[c]))
                   for c in chunks]
        return [value for future in futures for value in future.result()]

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_pool"] = None
        return state


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
    name: str | None = None,
    batch_index: int | None = None,
) -> list[float]:
    """Returns `reward_fn`'s values as a list of floats after checking count and type.

    Accepts lists, tuples, numpy arrays and tensors. NaN/inf pass through (the caller decides); a wrong count,
    a non-numeric value or an exception inside the reward raises an error naming the reward (and the batch).
    """
    name = name or reward_name(reward_fn)
    where = "" if batch_index is None else f" on batch {batch_index}"
    try:
        values = reward_fn(predictions, references, sources)
    except Exception as err:
        raise RuntimeError(f"reward {name!r} raised {type(err).__name__}{where}: {err}") from err
    if hasattr(values, "detach"):
        values = values.detach().cpu()
    if hasattr(values, "tolist"):
        values = values.tolist()
    try:
        values = [float(v) for v in values]
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"reward {name!r} must return a sequence of numbers{where}, got {type(values).__name__}."
        ) from err
    if len(values) != len(predictions):
        raise ValueError(
            f"reward {name!r} returned {len(values)} values for {len(predictions)} predictions{where}: it must return "
            "exactly one float per prediction."
        )
    return values


def check_finite(values: Sequence[float], name: str) -> None:
    """Raises a clear error if any reward value is NaN or inf."""
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    if bad:
        raise ValueError(
            f"reward {name!r} returned non-finite values (NaN or inf) at sample indices {bad[:10]}: fix the reward, "
            "or set SeqRLConfig.nonfinite_rewards='drop' to give those samples zero advantage."
        )
