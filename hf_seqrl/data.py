"""Datasets → tokenized features plus raw references; a collator that keeps the text columns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .rewards import normalize_references

TEXT_COLUMNS = ("references", "sources")


class SeqRLDataCollator:
    """Wraps a seq2seq collator so that the `references` / `sources` text columns survive batching.

    The wrapped collator sees the features without the text columns; the batch gets them back as
    `batch["references"]` (list of lists of strings) and `batch["sources"]` (list of strings) when present.
    """

    def __init__(self, collator: Callable[[list[dict[str, Any]]], dict[str, Any]]):
        self.collator = collator

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        text = {name: [] for name in TEXT_COLUMNS}
        stripped = []
        for feature in features:
            feature = dict(feature)
            for name in TEXT_COLUMNS:
                if name in feature:
                    text[name].append(feature.pop(name))
            stripped.append(feature)
        batch = self.collator(stripped)
        for name, values in text.items():
            if not values:
                continue
            if len(values) != len(features):
                raise ValueError(f"Column {name!r} is missing in some rows of the batch: give it for every row.")
            batch[name] = normalize_references(values) if name == "references" else list(values)
        return batch


def tokenize_pairs(
    examples: dict[str, list],
    tokenizer,
    source_column: str,
    target_column: str,
    max_source_length: int | None = None,
    max_target_length: int | None = None,
    prefix: str = "",
) -> dict[str, list]:
    """Returns tokenized `input_ids`, `attention_mask`, `labels` and raw `references` / `sources` (batched map).

    A target cell may hold one string or a list of references; the first reference is the training label,
    all of them are kept as rewards' references.
    """
    sources = examples[source_column]
    targets = examples[target_column]
    for i, src in enumerate(sources):
        if not isinstance(src, str) or not src.strip():
            raise ValueError(f"Row {i} of this batch has an empty or non-string {source_column!r}: drop or fix it.")
    references = normalize_references(targets, field_name=target_column)
    for i, refs in enumerate(references):
        if not any(r.strip() for r in refs):
            raise ValueError(f"Row {i} of this batch has an empty {target_column!r}: drop or fix it.")
    model_inputs = tokenizer([prefix + s for s in sources], max_length=max_source_length, truncation=True)
    labels = tokenizer(text_target=[refs[0] for refs in references], max_length=max_target_length, truncation=True)
    model_inputs["labels"] = labels["input_ids"]
    model_inputs["references"] = references
    model_inputs["sources"] = list(sources)
    return model_inputs
