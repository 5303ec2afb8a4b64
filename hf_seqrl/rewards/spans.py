"""Token-level rewards: a reward may say, per prediction, which parts of it were good or bad.

Beside a number (or `None`), a reward may return for a prediction:

- `{"score": 0.71, "spans": [(start, end, value), ...]}`: the sentence score and character spans of the prediction's
  text, each with a value (an error span of xCOMET with its severity's penalty, a word that matches no reference
  word). The trainer maps the spans to the prediction's tokens through the text each token decodes to: a token
  gets the sum of the values of the spans it touches (tokenizer-independent, as Ramos et al., 2026 do). An empty
  span `(i, i, value)` (an omission at `i`) goes to the token that holds character `i`, or the last token (the EOS)
  at the end of the text. `"score"` may be `None` (no sentence reward) when there are spans;
- a list of per-token values, as many as the prediction's tokens (EOS included): taken as they are, with a sentence
  score of 0.

`TokenScore` holds either form once checked. Pure Python, no import beyond the standard library.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TokenScore:
    """A prediction's reward with token-level values: the sentence `score` (None: none), character `spans`
    `((start, end, value), ...)` of the prediction's text, and per-token `tokens` values (None: none); a weighted sum
    of several rewards holds all of theirs (`weighted_sum`)."""

    score: float | None
    spans: tuple[tuple[int, int, float], ...] = ()
    tokens: tuple[float, ...] | None = None

    def scaled(self, weight: float) -> TokenScore:
        """Returns this score with the sentence score and every token-level value times `weight`."""
        return TokenScore(None if self.score is None else weight * self.score,
                          tuple((s, e, weight * v) for s, e, v in self.spans),
                          None if self.tokens is None else tuple(weight * v for v in self.tokens))

    def token_values(self, char_spans: Sequence[tuple[int, int]]) -> list[float]:
        """Returns one value per token from the tokens' character spans `char_spans` (`token_char_spans`): the
        per-token values plus what the spans give each token (`span_token_values`). Raises a ValueError when the
        per-token values are not one per token."""
        values = span_token_values(self.spans, char_spans)
        if self.tokens is not None:
            if len(self.tokens) != len(char_spans):
                raise ValueError(f"{len(self.tokens)} per-token values for a prediction of {len(char_spans)} tokens "
                                 "(EOS included): return one per token")
            values = [a + b for a, b in zip(values, self.tokens)]
        return values


def weighted_sum(items: Sequence[tuple[float, float | TokenScore]]) -> float | TokenScore:
    """Returns the sum of `weight * value` over `items` (numbers and `TokenScore`s): a number when every value is
    one, else a `TokenScore` holding the weighted sentence scores (None when none has one) and every span and
    per-token value, weighted."""
    if not any(isinstance(value, TokenScore) for _, value in items):
        return sum(weight * value for weight, value in items)
    scores, spans, tokens = [], [], None
    for weight, value in items:
        if not isinstance(value, TokenScore):
            scores.append(weight * value)
            continue
        part = value.scaled(weight)
        if part.score is not None:
            scores.append(part.score)
        spans.extend(part.spans)
        if part.tokens is not None:
            if tokens is not None and len(tokens) != len(part.tokens):
                raise ValueError(f"two rewards returned {len(tokens)} and {len(part.tokens)} per-token values for one "
                                 "prediction")
            tokens = part.tokens if tokens is None else tuple(a + b for a, b in zip(tokens, part.tokens))
    return TokenScore(sum(scores) if scores else None, tuple(spans), tokens)


def sentence_score(value: float | TokenScore | None) -> float | None:
    """Returns the sentence part of a reward value: the number itself, a `TokenScore`'s score (0.0 when it has
    token-level values only), or None."""
    if isinstance(value, TokenScore):
        return 0.0 if value.score is None else value.score
    return value


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def token_score(value, text: str, name: str, index: int, where: str = "") -> TokenScore:
    """Returns the `TokenScore` of one returned value (a dict with `"score"` and `"spans"`, or a list of per-token
    values) for the prediction `text`, or raises a ValueError naming the reward `name`, the prediction's `index` and
    what is wrong (a span outside the text, start after end, a NaN, a missing field)."""
    def fail(problem: str):
        raise ValueError(f"reward {name!r}, prediction {index} ({text[:60]!r}){where}: {problem}. Return a number, "
                         "None, {'score': float or None, 'spans': [(start, end, value), ...]} with 0 <= start <= end "
                         "<= len(prediction) and finite values, or one finite value per token.")

    if isinstance(value, dict):
        if set(value) - {"score", "spans"} or "spans" not in value:
            fail(f"a dict needs the keys 'score' and 'spans' only, got {sorted(value)}")
        score = value.get("score")
        if score is not None and not _number(score):
            fail(f"its score {score!r} is not a finite number or None")
        spans = []
        for span in value["spans"] or ():
            if not isinstance(span, (tuple, list)) or len(span) != 3:
                fail(f"span {span!r} is not (start, end, value)")
            start, end, amount = span
            if not (isinstance(start, int) and isinstance(end, int)) or isinstance(start, bool):
                fail(f"span {span!r}: start and end must be character offsets (int)")
            if not 0 <= start <= end <= len(text):
                fail(f"span {span!r} is outside the text of {len(text)} characters, or starts after it ends")
            if not _number(amount):
                fail(f"span {span!r} has a value that is not a finite number")
            spans.append((start, end, float(amount)))
        if score is None and not spans:
            fail("no score and no span: return None where the reward does not apply")
        return TokenScore(None if score is None else float(score), tuple(spans))
    if isinstance(value, (list, tuple)):
        if not all(_number(v) for v in value):
            fail("a list of per-token values holds a value that is not a finite number")
        return TokenScore(0.0, tokens=tuple(float(v) for v in value))
    fail(f"{type(value).__name__} is no reward value")


def token_char_spans(prefix_texts: Sequence[str], text: str) -> list[tuple[int, int]]:
    """Returns each token's `(start, end)` in the prediction's `text` from `prefix_texts`, the decoded text of the
    first 1, 2, ... tokens: token `t` covers what its prefix adds to the previous one. Where a prefix is not a
    prefix of the text (a byte-level token cut inside a character, a tokenizer that cleans spaces) the common part
    counts, so the spans stay ordered and inside the text. A token that adds nothing before a token that adds the
    character where it stands holds a part of that character (the first bytes of a character a byte-level tokenizer
    splits): it gets that token's span. A token that adds nothing at the end (EOS) gets an empty span there."""
    spans, previous = [], 0
    for prefix in prefix_texts:
        end = len(os.path.commonprefix([prefix, text]))
        end = max(end, previous)
        spans.append((previous, end))
        previous = end
    return _lend_to_empty(spans)


def piece_char_spans(pieces: Sequence[str], text: str) -> list[tuple[int, int]] | None:
    """Returns each token's `(start, end)` in the prediction's `text` from `pieces`, the text each token adds when the
    tokens are decoded one after another (an incremental decoder's chunks, "" where a token completes no character
    yet): the spans `token_char_spans` gives from the prefixes, in one pass instead of one decode per prefix. Returns
    None where the pieces do not spell `text` (a tokenizer that cleans spaces after decoding): then the prefixes
    tell."""
    if "".join(pieces) != text:
        return None
    spans, start = [], 0
    for piece in pieces:
        spans.append((start, start + len(piece)))
        start += len(piece)
    return _lend_to_empty(spans)


def _lend_to_empty(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Gives a token that adds nothing the span of the next token when that one adds the character where both
    stand (the first bytes of a character split over tokens); an empty span at the end stays."""
    for t in range(len(spans) - 2, -1, -1):
        start, end = spans[t]
        if start == end and spans[t + 1][0] == start and spans[t + 1][1] > start:
            spans[t] = spans[t + 1]
    return spans


def span_token_values(spans: Sequence[tuple[int, int, float]], char_spans: Sequence[tuple[int, int]]) -> list[float]:
    """Returns one value per token: the sum of the values of the character `spans` `(start, end, value)` that touch
    the token's characters `char_spans[t]` (`[a, b)` touches `[start, end)` when they overlap). An empty span
    `(i, i, value)` goes to the token whose characters hold `i`, else (at the end of the text) to the last token."""
    values = [0.0] * len(char_spans)
    if not char_spans:
        return values
    for start, end, value in spans:
        if start == end:
            holder = next((t for t, (a, b) in enumerate(char_spans) if a <= start < b), len(char_spans) - 1)
            values[holder] += value
            continue
        for t, (a, b) in enumerate(char_spans):
            if a < end and start < b:
                values[t] += value
    return values
