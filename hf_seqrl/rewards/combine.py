"""What a trainer's `reward_funcs` becomes: one callable, a weighted combination of its entries."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .builtin import RewardFn, get_reward
from .convention import (call_rewards, check_reward_spec, is_comet_checkpoint, is_evaluation_module, is_torch_module,
                         reward_name, takes_predictions)
from .modules import EvaluateReward
from .neural import CometReward, ModelReward, model_reward
from .spans import sentence_score, weighted_sum


def as_reward(item: Any) -> RewardFn:
    """Returns the callable for one entry of `reward_funcs`: a name, a callable, an `evaluate` module, a model (by
    its head, `neural.model_reward`), or the path of a COMET checkpoint on disk (a folder in the Hub layout or a
    `model.ckpt`: a `CometReward` with its defaults)."""
    if is_evaluation_module(item):
        return EvaluateReward(item)
    if is_torch_module(item) and not takes_predictions(item):
        return model_reward(item)
    if is_comet_checkpoint(item):
        return CometReward(item)
    if callable(item):
        return item
    check_reward_spec([item])
    return get_reward(item)


def reference_rewards(spec: Any) -> list[str]:
    """Returns the names of the rewards in `spec` (what `reward_funcs` takes, or a built reward) that score against
    references: a dataset of sources alone cannot train them.

    A reward says so with a `needs_references` attribute: the built-in metrics (`bleu`, `chrf`, `rouge*`,
    `token_match`) and `evaluate` modules set it, the model rewards by how they are built (`CometReward` reading
    references, `MetricXReward` without `qe`, `EmbeddingSimilarityReward(compare="references")`, `BERTScoreReward`,
    `RewardModelReward(pair="prediction-reference")`). A reward without the attribute (the guards, a user's callable)
    is taken to need none: from a dataset of sources alone it is called with an empty list of references per
    prediction. A COMET checkpoint given as a path is taken to read references (a `CometReward` with its defaults
    reads them when the model can; `CometReward(path, use_references=False)` scores the source alone)."""
    if isinstance(spec, (list, tuple)):
        return [name for item in spec for name in reference_rewards(item)]
    if is_comet_checkpoint(spec):  # not loaded here just to ask
        return [str(spec)]
    if isinstance(spec, str):  # named as the user named it
        return [spec] if reference_rewards(as_reward(spec)) else []
    if is_evaluation_module(spec) or (is_torch_module(spec) and not takes_predictions(spec)):
        spec = as_reward(spec)
    parts = getattr(spec, "rewards", None) or ([spec.local] if hasattr(spec, "local") else None)
    if isinstance(parts, (list, tuple)):  # a WeightedReward, a GuardedReward, a PooledReward
        return reference_rewards(list(parts))
    return [reward_name(spec)] if getattr(spec, "needs_references", False) else []


def model_rewards(reward: RewardFn) -> list[ModelReward]:
    """Returns the model rewards in `reward` (itself, or the parts of a `WeightedReward`)."""
    return [part for part in getattr(reward, "rewards", [reward]) if isinstance(part, ModelReward)]


def set_attention(reward: RewardFn, attn_implementation: str) -> int:
    """Sets `attn_implementation` ("sdpa", "eager", "flash_attention_2", ...) on the transformers models of every model
    reward in `reward` (the outermost ones: a COMET model's encoder, say); returns how many it set."""
    from transformers import PreTrainedModel

    count = 0
    for part in model_rewards(reward):
        done: list = []
        for module in part.model.modules():
            if isinstance(module, PreTrainedModel) and not any(module in set(d.modules()) for d in done):
                module.set_attn_implementation(attn_implementation)
                done.append(module)
        count += len(done)
    return count


def place_on(reward: RewardFn, device) -> None:
    """Moves every model reward in `reward` whose model sits on the CPU and that was given no device to `device` (a
    model the user put on an accelerator stays there)."""
    for part in model_rewards(reward):
        if part.device is None:
            where = next(part.model.parameters()).device
            part.to(device if where.type == "cpu" else where)


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
        """Returns each reward's values, keyed by `part_names` (the rewards' names, a repeated one numbered). The
        async rewards among them run concurrently (`convention.call_rewards`)."""
        values = call_rewards(list(zip(self.names, self.rewards)), predictions, references, sources, columns)
        return dict(zip(self.part_names, values))

    def combine(self, parts: dict[str, list[float | None]]) -> list[float | None]:
        """Returns the weighted sum of `parts` (from `parts`): what calling this reward returns. A part that is `None`
        for a prediction (it does not apply) is left out of that prediction's sum, as TRL sums rewards; a
        prediction to which no part applies gets `None`. Token-level values (`spans.TokenScore`) are weighted and
        kept beside the sentence scores (`spans.weighted_sum`)."""
        columns = [parts[key] for key in self.part_names]
        total: list = []
        for values in zip(*columns):
            present = [(weight, value) for weight, value in zip(self.weights, values) if value is not None]
            total.append(weighted_sum(present) if present else None)
        return total

    def part_weights(self) -> dict[str, float]:
        """Returns each reward's weight, by its part name."""
        return dict(zip(self.part_names, self.weights))

    def __call__(self, predictions, references, sources=None, **columns) -> list[float]:
        return self.combine(self.parts(predictions, references, sources, **columns))


class GuardedReward:
    """A reward gated by guards (as WALAR gates a quality-estimation metric by a language guard): per prediction,
    the reward's value times each guard's (`guards.target_language_reward`, `source_copy`, `repetition`,
    `length_ratio`, or any reward in [0, 1]). A prediction the reward does not apply to gets None; a guard that does
    not apply to it leaves its value as it is. Each part is scored once and logged on its own
    (`rl/rewards/<name>/*`): a `CombinedReward`.

    `multi_objective_aggregation="normalize_then_sum"` weighs parts that add up; a gate multiplies them, so it is
    refused (the default `"sum_then_normalize"` normalizes the gated value)."""

    def __init__(self, reward: Any, guards: Sequence[Any]):
        if not guards:
            raise ValueError("GuardedReward needs at least one guard: e.g. guard(comet, target_language_reward('en')).")
        check_reward_spec([reward, *guards])
        self.rewards = [as_reward(part) for part in (reward, *guards)]
        self.names = [reward_name(part) for part in self.rewards]
        self.part_names = unique_names(self.names)
        self.__name__ = "*".join(self.names)

    def parts(self, predictions, references, sources=None, **columns) -> dict[str, list[float | None]]:
        """Returns the reward's and each guard's values, keyed by `part_names`."""
        values = call_rewards(list(zip(self.names, self.rewards)), predictions, references, sources, columns)
        return dict(zip(self.part_names, values))

    def combine(self, parts: dict[str, list[float | None]]) -> list[float | None]:
        """Returns the reward's values times the guards' (a guard's None counts as 1; the reward's None stays; a
        token-level value is scaled whole: `spans.TokenScore.scaled`)."""
        main, *gates = (parts[key] for key in self.part_names)
        total: list = []
        for value, *factors in zip(main, *gates):
            gate = math.prod(sentence_score(f) for f in factors if f is not None)
            total.append(None if value is None else weighted_sum([(gate, value)]))
        return total

    def part_weights(self) -> dict[str, float]:
        raise ValueError(f"reward {self.__name__!r} is a gate (a product of its parts), which "
                         "multi_objective_aggregation='normalize_then_sum' cannot weigh: use 'sum_then_normalize'.")

    def __call__(self, predictions, references, sources=None, **columns) -> list[float | None]:
        return self.combine(self.parts(predictions, references, sources, **columns))


def guard(reward: Any, *guards: Any) -> GuardedReward:
    """Returns `reward` gated by `guards` (`GuardedReward`): e.g. `guard(CometReward("Unbabel/wmt22-cometkiwi-da"),
    target_language_reward("en"), "source_copy")` for a quality-estimation reward that a copied source or an
    off-target output cannot game."""
    return GuardedReward(reward, guards)


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
