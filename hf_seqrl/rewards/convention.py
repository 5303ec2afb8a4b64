"""The reward calling convention, and the checks of what `reward_funcs` holds and what a reward returns.

A reward is a callable called with keywords, one value per prediction:

    f(predictions: list[str], references: list[list[str]], sources: list[str] | None, **columns) -> list[float | None]

`columns` holds every other column of the training rows (a length budget, a domain, a glossary, ...), one entry per
prediction. A reward may declare `**kwargs` and read only what it needs. A value of `None` says the reward does not
apply to that prediction (as in TRL): the trainers leave such a sample out of the loss and of its siblings' baselines.

A reward may be a coroutine function (`async def`, e.g. one that asks a server): its coroutine runs on one event loop
that lives in a daemon thread of its own (`reward_loop`), as TRL runs async rewards. The async rewards of one
`reward_funcs` list run together there (`asyncio.gather`) while the others run in the caller's thread (`call_rewards`).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import os
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from .builtin import REWARD_NAMES, RewardFn
from .spans import TokenScore, sentence_score, token_score


@runtime_checkable
class CombinedReward(Protocol):
    """A reward made of several, each scored once and logged on its own (`WeightedReward`, `PooledReward`): what the
    trainers read of one, besides calling it."""

    def parts(self, predictions, references, sources=None, **columns) -> dict[str, list[float | None]]:
        """Returns each part's values, by the part's name (the keys of `part_weights`)."""

    def combine(self, parts: dict[str, list[float | None]]) -> list[float | None]:
        """Returns what calling the reward returns, from the values `parts` returned."""

    def part_weights(self) -> dict[str, float]:
        """Returns each part's weight in the reward's value, by the part's name."""

    def __call__(self, predictions, references, sources=None, **columns) -> list[float | None]:
        """Returns `combine(parts(...))`."""


def is_number(value: Any) -> bool:
    """Returns True for a real number that is not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def reward_model_kind(obj: Any) -> str | None:
    """Returns what a model given to `reward_funcs` becomes, by its head (checked without importing torch): `"comet"`
    (a `comet.CometModel`), `"reward_model"` (a sequence classifier with one output), `"encoder"` (a model without a
    head: a sentence encoder), or None for anything else, a non-model included."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.nn.Module):
        return None
    name, config = type(obj).__name__, getattr(obj, "config", None)
    if type(obj).__module__ == "hf_seqrl.rewards.comet":
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


def is_comet_checkpoint(name: Any) -> bool:
    """Returns whether `name` is the path of a COMET checkpoint on disk: a `model.ckpt` file, or a folder holding
    `checkpoints/model.ckpt` (the Hub layout)."""
    if not isinstance(name, (str, os.PathLike)):
        return False
    path = os.fspath(name)
    return (os.path.isfile(path) and path.endswith(".ckpt")) or \
        os.path.isfile(os.path.join(path, "checkpoints", "model.ckpt"))


def check_reward_spec(spec: Any, weights: Sequence[float] | None = None, weights_field: str = "reward_weights") -> None:
    """Raises a clear error if `spec` (what `reward_funcs` takes) or `weights` is invalid; `weights_field` is what the
    messages call the weights (a trainer passes its config's `"SeqRLConfig.reward_weights"`, `"MRTConfig..."`).

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
        if callable(item) or is_evaluation_module(item) or is_comet_checkpoint(item) or (
                isinstance(item, str) and ":" in item and not os.path.exists(item)):
            continue
        if isinstance(item, os.PathLike) or (isinstance(item, str) and os.path.exists(item)):
            raise ValueError(
                f"reward_funcs: {os.fspath(item)!r} is a path but not a COMET checkpoint (a model.ckpt, or a folder "
                "holding checkpoints/model.ckpt): pass a model reward built from it, e.g. RewardModelReward(path), "
                "EmbeddingSimilarityReward(path) or CometReward(path, ...).")
        if not isinstance(item, str) or item not in REWARD_NAMES:
            close = [name for name in REWARD_NAMES if isinstance(item, str) and name.lower() == item.lower()]
            if isinstance(item, str) and item.lower() in ("sacrebleu", "rouge", "google_bleu"):
                close = ["bleu" if "bleu" in item.lower() else "rougeL"]
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"reward_funcs: unknown reward {item!r}.{hint} Valid names: {', '.join(REWARD_NAMES)}, a "
                "'module:function' path, a callable, or an evaluate.EvaluationModule (offline, "
                "hf_seqrl.rewards.load_evaluate_module says what to use instead)."
            )
    if weights is not None:
        if len(weights) != len(items):
            raise ValueError(
                f"{weights_field} has {len(weights)} values for {len(items)} reward_funcs: give one weight "
                "per reward, or None for equal weights."
            )
        if any(not math.isfinite(float(w)) for w in weights):
            raise ValueError(f"{weights_field} must be finite numbers.")


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
    step: int | None = None,
) -> list[float]:
    """Returns `reward_fn(predictions=, references=, sources=, **columns)` as a list of floats (and `None` where the
    reward does not apply), checked.

    Accepts a list, tuple, numpy array or 1-D tensor of real numbers (a NaN or inf passes through; the caller
    decides). A wrong count, a value that is neither a real number nor None (a string, a bool, a nested list), a
    tensor that is not 1-D, or an exception inside the reward raises an error naming the reward, the index and the
    batch.
    """
    name = name or reward_name(reward_fn)
    where = call_site(step, predictions, sources)
    values = _awaited(_invoke(reward_fn, name, where, predictions, references, sources, columns), name, where)
    return _checked_values(values, predictions, name, where)


def call_reward_parts(
    reward_fn: RewardFn,
    predictions: list[str],
    references: list[list[str]],
    sources: list[str] | None = None,
    columns: dict[str, list] | None = None,
    name: str | None = None,
    step: int | None = None,
) -> dict[str, list[float]]:
    """Returns the values of each part of `reward_fn`, by the part's name, each checked as `call_reward` checks.

    A reward that combines several (`WeightedReward`, `PooledReward`) has a `parts` method, called with the same
    keywords as the reward, returning `{name: values}`, and a `combine(parts)` method returning what a call of the
    reward returns (`combine_parts`); any other reward is its own single part, named `name`. Every part is scored
    once.
    """
    name = name or reward_name(reward_fn)
    if not isinstance(reward_fn, CombinedReward):
        return {name: call_reward(reward_fn, predictions, references, sources, columns, name, step)}
    where = call_site(step, predictions, sources)
    parts = _awaited(_invoke(reward_fn.parts, name, where, predictions, references, sources, columns), name, where)
    if not isinstance(parts, dict) or not parts:
        raise TypeError(f"reward {name!r}: parts() must return a non-empty dict of name -> values{where}, got "
                        f"{type(parts).__name__}.")
    return {part: _checked_values(values, predictions, part, where) for part, values in parts.items()}


def combine_parts(reward_fn: RewardFn, parts: dict[str, list[float]]) -> list[float]:
    """Returns the reward values that `parts` (from `call_reward_parts(reward_fn, ...)`) make: the reward's own
    `combine(parts)` (a weighted sum), or the one part of a single reward."""
    if isinstance(reward_fn, CombinedReward):
        return reward_fn.combine(parts)
    (values,) = parts.values()
    return values


def part_weights(reward_fn: RewardFn, parts: dict[str, list[float]]) -> dict[str, float]:
    """Returns the weight of each part of `parts` (from `call_reward_parts(reward_fn, ...)`) in the reward's value:
    a combined reward's own (`CombinedReward.part_weights`), or 1.0 for the one part of a single reward."""
    if isinstance(reward_fn, CombinedReward):
        return reward_fn.part_weights()
    (name,) = parts
    return {name: 1.0}


def call_rewards(
    rewards: Sequence[tuple[str, RewardFn]],
    predictions: list[str],
    references: list[list[str]],
    sources: list[str] | None = None,
    columns: dict[str, list] | None = None,
    step: int | None = None,
) -> list[list[float | None]]:
    """Returns the values of each `(name, reward)` in `rewards`, each checked as `call_reward` checks them.

    The async rewards (`is_async_reward`) start first, together on the reward loop (one `asyncio.gather`); the others
    then run in this thread, in order, while the async ones wait on their servers; the call returns when all are done.
    """
    where = call_site(step, predictions, sources)
    waiting = [i for i, (_, fn) in enumerate(rewards) if is_async_reward(fn)]
    pending = None
    if waiting:
        coroutines = []
        try:
            for i in waiting:
                coroutines.append(_invoke(rewards[i][1], rewards[i][0], where, predictions, references, sources,
                                          columns))
        except BaseException:
            for coroutine in coroutines:
                coroutine.close()  # never started: no "never awaited" warning
            raise
        pending = _submit([_named(coroutine, rewards[i][0], where) for i, coroutine in zip(waiting, coroutines)])
    values: list = [None] * len(rewards)
    try:
        for i, (name, fn) in enumerate(rewards):
            if i not in waiting:
                values[i] = call_reward(fn, predictions, references, sources, columns, name, step)
    except BaseException:
        if pending is not None:
            pending.cancel()
        raise
    if pending is not None:
        for i, result in zip(waiting, _results(pending)):
            values[i] = _checked_values(result, predictions, rewards[i][0], where)
    return values


def is_async_reward(reward_fn: Any) -> bool:
    """Returns True for a reward written as `async def`: a coroutine function, or an object whose `__call__` is one."""
    return inspect.iscoroutinefunction(reward_fn) or inspect.iscoroutinefunction(getattr(reward_fn, "__call__", None))


_REWARD_LOOP: tuple[int, threading.Thread, asyncio.AbstractEventLoop] | None = None
_REWARD_LOOP_LOCK = threading.Lock()


def reward_loop() -> asyncio.AbstractEventLoop:
    """Returns the event loop the async rewards run on: one per process, running in a daemon thread from first use.

    One loop that lasts, rather than `asyncio.run` per batch: a client a reward opens once (an HTTP client) stays
    bound to the loop it was made on, and a caller that runs an event loop of its own (a notebook) is never blocked
    inside it."""
    global _REWARD_LOOP
    with _REWARD_LOOP_LOCK:
        # A forked child has the parent's loop object but not its thread.
        if _REWARD_LOOP is None or _REWARD_LOOP[0] != os.getpid() or not _REWARD_LOOP[1].is_alive():
            loop, ready = asyncio.new_event_loop(), threading.Event()

            def run():
                asyncio.set_event_loop(loop)
                ready.set()
                loop.run_forever()

            thread = threading.Thread(target=run, name="async-rewards", daemon=True)
            thread.start()
            ready.wait()
            _REWARD_LOOP = (os.getpid(), thread, loop)
        return _REWARD_LOOP[2]


def _submit(coroutines: list):
    """Returns a future of the results of `coroutines`, gathered on the reward loop (each one runs to its end: the
    first exception is raised once all are done, so none is left running unseen)."""
    async def gather():
        return await asyncio.gather(*coroutines, return_exceptions=True)

    loop = reward_loop()
    if threading.current_thread() is _REWARD_LOOP[1]:
        # Called from a coroutine on the loop itself (an async reward calling a combination): waiting on the loop
        # from its own thread would never end, so these run on a loop of their own in another thread.
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as executor:
            return executor.submit(asyncio.run, gather())
    return asyncio.run_coroutine_threadsafe(gather(), loop)


def _results(future) -> list:
    """Returns the results of a `_submit` future, raising the first exception among them."""
    results = future.result()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


async def _named(awaitable, name: str, where: str):
    """Returns what `awaitable` (an async reward's coroutine) returns; an exception is re-raised as `_invoke` does."""
    try:
        return await awaitable
    except Exception as err:
        raise _reward_error(err, name, where) from err


def _invoke(reward_fn, name: str, where: str, predictions, references, sources, columns):
    """Returns what `reward_fn` returns when called by the convention (for an async reward, its coroutine); an
    exception inside it is re-raised as a RuntimeError naming the reward and the batch."""
    try:
        return reward_fn(predictions=predictions, references=references, sources=sources, **(columns or {}))
    except Exception as err:
        raise _reward_error(err, name, where) from err


def _awaited(values, name: str, where: str):
    """Returns `values`, or, when a reward returned an awaitable (an async reward called alone), what it gives once
    run on the reward loop."""
    if not inspect.isawaitable(values):
        return values
    return _results(_submit([_named(values, name, where)]))[0]


class RewardError(RuntimeError):
    """An exception inside a reward function, re-raised naming the reward, where it was called and the cause."""


def call_site(step: int | None, predictions: Sequence[str], sources: Sequence[str] | None = None) -> str:
    """Returns where a reward is called, as its errors say it: " at training step N (1-based) on K rows, the first
    source '...' → prediction '...'", each text cut to 60 characters; "" without a step."""
    if step is None:
        return ""

    def short(text) -> str:
        text = str(text)
        return repr(text if len(text) <= 60 else text[:57] + "...")

    first = ""
    if predictions:
        first = f", the first {'source ' + short(sources[0]) + ' → ' if sources else ''}prediction {short(predictions[0])}"
    return f" at training step {step} on {len(predictions)} rows{first}"


def _reward_error(err: Exception, name: str, where: str) -> RuntimeError:
    """Returns the error that names the reward whose call raised `err`, and the batch."""
    hint = ""
    if isinstance(err, TypeError) and "unexpected keyword argument" in str(err):
        hint = (" (rewards are called with keywords: predictions, references, sources and every other dataset "
                "column; declare **kwargs to take the columns you do not use)")
    return RewardError(f"reward {name!r} raised {type(err).__name__}{where}: {err}{hint}")


def _checked_values(values, predictions: Sequence[str], name: str, where: str) -> list:
    """Returns `values` (a reward's output for `predictions`) as a list of floats, Nones and `TokenScore`s (a
    prediction's value with token-level parts, `hf_seqrl.rewards.spans`), or raises a clear error."""
    count = len(predictions)
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
    checked = []
    for i, value in enumerate(values):
        if isinstance(value, (dict, list, tuple, TokenScore)):
            checked.append(value if isinstance(value, TokenScore) else token_score(value, predictions[i], name, i, where))
        elif value is not None and not is_number(value):
            raise TypeError(f"reward {name!r} returned {value!r} ({type(value).__name__}) at index {i}{where}: every "
                            "value must be a real number (int or float; not a string or a bool), None where the "
                            "reward does not apply, or a token-level value (docs/rewards.md, \"Token-level "
                            "rewards\").")
        else:
            checked.append(None if value is None else float(value))
    return checked


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


def check_finite(values: Sequence[float | None], name: str, config: str = "the trainer's config") -> None:
    """Raises a clear error if any reward value is NaN or inf (`None`, a reward that does not apply, is fine);
    `config` names the config class whose `nonfinite_rewards` the message suggests."""
    bad = [i for i, v in enumerate(values) if v is not None and not math.isfinite(sentence_score(v))]
    if bad:
        raise ValueError(
            f"reward {name!r} returned non-finite values (NaN or inf) at sample indices {bad[:10]}: fix the reward, "
            f"or set {config}.nonfinite_rewards='drop' to leave those samples out of the loss."
        )
