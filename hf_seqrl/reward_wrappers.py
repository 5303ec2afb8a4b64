"""Rewards built around other scorers: an `evaluate.EvaluationModule` scored per prediction (`EvaluateReward`), and
any reward spec scored in worker processes (`PooledReward`). `hf_seqrl.rewards` re-exports both."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .rewards import RewardFn, _is_number, build_reward, call_reward, is_evaluation_module, reward_name


def accepts_reference_lists(module) -> bool:
    """Returns True when one of `module`'s input formats takes a list of references per prediction."""
    options = module.features if isinstance(module.features, (list, tuple)) else [module.features]
    for features in options:
        feature = features.get("references") if hasattr(features, "get") else None
        if isinstance(feature, (list, tuple)) or type(feature).__name__ in ("Sequence", "List", "LargeList"):
            return True
    return False


class EvaluateReward:
    """A reward that scores each prediction with an `evaluate.EvaluationModule`.

    One `compute` call over the batch when the module returns a per-example list (one value per prediction) under
    `key`; otherwise one call per (prediction, reference) pair. The choice is made on the first batch and kept.
    Several references: a module whose `references` feature is a sequence gets all of a prediction's references;
    any other module scores the prediction against each reference and the best value counts (as ROUGE's
    `score_multi` does).

    Args:
        module (`evaluate.EvaluationModule`): e.g. `evaluate.load("path/to/metric.py")`.
        key (`str`, *optional*): the output to use; by default the module's only numeric output (an error lists the
            outputs when there are several).
        scale (`float`, *optional*, defaults to `1.0`): multiplies every value (`0.01` for a metric in [0, 100]).
        compute_kwargs: passed to every `compute` call (e.g. `lang="en"`).
    """

    def __init__(self, module, key: str | None = None, scale: float = 1.0, **compute_kwargs: Any):
        if not is_evaluation_module(module):
            raise TypeError(f"EvaluateReward needs an evaluate.EvaluationModule, got {type(module).__name__}.")
        self.module, self.key, self.scale, self.compute_kwargs = module, key, float(scale), compute_kwargs
        self.multi_reference = accepts_reference_lists(module)
        self.per_example: bool | None = None  # decided on the first batch
        self.__name__ = module.name if key is None else f"{module.name}:{key}"

    def _compute(self, predictions: list[str], references: list) -> dict:
        result = self.module.compute(predictions=predictions, references=references, **self.compute_kwargs)
        if not isinstance(result, dict):
            raise TypeError(f"evaluate module {self.module.name!r} returned {type(result).__name__}, not a dict.")
        return result

    def _pick(self, result: dict, count: int) -> tuple[str, bool]:
        """Returns `(key, per_example)`: which output to read and whether it holds one value per prediction."""
        def per_example(value) -> bool:
            value = value.tolist() if hasattr(value, "tolist") else value
            return isinstance(value, (list, tuple)) and len(value) == count and all(map(_is_number, value))

        if self.key is not None:
            if self.key not in result:
                raise KeyError(f"evaluate module {self.module.name!r} has no output {self.key!r}; its outputs: "
                               f"{sorted(result)}.")
            return self.key, per_example(result[self.key])
        lists = [k for k, v in result.items() if per_example(v)]
        scalars = [k for k, v in result.items() if _is_number(v) or (hasattr(v, "ndim") and v.ndim == 0)]
        if len(lists) == 1:
            return lists[0], True
        if not lists and len(scalars) == 1:
            return scalars[0], False
        raise ValueError(
            f"evaluate module {self.module.name!r} returns several numeric outputs {sorted(lists or scalars)}: say "
            f"which one is the reward with EvaluateReward(module, key=...)."
        )

    def _pairs(self, predictions: list[str], references: list[list[str]]) -> tuple[list[str], list, list[int]]:
        """Returns the (prediction, reference-argument) pairs to score and the prediction index of each pair."""
        if self.multi_reference:
            return list(predictions), [list(r) for r in references], list(range(len(predictions)))
        owners = [i for i, refs in enumerate(references) for _ in refs]
        return [predictions[i] for i in owners], [ref for refs in references for ref in refs], owners

    def __call__(self, predictions: list[str], references: list[list[str]], sources=None, **columns) -> list[float]:
        if not predictions:
            return []
        preds, refs, owners = self._pairs(predictions, references)
        values: list[float] = []
        if self.per_example is not False:
            result = self._compute(preds, refs)
            key, self.per_example = self._pick(result, len(preds))
            self.key = key
            if self.per_example:
                value = result[key]
                values = list(value.tolist() if hasattr(value, "tolist") else value)
        if not self.per_example:
            values = [self._compute([p], [r])[self.key] for p, r in zip(preds, refs)]
        best = [-math.inf] * len(predictions)
        for owner, value in zip(owners, values):
            value = float(value.item() if hasattr(value, "item") else value)
            best[owner] = max(best[owner], value)
        return [self.scale * v for v in best]


_WORKER_REWARDS: dict[str, RewardFn] = {}


def _score_chunk(spec: Any, weights: Sequence[float] | None, predictions, references, sources, columns) -> list[float]:
    """Worker side of `PooledReward`: builds the reward once per process (keeping its caches) and scores a chunk."""
    key = repr((spec, weights))
    if key not in _WORKER_REWARDS:
        _WORKER_REWARDS[key] = build_reward(spec, weights)
    return call_reward(_WORKER_REWARDS[key], predictions, references, sources, columns)


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

    def __call__(self, predictions, references, sources=None, **columns) -> list[float]:
        if len(predictions) < self.min_pairs:
            return call_reward(self.local, predictions, references, sources, columns, name=self.__name__)
        size = -(-len(predictions) // self.workers)
        chunks = [slice(start, start + size) for start in range(0, len(predictions), size)]
        futures = [self._executor().submit(_score_chunk, self.spec, self.weights, list(predictions[c]),
                                           list(references[c]), None if sources is None else list(sources[c]),
                                           {k: list(v[c]) for k, v in columns.items()})
                   for c in chunks]
        return [value for future in futures for value in future.result()]

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_pool"] = None
        return state
