"""Corpus-level scores of a set of outputs: what evaluation reports, apart from the sentence rewards of training.

`corpus_scores` gives sacrebleu corpus BLEU / chrF (every reference of each source) and the mean sentence ROUGE F1;
`bleu_brevity` splits a BLEU change into a length change and a precision change.
"""

from __future__ import annotations

from collections.abc import Sequence


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
