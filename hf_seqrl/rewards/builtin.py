"""The built-in sentence rewards: sacrebleu BLEU and chrF, rouge-score ROUGE, and `get_reward(name)`.

- `"bleu"`: sacrebleu `sentence_bleu` (exp smoothing, effective order) / 100.
- `"chrf"`: sacrebleu `sentence_chrf` / 100.
- `"rouge1"`, `"rouge2"`, `"rougeL"`, `"rougeLsum"`: rouge-score F1 with stemming; with several references,
  `score_multi` (the best reference).
- `"length_ratio"`: a guard, not a metric (`guards.length_ratio_reward` with its defaults): 1.0 while the output is
  0.8 to 1.2 times as long as its reference in words, falling linearly outside. It is no corpus metric, so it is in
  `GUARD_REWARDS`, not `BUILTIN_REWARDS` (the names evaluation reports); `REWARD_NAMES` holds both.
- `"repetition"`, `"source_copy"`: the guards against repeated phrases and against copying the source
  (`guards.repetition_reward`, `guards.source_copy_reward`, with their defaults). `guards.target_language_reward(lang)`
  takes the target language, so it has no name here.
- `"token_match"`: a token-level reward (`token_match.token_match_reward`): sentence chrF, and a penalty on each
  prediction word that no reference word aligns to (docs/rewards.md, "Token-level rewards").

An empty (or whitespace-only) prediction scores 0.0.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

from .guards import length_ratio_reward, repetition_reward, source_copy_reward
from .token_match import token_match_reward

RewardFn = Callable[..., Sequence[float]]

BUILTIN_REWARDS = ("bleu", "chrf", "rouge1", "rouge2", "rougeL", "rougeLsum")
GUARD_REWARDS = ("length_ratio", "repetition", "source_copy")
TOKEN_REWARDS = ("token_match",)
REWARD_NAMES = BUILTIN_REWARDS + GUARD_REWARDS + TOKEN_REWARDS


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


bleu_reward.needs_references = True  # `combine.reference_rewards`: a source-only dataset cannot train it


def chrf_reward(predictions: list[str], references: list[list[str]], sources: list[str] | None = None,
                **columns: Any) -> list[float]:
    """Returns sacrebleu sentence chrF / 100 of each prediction against its references."""
    from sacrebleu.metrics import CHRF

    return _sacrebleu_scores(CHRF(), predictions, references)


chrf_reward.needs_references = True


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
    reward.needs_references = True
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
    if name == "length_ratio":
        return length_ratio_reward()
    if name == "repetition":
        return repetition_reward()
    if name == "source_copy":
        return source_copy_reward()
    if name == "token_match":
        return token_match_reward()
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
        f"Unknown reward {name!r}. Valid names: {', '.join(REWARD_NAMES)}, or 'module:function' for your own, "
        "or pass a callable f(predictions, references, sources, **columns) -> list[float]."
    )
