"""Any reward spec scored in worker processes (`PooledReward`; trainers use it when `reward_workers >= 2`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .builtin import RewardFn
from .combine import build_reward
from .convention import call_reward_parts, combine_parts, part_weights, reward_name


_WORKER_REWARDS: dict[str, RewardFn] = {}


def _score_chunk(spec: Any, weights: Sequence[float] | None, predictions, references, sources,
                 columns) -> dict[str, list[float]]:
    """Worker side of `PooledReward`: builds the reward once per process (keeping its caches) and returns each of
    its parts' values on a chunk."""
    key = repr((spec, weights))
    if key not in _WORKER_REWARDS:
        _WORKER_REWARDS[key] = build_reward(spec, weights)
    reward = _WORKER_REWARDS[key]
    return call_reward_parts(reward, predictions, references, sources, columns, name=reward_name(reward))


class PooledReward:
    """A reward spec scored in `workers` processes when a batch has at least `min_pairs` predictions.

    Sentence BLEU, chrF and ROUGE are pure Python: one process scores about 1-5k pairs a second, which a
    large batch of summaries turns into a noticeable part of a step. Chunks are contiguous, so the samples of
    a source usually land in the same worker and share its prepared references. The pool (spawned, so it
    shares nothing with torch or CUDA state) starts on first use and lives until the process exits. Values
    are exactly those of the in-process reward. The workers return each part's values (`parts`), which `combine`
    sums with the weights as the in-process reward does.

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

    def parts(self, predictions, references, sources=None, **columns) -> dict[str, list[float]]:
        """Returns each part's values, by name, as `call_reward_parts` gives them for the in-process reward."""
        if len(predictions) < self.min_pairs:
            return call_reward_parts(self.local, predictions, references, sources, columns, name=self.__name__)
        size = -(-len(predictions) // self.workers)
        chunks = [slice(start, start + size) for start in range(0, len(predictions), size)]
        futures = [self._executor().submit(_score_chunk, self.spec, self.weights, list(predictions[c]),
                                           list(references[c]), None if sources is None else list(sources[c]),
                                           {k: list(v[c]) for k, v in columns.items()})
                   for c in chunks]
        chunk_parts = [future.result() for future in futures]
        return {key: [value for part in chunk_parts for value in part[key]] for key in chunk_parts[0]}

    def combine(self, parts: dict[str, list[float]]) -> list[float]:
        """Returns the reward values that `parts` make (the in-process reward's weighted sum)."""
        return combine_parts(self.local, parts)

    def part_weights(self) -> dict[str, float]:
        """Returns each part's weight: the in-process reward's, or 1.0 for a single reward."""
        return part_weights(self.local, {self.__name__: []})

    def __call__(self, predictions, references, sources=None, **columns) -> list[float]:
        return self.combine(self.parts(predictions, references, sources, **columns))

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_pool"] = None
        return state
