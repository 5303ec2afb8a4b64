"""Raw text pairs from local files or the Hub, as the CLI's `train` and `evaluate` subcommands read them."""

from __future__ import annotations

from .checks import has_text, normalize_references

FILE_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".tsv": "csv", ".txt": "text"}


def read_text_pairs(path: str, source_column: str = "source", target_column: str = "target"):
    """Returns a `datasets.Dataset` of a plain-text pair file: one example per line, fields separated by tabs.

    The first field is the source, every further field a reference (one reference: a string cell; several: a
    list). No header line; blank lines are skipped; `.gz` files are read compressed.
    """
    import gzip

    from datasets import Dataset

    opener = gzip.open if path.endswith(".gz") else open
    sources, targets = [], []
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) < 2:
                raise ValueError(
                    f"{path}, line {number}: expected 'source<TAB>reference[<TAB>reference ...]', found no tab."
                )
            sources.append(fields[0])
            targets.append(fields[1] if len(fields) == 2 else fields[1:])
    if any(isinstance(t, list) for t in targets):
        targets = [t if isinstance(t, list) else [t] for t in targets]
    return Dataset.from_dict({source_column: sources, target_column: targets})


def load_text_files(files: dict[str, str], source_column: str = "source", target_column: str = "target"):
    """Returns a `datasets.DatasetDict` with one split per entry of `files` (split name → path).

    Formats by extension: `.json` / `.jsonl` (JSON lines; a target cell may be a list of references), `.csv`,
    `.tsv` (a header line names the columns), `.txt` (see `read_text_pairs`; columns `source_column` /
    `target_column`).
    """
    import os

    from datasets import DatasetDict, load_dataset
    from datasets.exceptions import DatasetGenerationError

    splits = {}
    for split, path in files.items():
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"The {split} file {path!r} does not exist (relative paths start at {os.getcwd()})."
            )
        if os.path.getsize(path) == 0:
            raise ValueError(f"The {split} file {path!r} is empty.")
        stem = path[:-3] if path.endswith(".gz") else path
        fmt = FILE_FORMATS.get(os.path.splitext(stem)[1].lower())
        if fmt is None:
            raise ValueError(f"Cannot read {path!r}: use one of {sorted(FILE_FORMATS)} (optionally .gz for .txt).")
        if fmt == "text":
            splits[split] = read_text_pairs(path, source_column, target_column)
            continue
        extra = {"delimiter": "\t"} if stem.lower().endswith(".tsv") else {}
        try:
            splits[split] = load_dataset(fmt, data_files={split: path}, split=split, **extra)
        except DatasetGenerationError as err:
            # The generic message hides the parser's, which names the row.
            layout = ("one JSON object per line or a JSON list of objects" if fmt == "json"
                      else "a header line naming the columns, then one row per line")
            raise ValueError(f"Cannot read {path!r} as {fmt} ({err.__cause__ or err}): give {layout}.") from err
    return DatasetDict(splits)


def load_pairs(path: str, source_column: str = "source", target_column: str = "target",
               max_examples: int | None = None) -> tuple[list[str], list[list[str]]]:
    """Returns `(sources, references)` read from one local file through `load_text_files`.

    A target cell may be a string or a list of references (SciTLDR's `target`); a source cell that is a list of
    strings (SciTLDR's sentences) is joined with spaces.
    """
    dataset = load_text_files({"data": path}, source_column, target_column)["data"]
    if not len(dataset):
        raise ValueError(f"{path} has no rows.")
    for column, flag in ((source_column, "source_column"), (target_column, "target_column")):
        if column not in dataset.column_names:
            raise ValueError(f"{path}: no column {column!r}; available columns: {', '.join(dataset.column_names)}. "
                             f"Set --{flag} ({flag}=) to one of them.")
    if max_examples is not None:
        dataset = dataset.select(range(min(max_examples, len(dataset))))
    sources = []
    for i, source in enumerate(dataset[source_column]):
        if isinstance(source, list):
            source = " ".join(str(s).strip() for s in source)
        if not has_text(source):
            raise ValueError(f"{path}: row {i} has an empty or non-string {source_column!r}.")
        sources.append(source)
    return sources, normalize_references(list(dataset[target_column]), field_name=f"{path}: {target_column}")


def select_pair_columns(dataset, source_column: str | None = None, target_column: str | None = None,
                        source_lang: str | None = None, target_lang: str | None = None, where: str = "dataset",
                        target_field: str = "target_column"):
    """Returns `dataset` reduced to two columns, `source` and `target`.

    The pair is taken from `source_column` / `target_column` when given; else, when `source_lang` and
    `target_lang` are given and there is a `translation` column of dicts (wmt16, opus), from its entries; else
    from the columns named `source_lang` / `target_lang`; else from `source` / `target`. Raises an error naming
    the missing column and listing the available ones, with the flag that sets it (`target_field`: the field that
    named `target_column`, e.g. `eval_target_column` for an evaluation split).
    """
    columns = list(dataset.column_names)
    if source_column is None and target_column is None and source_lang and target_lang and "translation" in columns:
        first = dataset[0]["translation"] if len(dataset) else {}
        missing = [lang for lang in (source_lang, target_lang) if lang not in first]
        if missing:
            raise ValueError(
                f"{where}: the 'translation' column has no {missing} entry (languages: {sorted(first)}); set "
                "source_lang / target_lang to two of them."
            )

        def flatten(batch):
            pairs = batch["translation"]
            return {"source": [p[source_lang] for p in pairs], "target": [p[target_lang] for p in pairs]}

        return dataset.map(flatten, batched=True, remove_columns=columns, desc=f"{where}: translation pairs")
    wanted = {"source": source_column or source_lang or "source", "target": target_column or target_lang or "target"}
    for role, name in wanted.items():
        if name not in columns:
            raise ValueError(
                f"{where} has no column {name!r} (the {role}); available columns: {columns}. Set "
                f"--{role + '_column' if role == 'source' else target_field} to one of them"
                + (" (or source_lang / target_lang for a 'translation' column)." if role == "source" else ".")
            )
    source, target = wanted["source"], wanted["target"]
    return dataset.map(lambda batch: {"source": batch[source], "target": batch[target]}, batched=True,
                       remove_columns=columns, desc=f"{where}: select columns")


def invalid_pairs(dataset) -> list[tuple[int, str]]:
    """Returns `(row, what is wrong)` for each row of `dataset` (columns `source`, `target`) that the trainers refuse:
    an empty or missing source, a missing target, or a target whose references are all empty; and for each list of
    references holding an empty one (which every prediction would score 0 against)."""
    problems = []
    for row, (source, target) in enumerate(zip(dataset["source"], dataset["target"])):
        references = [target] if isinstance(target, str) or target is None else list(target)
        if not has_text(source):
            problems.append((row, f"empty source {source!r}"))
        elif not any(map(has_text, references)):
            problems.append((row, f"no reference (target {target!r})"))
        elif not all(map(has_text, references)):
            problems.append((row, f"an empty reference among {references!r}"))
    return problems


def check_pairs(dataset, where: str, drop: bool = False, flag: str = "--drop_invalid_rows"):
    """Returns `dataset` (columns `source`, `target`) when every row is usable (`invalid_pairs`); else raises an
    error naming the rows and the fix, or, with `drop`, returns it without them (`drop_empty_pairs`) after a warning
    that counts what was dropped."""
    import warnings

    problems = invalid_pairs(dataset)
    if not problems:
        return dataset
    shown = "; ".join(f"row {row}: {what}" for row, what in problems[:5])
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    if not drop:
        raise ValueError(f"{where}: {len(problems)} of {len(dataset)} rows cannot be trained on: {shown}{more}. Fix "
                         f"them in the data, or pass {flag} to drop them (empty references inside a list are dropped, "
                         "the rest of the row kept).")
    kept = drop_empty_pairs(dataset, where)
    message = (f"{where}: dropped {len(dataset) - len(kept)} of {len(dataset)} rows and the empty references of "
               f"others ({flag}): {shown}{more}. {len(kept)} rows remain.")
    warnings.warn(message, stacklevel=2)
    if not len(kept):
        raise ValueError(f"{where}: no row is left to train on: {shown}{more}.")
    return kept


def drop_empty_pairs(dataset, where: str = "dataset"):
    """Returns `dataset` (columns `source`, `target`) without empty references in lists of references, and without
    the rows whose source or every reference is empty."""

    def keep(batch) -> list[bool]:
        return [has_text(source) and any(map(has_text, [target] if isinstance(target, str) else target or []))
                for source, target in zip(batch["source"], batch["target"])]

    dataset = dataset.filter(keep, batched=True, desc=f"{where}: drop empty pairs")
    if any(isinstance(target, list) and not all(map(has_text, target)) for target in dataset["target"]):
        dataset = dataset.map(lambda batch: {"target": [[r for r in refs if has_text(r)] if isinstance(refs, list)
                                                        else refs for refs in batch["target"]]},
                              batched=True, desc=f"{where}: drop empty references")
    return dataset
