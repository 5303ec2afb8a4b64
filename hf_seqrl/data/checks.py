"""Row and column checks: a row that would poison training silently is named before training starts."""

from __future__ import annotations

from typing import Any


def has_text(value: Any) -> bool:
    """Returns whether `value` is a string with at least one non-blank character (a usable source or reference).

    The one emptiness rule of the package: every check of a source, prompt, target or reference cell calls it.
    """
    return isinstance(value, str) and bool(value.strip())


def normalize_references(references: Any, field_name: str = "references", offset: int = 0) -> list[list[str]]:
    """Returns references as a list (one per source) of non-empty lists of non-empty strings.

    Each row may be a string or a list of strings. Raises a clear error naming the row (counted from `offset`)
    otherwise.

    Args:
        references (`Iterable`): one cell per source, a string or a list of strings.
        field_name (`str`, *optional*, defaults to `"references"`): how errors name the column.
        offset (`int`, *optional*, defaults to `0`): the index errors give the first row.
    """
    rows = []
    for i, row in enumerate(references, start=offset):
        refs = [row] if isinstance(row, str) else row
        if not isinstance(refs, (list, tuple)):
            raise TypeError(
                f"{field_name}[{i}] is a {type(row).__name__}; each row must be a string or a list of strings."
            )
        if len(refs) == 0:
            raise ValueError(f"{field_name}[{i}] is an empty list: give at least one reference per source.")
        for ref in refs:
            if not isinstance(ref, str):
                raise TypeError(
                    f"{field_name}[{i}] contains a {type(ref).__name__} ({ref!r}); references must be strings."
                )
            if not has_text(ref):
                raise ValueError(
                    f"{field_name}[{i}] contains an empty reference string: every prediction would score 0 "
                    "against it. Drop it or the row."
                )
        rows.append(list(refs))
    return rows


# What a cell of each kind of text column must hold, as errors say it.
TEXT_KINDS = {
    "text": "a string",
    "prompt": "a string or a list of chat messages ({'role': ..., 'content': <string>} dicts)",
    "references": "a string or a non-empty list of strings, each with text",
    "completion": "a string with text, a non-empty list of such strings (references) or a list of chat messages",
}


def describe(value: Any) -> str:
    """Returns how an error names a cell's value: `None`, `an empty string`, `an int (5)`, `a list holding None`."""
    if value is None:
        return "None"
    if isinstance(value, str):
        return "an empty string" if not value.strip() else f"a string ({value[:40]!r})"
    if isinstance(value, (list, tuple)):
        if not value:
            return "an empty list"
        bad = next((item for item in value if not has_text(item)), value[0])
        return f"a list holding {describe(bad)}"
    kind = type(value).__name__
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} ({str(value)[:40]})"


def _is_messages(value: Any) -> bool:
    """Returns whether `value` is a non-empty list of chat messages, each a dict with a string `content`."""
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("content"), str) for m in value)


def _is_references(value: Any) -> bool:
    """Returns whether `value` is a string with text or a non-empty list of them."""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(has_text(item) for item in value)
    return has_text(value)


def _wrong_type(value: Any) -> bool:
    """Returns whether a cell holds a type no text column takes (a number, a dict, a list holding one), as opposed to
    a missing or empty text (None, "", [])."""
    if value is None or isinstance(value, str):
        return False
    if not isinstance(value, (list, tuple)):
        return True
    return any(item is not None and not isinstance(item, (str, dict)) for item in value)


def text_cell_ok(value: Any, kind: str) -> bool:
    """Returns whether one cell of a text column of `kind` (a key of `TEXT_KINDS`) is what that kind holds. A "text"
    or "prompt" cell may be an empty string here: the trainers' emptiness checks name those rows together."""
    if kind == "text":
        return isinstance(value, str)
    if kind == "prompt":
        return isinstance(value, str) or _is_messages(value)
    if kind == "references":
        return _is_references(value)
    return _is_references(value) or _is_messages(value)


def check_text_column(values, column: str, kind: str, name: str, rows=None) -> None:
    """Raises a clear error naming the dataset, the row and the column for the first cell of `values` that is not what
    a text column of `kind` holds (`TEXT_KINDS`): a target that is a number, a None, a list of non-strings, ...

    Args:
        values (`Sequence`): the column's cells.
        column (`str`): the column's name.
        kind (`str`): `"text"`, `"prompt"`, `"references"` or `"completion"`.
        name (`str`): how errors name the dataset (`"train_dataset"`).
        rows (`Iterable[int]`, *optional*): the row index of each cell (default: 0, 1, ...).
    """
    for row, value in zip(range(len(values)) if rows is None else rows, values):
        if not text_cell_ok(value, kind):
            raise (TypeError if _wrong_type(value) else ValueError)(
                f"{name} row {row}: column {column!r} holds {describe(value)}, but each cell must be "
                f"{TEXT_KINDS[kind]}. Drop or fix that row (or name another column).")


def _batched_columns(dataset) -> list[str] | None:
    """Returns the column names of a `datasets.Dataset` that can be read in batches; None for any other dataset
    (plain lists, torch datasets, dataset dicts), which the row checks leave alone."""
    columns = getattr(dataset, "column_names", None)
    if not isinstance(columns, list) or not hasattr(dataset, "iter"):
        return None
    return columns


def _row_batches(dataset, columns: list[str], batch_size: int):
    """Yields `(offset, batch)` over `columns` of `dataset`, `offset` being the index of the batch's first row, so
    that errors name rows of the whole dataset."""
    offset = 0
    for batch in dataset.select_columns(columns).iter(batch_size=batch_size):
        yield offset, batch
        offset += len(batch[columns[0]])


def check_rows(dataset, name: str = "train_dataset", batch_size: int = 1000, vocabulary: int | None = None) -> None:
    """Raises a clear error naming the row for rows that would poison training silently.

    Checks a `datasets.Dataset` (other datasets are left alone): empty `input_ids`, `labels` that are empty or
    all -100, `sources` that are not strings with text, `references` that are not strings with text / non-empty
    lists of them (`check_text_column`), and with `vocabulary`, ids of `input_ids` or `labels` the model has no row
    for (rows tokenized with another tokenizer: they would fail at the first step inside `torch.embedding`).

    Args:
        dataset (`datasets.Dataset`): the tokenized dataset.
        name (`str`, *optional*, defaults to `"train_dataset"`): how errors name the dataset.
        batch_size (`int`, *optional*, defaults to `1000`): rows read at a time.
        vocabulary (`int`, *optional*): the rows of the model's smallest embedding matrix or output layer.
    """
    columns = _batched_columns(dataset)
    if columns is None:
        return
    wanted = [c for c in ("input_ids", "labels", "references", "sources") if c in columns]
    if not wanted:
        return
    for offset, batch in _row_batches(dataset, wanted, batch_size):
        for i in range(len(batch[wanted[0]])):
            row = offset + i
            if "input_ids" in batch and len(batch["input_ids"][i]) == 0:
                raise ValueError(f"{name} row {row}: 'input_ids' is empty (empty source?). Drop or fix that row.")
            if "labels" in batch:
                labels = batch["labels"][i]
                if len(labels) == 0 or all(t == -100 for t in labels):
                    raise ValueError(
                        f"{name} row {row}: 'labels' is empty or all -100, so it has no target. Drop or fix that row."
                    )
            if vocabulary is not None:
                check_ids(batch, i, row, name, vocabulary)
            if "sources" in batch:
                check_text_column(batch["sources"][i:i + 1], "sources", "text", name, [row])
                if not has_text(batch["sources"][i]):
                    raise ValueError(f"{name} row {row}: 'sources' is empty. Drop or fix that row.")
        if "references" in batch:
            rows = range(offset, offset + len(batch["references"]))
            check_text_column(batch["references"], "references", "references", name, rows)


def check_ids(batch: dict, i: int, row: int, name: str, vocabulary: int) -> None:
    """Raises a clear error when row `i` of `batch` (row `row` of the dataset `name`) holds an id in `input_ids` or
    `labels` (-100 aside) outside `0 .. vocabulary - 1`."""
    for column in ("input_ids", "labels"):
        ids = batch[column][i] if column in batch else []
        bad = [t for t in ids if not 0 <= t < vocabulary and t != -100]
        if bad:
            raise ValueError(
                f"{name} row {row}: {column!r} holds id {bad[0]}, but the model has {vocabulary} rows of embeddings "
                f"(ids 0..{vocabulary - 1}), so it would fail at the first step. Tokenize with the model's own "
                "tokenizer (processing_class), or grow the model with model.resize_token_embeddings(...) to hold "
                "every id of the tokenizer the rows were made with.")


def check_causal_rows(dataset, name: str) -> None:
    """Raises a clear error naming a row of a `datasets.Dataset` a decoder-only model cannot train on."""
    columns = _batched_columns(dataset)
    if columns is None or "labels" not in columns:
        return
    for offset, batch in _row_batches(dataset, ["input_ids", "labels"], 1000):
        for i, (ids, labels) in enumerate(zip(batch["input_ids"], batch["labels"])):
            if len(ids) != len(labels):
                raise ValueError(
                    f"{name} row {offset + i}: a causal LM reads 'labels' aligned with 'input_ids' (prompt + "
                    f"completion, -100 on the prompt), but they have {len(labels)} and {len(ids)} tokens. Build the "
                    "rows with hf_seqrl.data.tokenize_prompt_completion.")
            if labels and labels[0] != -100:
                raise ValueError(f"{name} row {offset + i}: its first token is already a label, so it has no "
                                 "prompt to sample from: set labels to -100 on the prompt tokens.")


def missing_targets_message(name: str, columns, reasons: list[str]) -> str:
    """Returns the error for the dataset `name` (its `columns`), which has sources and no targets, that the settings
    `reasons` read (`hf_seqrl.trainers.services.references.target_settings`)."""
    return (f"{name} has sources and no targets (columns: {columns}), which this run reads: " + "; ".join(reasons)
            + ". Add a 'target' / 'completion' column (target_column names another), a 'references' column, or "
            "tokenized 'labels'.")


def check_dataset_columns(dataset, name: str, family=None, target_reasons: list[str] | None = None) -> None:
    """Raises a clear error if a `datasets.Dataset` has no `input_ids`, a column named like a reward keyword
    (`predictions`), rows the model family cannot read (a causal row's labels must align with its input_ids and leave
    a prompt), or neither `labels` nor `references` while the run reads targets.

    Args:
        dataset (`datasets.Dataset`): the tokenized dataset; others are left alone.
        name (`str`): how errors name the dataset.
        family (`hf_seqrl.models.base.ModelFamily`, *optional*): the model's family; a causal one also checks rows.
        target_reasons (`list[str]`, *optional*): the settings of the run that read targets; empty when sources
            alone train it, `None` when targets are needed whatever the settings.
    """
    columns = getattr(dataset, "column_names", None)
    if columns is None or isinstance(columns, dict):
        return
    if "predictions" in columns:
        raise ValueError(
            f"{name} has a column named 'predictions': rewards receive every dataset column as a keyword, and "
            "'predictions' is the decoded outputs. Rename that column."
        )
    if "input_ids" not in columns:
        raise ValueError(
            f"{name} has no 'input_ids' column (columns: {columns}): tokenize the sources first, e.g. with "
            "hf_seqrl.data.tokenize_pairs."
        )
    if "labels" not in columns and "references" not in columns and target_reasons != []:
        if target_reasons:
            raise ValueError(missing_targets_message(name, columns, target_reasons))
        raise ValueError(
            f"{name} has neither 'labels' nor 'references' (columns: {columns}): rewards need references. "
            "Add tokenized 'labels' (tokenizer(text_target=...)) or a 'references' text column."
        )
    if family is not None and family.name == "causal":
        check_causal_rows(dataset, name)
