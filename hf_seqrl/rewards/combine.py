"""What a trainer's `reward_funcs` becomes: one callable, a weighted combination of its entries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .builtin import RewardFn, get_reward
from .convention import call_reward, check_reward_spec, is_evaluation_module, reward_name
from .modules import EvaluateReward


def as_reward(item: Any) -> RewardFn:
    """Returns the callable for one entry of `reward_funcs`: a name, a callable or an `evaluate` module."""
    if is_evaluation_module(item):
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
        self.part_names = unique_names(self.names)

    def parts(self, predictions, references, sources=None, **columns) -> dict[str, list[float]]:
        """Returns each reward's values, keyed by `part_names` (the rewards' names, a repeated one numbered)."""
        return {key: call_reward(fn, predictions, references, sources, columns, name=name)
                for key, fn, name in zip(self.part_names, self.rewards, self.names)}

    def combine(self, parts: dict[str, list[float]]) -> list[float]:
        """Returns the weighted sum of `parts` (from `parts`): what calling this reward returns."""
        total = [0.0] * len(parts[self.part_names[0]])
        for key, weight in zip(self.part_names, self.weights):
            total = [t + weight * v for t, v in zip(total, parts[key])]
        return total

    def __call__(self, predictions, references, sources=None, **columns) -> list[float]:
        return self.combine(self.parts(predictions, references, sources, **columns))


def unique_names(names: Sequence[str]) -> list[str]:
    """Returns `names` with each repeat of a name numbered (`bleu`, `bleu_2`), so that every part has its key."""
    unique: list[str] = []
    for name in names:
        key, count = name, 1
        while key in unique:
            count += 1
            key = f"{name}_{count}"
        unique.append(key)
    return unique


def build_reward(spec: Any, weights: Sequence[float] | None = None) -> RewardFn:
    """Returns one callable for `reward_funcs`: a name, a callable, an `evaluate` module, or a list of those.

    A list is combined with `weights` (`None`: their mean). `PooledReward` scores the same spec in worker processes.
    """
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
