"""The reward calling convention, and the checks of what `reward_funcs` holds and what a reward returns.

A reward is a callable called with keywords, one value per prediction:

    f(predictions: list[str], references: list[list[str]], sources: list[str] | None, **columns) -> list[float | None]

`columns` holds every other column of the training rows (a length budget, a domain, a glossary, ...), one entry per
prediction. A reward may declare `**kwargs` and read only what it needs. A value of `None` says the reward does not
apply to that prediction (as in TRL): the trainers leave such a sample out of the loss and of its siblings' baselines.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from .builtin import BUILTIN_REWARDS, RewardFn


def is_number(value: Any) -> bool:
    """Returns True for a real number that is not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def reward_model_kind(obj: Any) -> str | None:
    """Returns what a model given to `reward_funcs` becomes, by its head (checked without importing torch): `"comet"`
    (a COMET model), `"reward_model"` (a sequence classifier with one output), `"encoder"` (a model without a head: a
    sentence encoder), or None for anything else, a non-model included."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.nn.Module):
        return None
    name, config = type(obj).__name__, getattr(obj, "config", None)
    if type(obj).__module__.startswith("comet."):
        return "comet"
    if name.endswith("ForSequenceClassification"):
        return "reward_model" if getattr(config, "num_labels", None) == 1 else None
    generates = callable(getattr(obj, "can_generate", None)) and obj.can_generate()
    if "For" not in name and hasattr(obj, "get_input_embeddings") and not getattr(config, "is_encoder_decoder", False) \
            and not generates:
        return "encoder"
    return None


MODEL_REWARD_CLASSES = ("EmbeddingSimilarityReward", "BERTScoreReward", "RewardModelReward", "CometReward")


def is_torch_module(obj: Any) -> bool:
    """Returns True for a `torch.nn.Module` (checked without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def takes_predictions(module: Any) -> bool:
    """Returns True for a module whose `forward` has a `predictions` parameter: a reward written as a module."""
    import inspect

    try:
        return "predictions" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


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
        if is_torch_module(item) and not takes_predictions(item) and reward_model_kind(item) is None:
            raise ValueError(
                f"reward_funcs got a {type(item).__name__}, which is no reward by itself: wrap it in one of "
                f"{', '.join(MODEL_REWARD_CLASSES)} (hf_seqrl.rewards), e.g. RewardModelReward(model, tokenizer=..., "
                "pair='source-prediction') for a one-output sequence classifier or EmbeddingSimilarityReward(encoder, "
                "tokenizer=...) for a sentence encoder.")
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


def reward_name(reward: Any) -> str:
    """Returns a readable name of a reward spec."""
    if isinstance(reward, str):
        return reward
    if is_evaluation_module(reward):
        return reward.name
    return getattr(reward, "__name__", None) or type(reward).__name__


def call_reward(
    reward_fn: RewardFn,
    predictions: list[str],
    references: list[list[str]],
    sources: list[str] | None = None,
    columns: dict[str, list] | None = None,
    name: str | None = None,
    batch_index: int | None = None,
) -> list[float]:
    """Returns `reward_fn(predictions=, references=, sources=, **columns)` as a list of floats (and `None` where the
    reward does not apply), checked.

    Accepts a list, tuple, numpy array or 1-D tensor of real numbers (a NaN or inf passes through; the caller
    decides). A wrong count, a value that is neither a real number nor None (a string, a bool, a nested list), a
    tensor that is not 1-D, or an exception inside the reward raises an error naming the reward, the index and the
    batch.
    """
    name = name or reward_name(reward_fn)
    where = "" if batch_index is None else f" on batch {batch_index}"
    values = _invoke(reward_fn, name, where, predictions, references, sources, columns)
    return _checked_values(values, len(predictions), name, where)


def call_reward_parts(
    reward_fn: RewardFn,
    predictions: list[str],
    references: list[list[str]],
    sources: list[str] | None = None,
    columns: dict[str, list] | None = None,
    name: str | None = None,
    batch_index: int | None = None,
) -> dict[str, list[float]]:
    """Returns the values of each part of `reward_fn`, by the part's name, each checked as `call_reward` checks.

    A reward that combines several (`WeightedReward`, `PooledReward`) has a `parts` method, called with the same
    keywords as the reward, returning `{name: values}`, and a `combine(parts)` method returning what a call of the
    reward returns (`combine_parts`); any other reward is its own single part, named `name`. Every part is scored
    once.
    """
    name = name or reward_name(reward_fn)
    if not callable(getattr(reward_fn, "parts", None)):
        return {name: call_reward(reward_fn, predictions, references, sources, columns, name, batch_index)}
    where = "" if batch_index is None else f" on batch {batch_index}"
    parts = _invoke(reward_fn.parts, name, where, predictions, references, sources, columns)
    if not isinstance(parts, dict) or not parts:
        raise TypeError(f"reward {name!r}: parts() must return a non-empty dict of name -> values{where}, got "
                        f"{type(parts).__name__}.")
    return {part: _checked_values(values, len(predictions), part, where) for part, values in parts.items()}


def combine_parts(reward_fn: RewardFn, parts: dict[str, list[float]]) -> list[float]:
    """Returns the reward values that `parts` (from `call_reward_parts(reward_fn, ...)`) make: the reward's own
    `combine(parts)` (a weighted sum), or the one part of a single reward."""
    if callable(getattr(reward_fn, "parts", None)):
        return reward_fn.combine(parts)
    (values,) = parts.values()
    return values


def _invoke(reward_fn, name: str, where: str, predictions, references, sources, columns):
    """Returns what `reward_fn` returns when called by the convention; an exception inside it is re-raised as a
    RuntimeError naming the reward and the batch."""
    try:
        return reward_fn(predictions=predictions, references=references, sources=sources, **(columns or {}))
    except Exception as err:
        hint = ""
        if isinstance(err, TypeError) and "unexpected keyword argument" in str(err):
            hint = (" (rewards are called with keywords: predictions, references, sources and every other dataset "
                    "column; declare **kwargs to take the columns you do not use)")
        raise RuntimeError(f"reward {name!r} raised {type(err).__name__}{where}: {err}{hint}") from err


def _checked_values(values, count: int, name: str, where: str) -> list[float | None]:
    """Returns `values` (a reward's output for `count` predictions) as a list of floats and Nones, or raises a clear
    error."""
    if hasattr(values, "detach"):
        values = values.detach().cpu()
    if hasattr(values, "ndim") and values.ndim != 1:
        raise ValueError(f"reward {name!r} returned an array of shape {tuple(values.shape)}{where}: return one number "
                         f"per prediction, shape ({count},).")
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"reward {name!r} must return a list of numbers{where}, got {type(values).__name__}.")
    values = list(values)
    if len(values) != count:
        raise ValueError(
            f"reward {name!r} returned {len(values)} values for {count} predictions{where}: it must return "
            "exactly one float per prediction."
        )
    for i, value in enumerate(values):
        if value is not None and not is_number(value):
            raise TypeError(f"reward {name!r} returned {value!r} ({type(value).__name__}) at index {i}{where}: every "
                            "value must be a real number (int or float; not a string or a bool), or None where the "
                            "reward does not apply.")
    return [None if v is None else float(v) for v in values]


def reference_pairs(references: Sequence[Sequence[str]]) -> tuple[list[int], list[str]]:
    """Returns `(owners, flat)`: one entry per (prediction, reference) pair, the prediction's index and the reference
    (what a reward that scores one reference at a time reads; `best_per_owner` keeps each prediction's best)."""
    owners = [i for i, refs in enumerate(references) for _ in refs]
    return owners, [ref for refs in references for ref in refs]


def best_per_owner(values: Sequence[float], owners: Sequence[int], count: int) -> list[float]:
    """Returns, for each of `count` predictions, the largest of the `values` whose `owners` entry names it (-inf for
    a prediction without one)."""
    best = [-math.inf] * count
    for owner, value in zip(owners, values):
        best[owner] = max(best[owner], float(value))
    return best


def check_finite(values: Sequence[float | None], name: str) -> None:
    """Raises a clear error if any reward value is NaN or inf (`None`, a reward that does not apply, is fine)."""
    bad = [i for i, v in enumerate(values) if v is not None and not math.isfinite(v)]
    if bad:
        raise ValueError(
            f"reward {name!r} returned non-finite values (NaN or inf) at sample indices {bad[:10]}: fix the reward, "
            "or set SeqRLConfig.nonfinite_rewards='drop' to give those samples zero advantage."
        )
