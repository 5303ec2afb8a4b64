"""Any reward spec scored in worker processes (`PooledReward`; trainers use it when `reward_workers >= 2`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .builtin import RewardFn
from .combine import build_reward
from .convention import call_reward, reward_name


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
