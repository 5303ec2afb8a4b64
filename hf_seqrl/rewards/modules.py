"""`evaluate` modules as rewards: an `evaluate.EvaluationModule` scored per prediction (`EvaluateReward`)."""

from __future__ import annotations

from typing import Any

from .convention import best_per_owner, is_evaluation_module, is_number, reference_pairs


def accepts_reference_lists(module) -> bool:
    """Returns True when one of `module`'s input formats takes a list of references per prediction."""
    options = module.features if isinstance(module.features, (list, tuple)) else [module.features]
    for features in options:
        feature = features.get("references") if hasattr(features, "get") else None
        if isinstance(feature, (list, tuple)) or type(feature).__name__ in ("Sequence", "List", "LargeList"):
            return True
    return False


def takes_sources(module) -> bool:
    """Returns True when one of `module`'s input formats has a `sources` feature (COMET-style metrics)."""
    options = module.features if isinstance(module.features, (list, tuple)) else [module.features]
    return any(hasattr(features, "get") and features.get("sources") is not None for features in options)


# `evaluate` metrics the built-in rewards compute without the Hub: evaluate's name -> the built-in's.
BUILTIN_EQUIVALENTS = {"sacrebleu": "bleu", "bleu": "bleu", "google_bleu": "bleu", "chrf": "chrf", "rouge": "rougeL"}


def load_evaluate_module(path: str, **load_kwargs: Any):
    """Returns `evaluate.load(path, **load_kwargs)`; when that fails (offline, `evaluate` reads the metric's script
    from the Hub and says it "doesn't exist on the Hugging Face Hub either"), raises an error naming the cause and
    the fix: the built-in reward that computes the same metric without a download, or a local script path."""
    import evaluate

    try:
        return evaluate.load(path, **load_kwargs)
    except (FileNotFoundError, ConnectionError, OSError) as error:
        builtin = BUILTIN_EQUIVALENTS.get(str(path).strip("/").split("/")[-1].lower())
        instead = (f"reward_funcs={builtin!r}, the built-in that computes {path!r}'s metric locally" if builtin
                   else "a built-in reward name (bleu, chrf, rouge1, rouge2, rougeL, rougeLsum)")
        raise RuntimeError(
            f"evaluate.load({path!r}) could not load the metric: evaluate reads a metric's script from the Hugging "
            "Face Hub, which is not reachable here (or HF_HUB_OFFLINE / HF_EVALUATE_OFFLINE is set). Use "
            f"{instead}, or evaluate.load('path/to/metric.py') on a local copy of its script.") from error


class EvaluateReward:
    """A reward that scores each prediction with an `evaluate.EvaluationModule` (against references: it needs them).

    One `compute` call over the batch when the module returns a per-example list (one value per prediction) under
    `key`; otherwise one call per (prediction, reference) pair. The choice is made on the first batch and kept.
    Several references: a module whose `references` feature is a sequence gets all of a prediction's references;
    any other module scores the prediction against each reference and the best value counts (as ROUGE's
    `score_multi` does). A module with a `sources` feature gets each prediction's source too.

    Args:
        module (`evaluate.EvaluationModule`): e.g. `evaluate.load("path/to/metric.py")`.
        key (`str`, *optional*): the output to use; by default the module's only numeric output (an error lists the
            outputs when there are several).
        scale (`float`, *optional*, defaults to `1.0`): multiplies every value (`0.01` for a metric in [0, 100]).
        compute_kwargs: passed to every `compute` call (e.g. `lang="en"`).
    """

    needs_references = True

    def __init__(self, module, key: str | None = None, scale: float = 1.0, **compute_kwargs: Any):
        if not is_evaluation_module(module):
            raise TypeError(f"EvaluateReward needs an evaluate.EvaluationModule, got {type(module).__name__}.")
        self.module, self.key, self.scale, self.compute_kwargs = module, key, float(scale), compute_kwargs
        self.multi_reference = accepts_reference_lists(module)
        self.takes_sources = takes_sources(module)
        self.per_example: bool | None = None  # decided on the first batch
        self.__name__ = module.name if key is None else f"{module.name}:{key}"

    def _compute(self, predictions: list[str], references: list, sources: list[str] | None = None) -> dict:
        extra = {"sources": sources} if self.takes_sources else {}
        result = self.module.compute(predictions=predictions, references=references, **extra, **self.compute_kwargs)
        if not isinstance(result, dict):
            raise TypeError(f"evaluate module {self.module.name!r} returned {type(result).__name__}, not a dict.")
        return result

    def _pick(self, result: dict, count: int) -> tuple[str, bool]:
        """Returns `(key, per_example)`: which output to read and whether it holds one value per prediction."""
        def per_example(value) -> bool:
            value = value.tolist() if hasattr(value, "tolist") else value
            return isinstance(value, (list, tuple)) and len(value) == count and all(map(is_number, value))

        if self.key is not None:
            if self.key not in result:
                raise KeyError(f"evaluate module {self.module.name!r} has no output {self.key!r}; its outputs: "
                               f"{sorted(result)}.")
            return self.key, per_example(result[self.key])
        lists = [k for k, v in result.items() if per_example(v)]
        scalars = [k for k, v in result.items() if is_number(v) or (hasattr(v, "ndim") and v.ndim == 0)]
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
        owners, flat = reference_pairs(references)
        return [predictions[i] for i in owners], flat, owners

    def __call__(self, predictions: list[str], references: list[list[str]], sources=None, **columns) -> list[float]:
        if not predictions:
            return []
        if self.takes_sources and sources is None:
            raise ValueError(f"evaluate module {self.module.name!r} reads sources: add a `sources` column (or text "
                             "columns) to the dataset.")
        preds, refs, owners = self._pairs(predictions, references)
        srcs = [sources[i] for i in owners] if self.takes_sources else [None] * len(owners)
        values: list[float] = []
        if self.per_example is not False:
            result = self._compute(preds, refs, srcs if self.takes_sources else None)
            key, self.per_example = self._pick(result, len(preds))
            self.key = key
            if self.per_example:
                value = result[key]
                values = list(value.tolist() if hasattr(value, "tolist") else value)
        if not self.per_example:
            values = [self._compute([p], [r], [s] if self.takes_sources else None)[self.key]
                      for p, r, s in zip(preds, refs, srcs)]
        values = [float(v.item() if hasattr(v, "item") else v) for v in values]
        return [self.scale * v for v in best_per_owner(values, owners, len(predictions))]
