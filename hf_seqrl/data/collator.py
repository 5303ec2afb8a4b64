"""The collator that keeps the text columns (and every other non-model column) through batching."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .checks import normalize_references

TEXT_COLUMNS = ("references", "sources")


class SeqRLDataCollator:
    """Wraps a seq2seq collator so that the text columns and every other non-model column survive batching.

    The wrapped collator sees only the model's inputs (`model_input_names`; with None, every column except
    `references` / `sources`). The batch gets the rest back as lists, one entry per row: `batch["references"]`
    (list of lists of strings), `batch["sources"]` (list of strings) and each other column under its own name.
    The trainers pass those other columns to the rewards as keywords. A batch of rows without targets (sources
    alone) has no `labels` key.

    Args:
        collator: e.g. `DataCollatorForSeq2Seq(tokenizer, model=model)`.
        model_input_names (`set[str]`, *optional*): the keys the model's `forward` takes (and `labels`).
        tokenizer_outputs (`set[str]`, *optional*): keys the tokenizer wrote that the model does not take
            (`token_type_ids` for an encoder-decoder built from BERTs): no dataset column, so they reach neither the
            model nor the rewards.
    """

    def __init__(self, collator: Callable[[list[dict[str, Any]]], dict[str, Any]],
                 model_input_names: set[str] | None = None, tokenizer_outputs: set[str] | None = None):
        self.collator = collator
        self.model_input_names = None if model_input_names is None else set(model_input_names) - set(TEXT_COLUMNS)
        self.tokenizer_outputs = set(tokenizer_outputs or ())

    def is_extra(self, name: str) -> bool:
        """Returns True for a column that stays out of the model's inputs."""
        return name in TEXT_COLUMNS or (self.model_input_names is not None and name not in self.model_input_names)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        extra: dict[str, list] = {}
        stripped = []
        for feature in features:
            feature = {key: value for key, value in feature.items() if key not in self.tokenizer_outputs}
            for name in [key for key in feature if self.is_extra(key)]:
                extra.setdefault(name, []).append(feature.pop(name))
            stripped.append(feature)
        batch = self.collator(stripped)
        if "labels" in batch and batch["labels"] is None:  # rows of sources alone: `Seq2SeqTrainer` reads the key
            del batch["labels"]  # as labels, and `DataCollatorForSeq2Seq` writes None there
        for name, values in extra.items():
            if len(values) != len(features):
                raise ValueError(f"Column {name!r} is missing in some rows of the batch: give it for every row.")
            batch[name] = normalize_references(values) if name == "references" else list(values)
        return batch
