"""Generation for evaluation and corpus metrics: a model's outputs on source texts (greedy or beam search), their
corpus scores against every reference, and `build_compute_metrics` for `Seq2SeqTrainer`-style evaluation.
`hf-seqrl evaluate` (`hf_seqrl.cli.evaluate`) runs them on a checkpoint and a data file.

`corpus_scores` gives sacrebleu corpus BLEU / chrF (every reference of each source) and the mean sentence ROUGE F1,
apart from the sentence rewards of training (`hf_seqrl.rewards`); `bleu_brevity` splits a BLEU change into a length
change and a precision change. `hf_seqrl.metrics` names this module too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .data import normalize_references, tokenize_sources
from .models import family_for
from .models.base import eval_mode
from .rewards import BUILTIN_REWARDS, accepts_reference_lists, is_evaluation_module, is_number


def corpus_scores(predictions: list[str], references: list[list[str]],
                  names: Sequence[str] = ("bleu", "chrf")) -> dict[str, float]:
    """Returns corpus-level scores in [0, 100] of `predictions` against every reference of each source.

    `"bleu"` / `"chrf"`: sacrebleu corpus scores, one reference stream per reference slot (None where a source
    has fewer references). ROUGE names: the mean over sentences of rouge-score F1 against the best reference
    (stemming on), ×100.
    """
    scores = {}
    for name in names:
        if name in ("bleu", "chrf"):
            from sacrebleu.metrics import BLEU, CHRF

            streams = _reference_streams(references)
            scores[name] = (BLEU() if name == "bleu" else CHRF()).corpus_score(predictions, streams).score
        else:
            from .rewards import get_reward

            values = get_reward(name)(predictions=predictions, references=references, sources=None)
            scores[name] = 100.0 * sum(values) / max(len(values), 1)
    return scores


def _reference_streams(references: list[list[str]]) -> list[list[str | None]]:
    """sacrebleu's layout: one stream per reference slot, None where a source has fewer references."""
    width = max(len(refs) for refs in references)
    return [[refs[i] if i < len(refs) else None for refs in references] for i in range(width)]


def bleu_brevity(predictions: list[str], references: list[list[str]]) -> dict[str, float]:
    """Returns corpus BLEU's brevity penalty `bp` (1 when the output is at least as long as the references) and
    `ratio`, output over reference length in sacrebleu's tokens. Corpus BLEU is `bp` times its n-gram part, so
    this splits a BLEU change into a length change and a precision change."""
    from sacrebleu.metrics import BLEU

    stat = BLEU().corpus_score(predictions, _reference_streams(references))
    return {"bp": stat.bp, "ratio": stat.sys_len / max(stat.ref_len, 1)}


def generate_texts(model, tokenizer, sources: Sequence[str], *, num_beams: int = 1, batch_size: int = 32,
                   max_new_tokens: int | None = None, max_source_length: int | None = None,
                   progress: bool = True, desc: str = "generate") -> list[str]:
    """Returns the model's decoded output for each source, in order (greedy when `num_beams` is 1).

    Sources are batched by length (less padding); the model's own generation config applies otherwise (its
    `max_new_tokens` when not given), except that decoding always uses the KV cache (see
    `models.seq2seq.rollout_generation_config`). The model is left in its original train/eval mode.
    """
    from tqdm.auto import tqdm

    family = family_for(model)
    if num_beams < 1 or batch_size < 1:
        raise ValueError(f"num_beams and batch_size must be >= 1, got {num_beams} and {batch_size}.")
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs = [""] * len(sources)
    kwargs = {"num_beams": num_beams, "do_sample": False, "use_cache": True}
    if max_new_tokens is not None:
        kwargs["max_new_tokens"] = max_new_tokens
    with eval_mode(model), torch.no_grad():
        for start in tqdm(range(0, len(order), batch_size), desc=desc, leave=False, disable=not progress):
            rows = order[start:start + batch_size]
            batch = tokenize_sources(family, tokenizer, [sources[i] for i in rows], max_source_length)
            ids = family.generate(model, {k: v.to(model.device) for k, v in batch.items()}, **kwargs)
            for i, text in zip(rows, tokenizer.batch_decode(ids, skip_special_tokens=True)):
                outputs[i] = text.strip()
    return outputs


def evaluate_model(model, tokenizer, sources: Sequence[str], references: Sequence[Sequence[str]],
                   metrics: Sequence[str] = ("bleu", "chrf"), **generate_kwargs) -> tuple[dict[str, float], list[str]]:
    """Returns `(scores, predictions)`: corpus scores in [0, 100] against every reference of each source
    (`corpus_scores`), and the decoded outputs. `generate_kwargs` go to `generate_texts`."""
    unknown = [m for m in metrics if m not in BUILTIN_REWARDS]
    if unknown:
        raise ValueError(f"Unknown metric(s) {', '.join(unknown)}; choose from {', '.join(BUILTIN_REWARDS)}.")
    if len(sources) != len(references):
        raise ValueError(f"Got {len(sources)} sources but {len(references)} reference rows: give one row per source.")
    predictions = generate_texts(model, tokenizer, sources, **generate_kwargs)
    return corpus_scores(predictions, [list(r) for r in references], metrics), predictions


def build_compute_metrics(tokenizer, metrics: Sequence = ("bleu", "chrf"), references: Sequence | None = None):
    """Returns a `compute_metrics` for `Seq2SeqTrainer`-style evaluation with `predict_with_generate=True`.

    Args:
        tokenizer: decodes the generated ids (and the labels when `references` is None).
        metrics (`list`): built-in names (`"bleu"`, `"chrf"`: sacrebleu corpus scores; ROUGE names: mean sentence F1;
            all in [0, 100], every reference of a source) and `evaluate.EvaluationModule`s, called once on the
            whole split; each numeric output of a module is reported as `<module name>_<output>` (just the name when
            the output carries it). A module whose `references` feature is not a sequence gets the first reference.
        references (`list[str | list[str]]`, *optional*): the split's references in dataset order (a `references`
            column keeps every reference); None scores against the decoded `labels`.

    The metrics also hold `gen_len`, the mean generated length in tokens.
    """

    for metric in metrics:
        if not (is_evaluation_module(metric) or metric in BUILTIN_REWARDS):
            raise ValueError(f"compute_metrics: unknown metric {metric!r}; use one of {', '.join(BUILTIN_REWARDS)} or "
                             "an evaluate.EvaluationModule.")
    fixed = None if references is None else normalize_references(references)
    pad = tokenizer.pad_token_id

    def compute_metrics(prediction) -> dict[str, float]:
        ids = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        ids = np.where(ids < 0, pad, ids)
        texts = [t.strip() for t in tokenizer.batch_decode(ids, skip_special_tokens=True)]
        if fixed is None:
            labels = np.where(prediction.label_ids < 0, pad, prediction.label_ids)
            refs = [[t.strip()] for t in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        else:
            if len(texts) < len(fixed):
                raise ValueError(f"Got {len(texts)} predictions for {len(fixed)} references: evaluate the split "
                                 "whose references this compute_metrics was built with.")
            # Across processes the gather keeps the copies of the first rows that pad the last batches: the real
            # rows come first, in dataset order.
            texts, ids, refs = texts[: len(fixed)], ids[: len(fixed)], fixed
        scores = {"gen_len": float(np.mean([(row != pad).sum() for row in ids]))}
        names = [m for m in metrics if isinstance(m, str)]
        scores.update(corpus_scores(texts, refs, names))
        for module in (m for m in metrics if not isinstance(m, str)):
            module_refs = refs if accepts_reference_lists(module) else [r[0] for r in refs]
            for key, value in module.compute(predictions=texts, references=module_refs).items():
                if is_number(value):
                    scores[module.name if key == module.name else f"{module.name}_{key}"] = float(value)
        return scores

    return compute_metrics
