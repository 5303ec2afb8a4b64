"""`token_match`: a lexical token-level reward, to measure token-level credit without a neural model.

The sentence score is sentence chrF against the best reference; each word of the prediction that no word of that
reference aligns to gets a negative value on its characters. The alignment is the longest common subsequence of the
two word sequences (words compared lowercased, the punctuation at their edges stripped): the words outside it are the
ones the reference does not account for in that order (a wrong word, an insertion, a word out of place).

Pure Python at import; sacrebleu (for chrF) is imported when the reward is called.
"""

from __future__ import annotations

import re
import string
from typing import Any

WORD = re.compile(r"\S+")


def _key(word: str) -> str:
    """Returns what a word is compared by: lowercased, the punctuation at its edges stripped (a word of punctuation
    only as it is)."""
    return word.strip(string.punctuation + "“”‘’«»„").lower() or word


def aligned_words(prediction: list[str], reference: list[str]) -> list[bool]:
    """Returns, for each word of `prediction`, whether it is in a longest common subsequence with `reference` (words
    compared by `_key`; of several longest subsequences, the one that matches the earliest prediction words)."""
    a, b = [_key(w) for w in prediction], [_key(w) for w in reference]
    n, m = len(a), len(b)
    # lengths[i][j]: LCS of a[i:] and b[j:]
    lengths = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            lengths[i][j] = lengths[i + 1][j + 1] + 1 if a[i] == b[j] else max(lengths[i + 1][j], lengths[i][j + 1])
    aligned, i, j = [False] * n, 0, 0
    while i < n and j < m:
        if a[i] == b[j] and lengths[i][j] == lengths[i + 1][j + 1] + 1:
            aligned[i], i, j = True, i + 1, j + 1
        elif lengths[i + 1][j] >= lengths[i][j + 1]:
            i += 1
        else:
            j += 1
    return aligned


class TokenMatchReward:
    """The `token_match` reward (`token_match_reward`); a class so that `reward_workers` can pickle it."""

    needs_references = True

    def __init__(self, word_penalty: float = 0.1):
        if not word_penalty >= 0:
            raise ValueError(f"token_match_reward: word_penalty={word_penalty} must be >= 0.")
        self.word_penalty = float(word_penalty)
        self.__name__ = "token_match"

    def value(self, prediction: str, references: list[str]) -> dict:
        """Returns `{"score": chrF, "spans": [(start, end, -word_penalty), ...]}` for `prediction` against the
        reference with the best chrF."""
        import sacrebleu

        scores = [sacrebleu.sentence_chrf(prediction, [reference]).score / 100 for reference in references]
        best = max(range(len(references)), key=scores.__getitem__)
        words = list(WORD.finditer(prediction))
        aligned = aligned_words([w.group() for w in words], references[best].split())
        spans = [(w.start(), w.end(), -self.word_penalty) for w, hit in zip(words, aligned) if not hit]
        return {"score": min(1.0, max(0.0, scores[best])), "spans": spans}

    def __call__(self, predictions: list[str], references: list[list[str]], sources=None,
                 **columns: Any) -> list[dict]:
        return [self.value(prediction, list(refs)) for prediction, refs in zip(predictions, references)]


def token_match_reward(word_penalty: float = 0.1) -> TokenMatchReward:
    """Returns the lexical token-level reward: sentence chrF against the best reference, and `-word_penalty` on each
    prediction word outside the longest common word subsequence with that reference (`aligned_words`), mapped by the
    trainer to the word's tokens. `get_reward("token_match")` is this with the default penalty."""
    return TokenMatchReward(word_penalty)
