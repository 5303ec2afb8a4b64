"""Minimum Bayes risk (MBR) and quality-estimation (QE) selection over each source's candidates: pure functions of the
candidates and a reward, shared by `--decode mbr|qe` at evaluation (`hf_seqrl.candidates`) and any caller with
candidate sets of its own.

- `mbr_select(candidates, utility)`: per source, the candidate with the highest mean utility against the source's
  other candidates, used as pseudo-references (Eikema & Aziz, 2020; Freitag et al., 2022). The utility is any
  reference-based reward in the calling convention (`hf_seqrl.rewards`): a built-in name (`"chrf"`, `"bleu"`, ...),
  a model reward (embeddings, COMET), or a callable `f(predictions, references, sources, **columns)`. Its `n x n`
  matrix is scored in one call over every (hypothesis, pseudo-reference) pair of all the sources given; `"chrf"`
  goes through `fastchrf.pairwise_chrf` when that package is installed (the same values as the `"chrf"` reward,
  sacrebleu's sentence chrF / 100), else through the `"chrf"` reward.
- `qe_select(candidates, sources, qe_reward)`: per source, the candidate a reference-free reward (CometKiwi,
  MetricX-QE, `TeacherLikelihoodReward`, a callable reading `predictions` and `sources`) scores highest, or none when
  that score is below `threshold`.

Ties go to the first candidate, so the pick depends on candidate order only through ties.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .rewards import build_reward, call_reward, reward_name


@dataclass(frozen=True)
class Selection:
    """One source's pick: `index` into its candidates and `text` (both None when QE's best is below the threshold),
    `score` (the pick's mean utility or QE score; for the best candidate even when it fell below the threshold),
    `scores` (every candidate's), and for MBR the utility `matrix`, `matrix[i][j]` = utility of candidate `i` with
    candidate `j` as the reference (the diagonal is not scored: NaN)."""

    index: int | None
    text: str | None
    score: float | None
    scores: tuple[float, ...]
    matrix: tuple[tuple[float, ...], ...] | None = None


def _check_candidates(candidates: Sequence[Sequence[str]], sources: Sequence[str] | None = None) -> None:
    """Raises unless `candidates` holds one non-empty list of strings per source, and `sources` (when given) one
    source per candidate set."""
    if isinstance(candidates, str) or any(isinstance(c, str) for c in candidates):
        raise TypeError("candidates must hold one list of candidate strings per source, e.g. [['a', 'b']] for one "
                        "source with two candidates.")
    empty = [i for i, c in enumerate(candidates) if len(c) == 0]
    if empty:
        raise ValueError(f"candidates: sources {empty[:10]} (counted from 0) have no candidate; give at least one.")
    if sources is not None and len(sources) != len(candidates):
        raise ValueError(f"Got {len(sources)} sources for {len(candidates)} candidate sets: give one per set.")


def fastchrf_available() -> bool:
    """Returns True when the `fastchrf` package (pairwise sentence chrF, compiled) is installed."""
    return importlib.util.find_spec("fastchrf") is not None


def utility_matrices(candidates: Sequence[Sequence[str]], utility: Any = "chrf",
                     sources: Sequence[str] | None = None) -> list[np.ndarray]:
    """Returns per source the `n x n` matrix `M[i, j]` = utility of candidate `i` against candidate `j` as its one
    reference, NaN on the diagonal, for `n` candidates.

    Every off-diagonal pair of every source is scored in one call of the utility (`call_reward`: its values checked;
    a None value is refused, since MBR needs each pair). `utility` is a reward name, a callable or a model reward
    (`build_reward`); `"chrf"` uses `fastchrf` when installed. `sources` (one per candidate set) reach the utility
    as each pair's source (COMET reads them)."""
    _check_candidates(candidates, sources)
    if utility == "chrf" and fastchrf_available():
        return _fastchrf_matrices(candidates)
    fn = build_reward(utility)
    owners, hyps, refs, pair_sources = [], [], [], []
    for k, cands in enumerate(candidates):
        for i, hyp in enumerate(cands):
            for j, ref in enumerate(cands):
                if i != j:
                    owners.append((k, i, j))
                    hyps.append(hyp)
                    refs.append([ref])
                    pair_sources.append(None if sources is None else sources[k])
    matrices = [np.full((len(c), len(c)), np.nan) for c in candidates]
    if not hyps:
        return matrices
    values = call_reward(fn, hyps, refs, None if sources is None else pair_sources, name=reward_name(utility))
    missing = [i for i, v in enumerate(values) if v is None]
    if missing:
        k, i, j = owners[missing[0]]
        raise ValueError(f"utility {reward_name(utility)!r} returned None for {len(missing)} pairs (first: source "
                         f"{k}, candidate {i} against candidate {j}); MBR needs a value for every pair: use a "
                         "utility that scores every prediction.")
    for (k, i, j), value in zip(owners, values):
        matrices[k][i, j] = float(value)
    return matrices


def _fastchrf_matrices(candidates: Sequence[Sequence[str]]) -> list[np.ndarray]:
    import fastchrf

    # sacrebleu's CHRF defaults, which the "chrf" reward uses: character 6-grams, beta 2, whitespace removed.
    lists = [list(c) for c in candidates]
    scored = fastchrf.pairwise_chrf(lists, lists, char_order=6, beta=2.0, remove_whitespace=True,
                                    eps_smoothing=False)
    matrices = []
    for cands, rows in zip(lists, scored):
        matrix = np.minimum(np.asarray(rows, dtype=float) / 100.0, 1.0)
        matrix[[i for i, c in enumerate(cands) if not c.strip()], :] = 0.0  # an empty prediction scores 0
        np.fill_diagonal(matrix, np.nan)
        matrices.append(matrix)
    return matrices


def expected_utilities(matrix: np.ndarray) -> np.ndarray:
    """Returns each candidate's mean utility against the others: row `i`'s mean over `j != i` (the diagonal, a
    candidate against itself, is left out; a duplicate of it at another index counts). One candidate alone gets 0."""
    n = matrix.shape[0]
    if n == 1:
        return np.zeros(1)
    off = ~np.eye(n, dtype=bool)
    return np.where(off, matrix, 0.0).sum(axis=1) / (n - 1)


def mbr_select(candidates: Sequence[Sequence[str]], utility: Any = "chrf", sources: Sequence[str] | None = None,
               keep_matrix: bool = False) -> list[Selection]:
    """Returns one `Selection` per source: the candidate with the highest expected utility, i.e. the mean of
    `utility(candidate, other)` over the source's other candidates (`j != i`, the candidate itself excluded from
    its own mean; with a utility that gives every candidate the same value against itself, as chrF and BLEU do for
    non-empty text, including it would pick the same). The first candidate wins a tie.

    Args:
        candidates: one list of candidate strings per source (samples, n-best lists; duplicates count as support).
        utility: a reward with references, as `build_reward` takes it (default `"chrf"`; `fastchrf` when installed).
        sources: one source per candidate set, passed to the utility (COMET reads them); None by default.
        keep_matrix: keep each source's utility matrix in the result.
    """
    selections = []
    for cands, matrix in zip(candidates, utility_matrices(candidates, utility, sources)):
        means = expected_utilities(matrix)
        best = int(np.argmax(means))  # the first of equal maxima
        kept = tuple(tuple(float(v) for v in row) for row in matrix) if keep_matrix else None
        selections.append(Selection(best, cands[best], float(means[best]), tuple(float(v) for v in means), kept))
    return selections


def qe_select(candidates: Sequence[Sequence[str]], sources: Sequence[str] | None, qe_reward: Any,
              threshold: float | None = None, columns: dict[str, Sequence] | None = None) -> list[Selection]:
    """Returns one `Selection` per source: the candidate that the reference-free `qe_reward` scores highest (the
    first of equal scores), or `index=None, text=None` where that best score is below `threshold`.

    Every candidate of every source is scored in one call: `qe_reward(predictions=..., references=[[]] per
    candidate, sources=each candidate's source, **columns)`. `qe_reward` is a name, a callable or a model reward
    (`build_reward`); a None value marks a candidate the reward does not score, never picked (a source with no
    scored candidate gets none). `columns` give one entry per source, repeated for its candidates."""
    _check_candidates(candidates, sources)
    fn = build_reward(qe_reward)
    owners = [k for k, cands in enumerate(candidates) for _ in cands]
    flat = [c for cands in candidates for c in cands]
    flat_sources = None if sources is None else [sources[k] for k in owners]
    flat_columns = {name: [values[k] for k in owners] for name, values in (columns or {}).items()}
    values = call_reward(fn, flat, [[] for _ in flat], flat_sources, flat_columns, name=reward_name(qe_reward))
    selections, start = [], 0
    for cands in candidates:
        scores = values[start:start + len(cands)]
        start += len(cands)
        scored = [i for i, v in enumerate(scores) if v is not None]
        if not scored:
            selections.append(Selection(None, None, None, tuple(float("nan") for _ in cands)))
            continue
        best = max(scored, key=lambda i: (scores[i], -i))
        keep = threshold is None or scores[best] >= threshold
        selections.append(Selection(best if keep else None, cands[best] if keep else None, float(scores[best]),
                                    tuple(float("nan") if v is None else float(v) for v in scores)))
    return selections
