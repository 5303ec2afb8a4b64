"""Datasets → tokenized features plus raw references; a collator that keeps the text columns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .models.base import decoder_start_id

TEXT_COLUMNS = ("references", "sources")


def normalize_references(references: Any, field_name: str = "references", offset: int = 0) -> list[list[str]]:
    """Returns references as a list (one per source) of non-empty lists of non-empty strings.

    Each row may be a string or a list of strings. Raises a clear error naming the row (counted from `offset`)
    otherwise.
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
            if not ref.strip():
                raise ValueError(
                    f"{field_name}[{i}] contains an empty reference string: every prediction would score 0 "
                    "against it. Drop it or the row."
                )
        rows.append(list(refs))
    return rows


class SeqRLDataCollator:
    """Wraps a seq2seq collator so that the text columns and every other non-model column survive batching.

    The wrapped collator sees only the model's inputs (`model_input_names`; with None, every column except
    `references` / `sources`). The batch gets the rest back as lists, one entry per row: `batch["references"]`
    (list of lists of strings), `batch["sources"]` (list of strings) and each other column under its own name.
    The trainers pass those other columns to the rewards as keywords.

    Args:
        collator: e.g. `DataCollatorForSeq2Seq(tokenizer, model=model)`.
        model_input_names (`set[str]`, *optional*): the keys the model's `forward` takes (and `labels`).
    """

    def __init__(self, collator: Callable[[list[dict[str, Any]]], dict[str, Any]],
                 model_input_names: set[str] | None = None):
        self.collator = collator
        self.model_input_names = None if model_input_names is None else set(model_input_names) - set(TEXT_COLUMNS)

    def is_extra(self, name: str) -> bool:
        """Returns True for a column that stays out of the model's inputs."""
        return name in TEXT_COLUMNS or (self.model_input_names is not None and name not in self.model_input_names)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        extra: dict[str, list] = {}
        stripped = []
        for feature in features:
            feature = dict(feature)
            for name in [key for key in feature if self.is_extra(key)]:
                extra.setdefault(name, []).append(feature.pop(name))
            stripped.append(feature)
        batch = self.collator(stripped)
        for name, values in extra.items():
            if len(values) != len(features):
                raise ValueError(f"Column {name!r} is missing in some rows of the batch: give it for every row.")
            batch[name] = normalize_references(values) if name == "references" else list(values)
        return batch


def check_rows(dataset, name: str = "train_dataset", batch_size: int = 1000) -> None:
    """Raises a clear error naming the row for rows that would poison training silently.

    Checks a `datasets.Dataset` (other datasets are left alone): empty `input_ids`, `labels` that are empty or
    all -100, empty `sources`, and `references` that are not non-empty strings / lists of them.
    """
    columns = getattr(dataset, "column_names", None)
    if not isinstance(columns, list) or not hasattr(dataset, "iter"):
        return
    wanted = [c for c in ("input_ids", "labels", "references", "sources") if c in columns]
    offset = 0
    for batch in dataset.select_columns(wanted).iter(batch_size=batch_size):
        size = len(batch[wanted[0]])
        for i in range(size):
            row = offset + i
            if "input_ids" in batch and len(batch["input_ids"][i]) == 0:
                raise ValueError(f"{name} row {row}: 'input_ids' is empty (empty source?). Drop or fix that row.")
            if "labels" in batch:
                labels = batch["labels"][i]
                if len(labels) == 0 or all(t == -100 for t in labels):
                    raise ValueError(
                        f"{name} row {row}: 'labels' is empty or all -100, so it has no target. Drop or fix that row."
                    )
            if "sources" in batch and (not isinstance(batch["sources"][i], str) or not batch["sources"][i].strip()):
                raise ValueError(f"{name} row {row}: 'sources' is empty or not a string. Drop or fix that row.")
        if "references" in batch:
            normalize_references(batch["references"], field_name=f"{name} references", offset=offset)
        offset += size


def strip_start_token(label_ids: list[list[int]], decoder_start_token_id: int | None) -> list[list[int]]:
    """Returns the label rows without a leading `decoder_start_token_id`.

    Tokenizers of encoder-only checkpoints (BERT, RoBERTa) wrap a target in [CLS] ... [SEP], and a BERT2BERT
    `EncoderDecoderModel` starts decoding from [CLS]: left in the labels, the leading [CLS] teaches the model to
    emit a second one, and teacher-forced scores see a prefix that decoding never produces. Labels of T5, BART,
    Marian, mBART and Pegasus do not start with their decoder start token and are returned unchanged.
    """
    if decoder_start_token_id is None:
        return label_ids
    return [ids[1:] if len(ids) > 1 and ids[0] == decoder_start_token_id else ids for ids in label_ids]


def tokenize_pairs(
    examples: dict[str, list],
    tokenizer,
    source_column: str,
    target_column: str,
    max_source_length: int | None = None,
    max_target_length: int | None = None,
    prefix: str = "",
    decoder_start_token_id: int | None = None,
) -> dict[str, list]:
    """Returns tokenized `input_ids`, `attention_mask`, `labels` and raw `references` / `sources` (batched map).

    A target cell may hold one string or a list of references; the first reference is the training label,
    all of them are kept as rewards' references. With `decoder_start_token_id`, labels lose a leading copy of
    that token (`strip_start_token`).
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
    model_inputs["labels"] = strip_start_token(labels["input_ids"], decoder_start_token_id)
    model_inputs["references"] = references
    model_inputs["sources"] = list(sources)
    return model_inputs


# ---- raw text pairs from files or the Hub (used by hf_seqrl.pipeline and the recipes) --------------------------

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
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"{path}: row {i} has an empty or non-string {source_column!r}.")
        sources.append(source)
    return sources, normalize_references(list(dataset[target_column]), field_name=f"{path}: {target_column}")


def select_pair_columns(dataset, source_column: str | None = None, target_column: str | None = None,
                        source_lang: str | None = None, target_lang: str | None = None, where: str = "dataset"):
    """Returns `dataset` reduced to two columns, `source` and `target`.

    The pair is taken from `source_column` / `target_column` when given; else, when `source_lang` and
    `target_lang` are given and there is a `translation` column of dicts (wmt16, opus), from its entries; else
    from the columns named `source_lang` / `target_lang`; else from `source` / `target`. Raises an error naming
    the missing column and listing the available ones.
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
                f"--{role}_column to one of them"
                + (" (or source_lang / target_lang for a 'translation' column)." if role == "source" else ".")
            )
    source, target = wanted["source"], wanted["target"]
    return dataset.map(lambda batch: {"source": batch[source], "target": batch[target]}, batched=True,
                       remove_columns=columns, desc=f"{where}: select columns")


def drop_empty_pairs(dataset, where: str = "dataset"):
    """Returns `dataset` (columns `source`, `target`) without empty references in lists of references, and without
    the rows whose source or every reference is empty."""

    def nonempty(text) -> bool:
        return isinstance(text, str) and bool(text.strip())

    def keep(batch) -> list[bool]:
        return [nonempty(source) and any(map(nonempty, [target] if isinstance(target, str) else target or []))
                for source, target in zip(batch["source"], batch["target"])]

    dataset = dataset.filter(keep, batched=True, desc=f"{where}: drop empty pairs")
    if len(dataset) and isinstance(dataset[0]["target"], list):
        dataset = dataset.map(lambda batch: {"target": [[r for r in refs if nonempty(r)] for refs in batch["target"]]},
                              batched=True, desc=f"{where}: drop empty references")
    return dataset


# ---- decoder-only models: prompt + completion in one row, the loss on the completion only ----------------------

def render_prompt(prompt, tokenizer) -> str:
    """Returns the text a causal model reads before its completion: `prompt` as is, or, for a conversation (a list
    of `{"role", "content"}` messages), the tokenizer's chat template with the generation prompt added."""
    if isinstance(prompt, str):
        return prompt
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("A conversational prompt (a list of messages) needs a tokenizer with a chat_template; give "
                         "plain-text prompts or set tokenizer.chat_template.")
    return tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)


def _message_text(value) -> str:
    """Returns the text of a completion or reference: a string, or the content of the last of a list of messages."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and value and isinstance(value[-1], dict):
        return str(value[-1].get("content", ""))
    raise ValueError(f"Expected a string or a list of messages, got {type(value).__name__}.")


def prompt_token_ids(prompt, tokenizer, max_length: int | None = None) -> list[int]:
    """Returns the token ids of a prompt (text or messages, see `render_prompt`), cut from the left to `max_length`.

    A chat template writes its own special tokens; plain text gets the tokenizer's (a BOS), less a final EOS (ByT5
    and T5 tokenizers append one), since the completion follows.
    """
    ids = tokenizer(render_prompt(prompt, tokenizer), add_special_tokens=isinstance(prompt, str))["input_ids"]
    if ids and ids[-1] == tokenizer.eos_token_id:
        ids = ids[:-1]
    return ids[-max_length:] if max_length is not None else ids


def completion_token_ids(text: str, tokenizer, max_length: int | None = None) -> list[int]:
    """Returns the token ids of a completion followed by EOS, cut from the right to `max_length` (EOS kept)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if max_length is not None:
        ids = ids[: max_length - 1]
    return ids + [tokenizer.eos_token_id]


def tokenize_prompt_completion(
    examples: dict[str, list],
    tokenizer,
    prompt_column: str = "prompt",
    completion_column: str = "completion",
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
    prompt_template: str | None = None,
    use_chat_template: bool = False,
) -> dict[str, list]:
    """Returns causal-LM features (batched map): `input_ids` = prompt + completion + EOS, `attention_mask`, `labels`
    (-100 on the prompt, the completion and its EOS otherwise), and raw `references` / `sources`.

    The prompt of a row is what precedes its first label (`hf_seqrl.models.causal.split_prompts` reads it back for
    rollouts), so no other column is needed. A prompt is plain text or a list of chat messages (rendered with the
    tokenizer's chat template and its generation prompt); `prompt_template` (with a `{prompt}` field) formats plain
    prompts first, and `use_chat_template` then wraps the result as one user message. A completion cell may be a
    string, a list of messages (the last one's content), or a list of references: the first one is the training
    target, all of them are the rewards' references. Prompts are cut from the left to `max_prompt_length` tokens (the
    end of a prompt says what to write), completions from the right to `max_completion_length` (EOS kept).
    """
    prompts, targets = examples[prompt_column], examples[completion_column]
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenize_prompt_completion needs a tokenizer with an eos_token: completions end with it.")
    features = {"input_ids": [], "attention_mask": [], "labels": [], "references": [], "sources": []}
    for i, (prompt, target) in enumerate(zip(prompts, targets)):
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError(f"Row {i} of this batch has an empty {prompt_column!r}: drop or fix it.")
            source = prompt
            prompt = prompt_template.format(prompt=prompt) if prompt_template else prompt
            if use_chat_template:
                prompt = [{"role": "user", "content": prompt}]
        else:
            source = _message_text([m for m in prompt if m.get("role") == "user"] or prompt)
        is_list_of_refs = isinstance(target, (list, tuple)) and target and isinstance(target[0], str)
        references = [_message_text(t) for t in target] if is_list_of_refs else [_message_text(target)]
        if not references[0].strip():
            raise ValueError(f"Row {i} of this batch has an empty {completion_column!r}: drop or fix it.")
        prompt_ids = prompt_token_ids(prompt, tokenizer, max_prompt_length)
        completion_ids = completion_token_ids(references[0], tokenizer, max_completion_length)
        features["input_ids"].append(prompt_ids + completion_ids)
        features["attention_mask"].append([1] * (len(prompt_ids) + len(completion_ids)))
        features["labels"].append([-100] * len(prompt_ids) + completion_ids)
        features["references"].append(references)
        features["sources"].append(source)
    return features


# ---- by model family: what `hf_seqrl.models` families read -----------------------------------------------------

def tokenize_for(examples: dict[str, list], family, tokenizer, source_column: str, target_column: str,
                 max_source_length: int | None = None, max_target_length: int | None = None, prefix: str = "",
                 decoder_start_token_id: int | None = None, prompt_template: str | None = None,
                 use_chat_template: bool = False) -> dict[str, list]:
    """Returns the tokenized features of source/target pairs for a model of `family` (a `datasets.map(batched=True)`
    function): `tokenize_pairs` for encoder-decoder models, `tokenize_prompt_completion` for decoder-only ones."""
    if family.name == "seq2seq":
        if prompt_template is not None or use_chat_template:
            raise ValueError("prompt_template and use_chat_template shape the prompts of decoder-only models; an "
                             "encoder-decoder model reads the source itself (source_prefix adds a task prefix).")
        return tokenize_pairs(examples, tokenizer, source_column, target_column, max_source_length,
                              max_target_length, prefix, decoder_start_token_id)
    if prefix and prompt_template is None:
        prompt_template = prefix + "{prompt}"
    return tokenize_prompt_completion(examples, tokenizer, source_column, target_column, max_source_length,
                                      max_target_length, prompt_template, use_chat_template)


def tokenize_sources(family, tokenizer, sources, max_length: int | None = None) -> dict:
    """Returns the padded `input_ids` / `attention_mask` tensors `(B, S)` of source or prompt texts (prompts
    left-padded, as decoder-only models continue them)."""
    import torch

    if family.name == "seq2seq":
        enc = tokenizer(list(sources), return_tensors="pt", padding=True, truncation=max_length is not None,
                        max_length=max_length)
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    rows = [prompt_token_ids(source, tokenizer, max_length) for source in sources]
    width = max(len(row) for row in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return {"input_ids": torch.tensor([[pad] * (width - len(row)) + row for row in rows]),
            "attention_mask": torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])}


def tokenize_targets(family, model, tokenizer, texts, max_length: int | None = None) -> list[list[int]]:
    """Returns the target token ids of reference texts, EOS included, as a model of `family` writes them."""
    if family.name == "seq2seq":
        ids = tokenizer(text_target=list(texts), truncation=max_length is not None, max_length=max_length)["input_ids"]
        return strip_start_token(ids, decoder_start_id(model))
    return [completion_token_ids(text, tokenizer, max_length) for text in texts]


def check_causal_rows(dataset, name: str) -> None:
    """Raises a clear error naming a row of a `datasets.Dataset` a decoder-only model cannot train on."""
    columns = getattr(dataset, "column_names", None)
    if not isinstance(columns, list) or "labels" not in columns or not hasattr(dataset, "iter"):
        return
    offset = 0
    for batch in dataset.select_columns(["input_ids", "labels"]).iter(batch_size=1000):
        for i, (ids, labels) in enumerate(zip(batch["input_ids"], batch["labels"])):
            if len(ids) != len(labels):
                raise ValueError(
                    f"{name} row {offset + i}: a causal LM reads 'labels' aligned with 'input_ids' (prompt + "
                    f"completion, -100 on the prompt), but they have {len(labels)} and {len(ids)} tokens. Build the "
                    "rows with hf_seqrl.data.tokenize_prompt_completion.")
            if labels and labels[0] != -100:
                raise ValueError(f"{name} row {offset + i}: its first token is already a label, so it has no "
                                 "prompt to sample from: set labels to -100 on the prompt tokens.")
        offset += len(batch["labels"])


def check_dataset_columns(dataset, name: str, family=None) -> None:
    """Raises a clear error if a `datasets.Dataset` has neither `labels` nor `references`, no `input_ids`, a
    column named like a reward keyword (`predictions`), or rows the model family cannot read (a causal row's labels
    must align with its input_ids and leave a prompt)."""
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
    if "labels" not in columns and "references" not in columns:
        raise ValueError(
            f"{name} has neither 'labels' nor 'references' (columns: {columns}): rewards need references. "
            "Add tokenized 'labels' (tokenizer(text_target=...)) or a 'references' text column."
        )
    if family is not None and family.name == "causal":
        check_causal_rows(dataset, name)


# ---- text datasets as TRL's trainers take them: tokenized when a trainer is built ------------------------------

SOURCE_COLUMNS, TARGET_COLUMNS = ("source", "prompt"), ("target", "completion")


def _pick(columns: list[str], given: str | None, defaults: tuple[str, ...]) -> str | None:
    if given is not None:
        return given if given in columns else None
    return next((name for name in defaults if name in columns), None)


def tokenize_text_dataset(dataset, name: str, family, tokenizer, args, decoder_start_token_id: int | None = None):
    """Returns `dataset` tokenized for a model of `family` when it holds text columns instead of `input_ids`
    (one `datasets.map`, cached as `datasets` caches maps); tokenized datasets and other iterables are returned as
    they are.

    Encoder-decoder models read a source column (`args.source_column`; default `source`, else `prompt`) and a
    target column (`args.target_column`; default `target`, else `completion`), decoder-only models the same pair
    as prompt → completion (text or chat messages). The target may be left out when a `references` column gives
    the rewards' references (RL without cross-entropy). Every other column stays and reaches the rewards; a
    `references` column of the dataset is kept over the target's.
    """
    columns = getattr(dataset, "column_names", None)
    if not isinstance(columns, list) or "input_ids" in columns:
        return dataset
    source = _pick(columns, getattr(args, "source_column", None), SOURCE_COLUMNS)
    target = _pick(columns, getattr(args, "target_column", None), TARGET_COLUMNS)
    if source is None or (target is None and "references" not in columns):
        raise ValueError(
            f"{name} has no tokenized 'input_ids' and no text columns to tokenize (columns: {columns}): give "
            "'source' and 'target' columns (encoder-decoder models; other names through source_column / "
            "target_column) or 'prompt' and 'completion' (decoder-only models, as TRL takes them); 'references' may "
            "stand in for the target. Or tokenize yourself with hf_seqrl.data.tokenize_pairs / "
            "tokenize_prompt_completion.")
    causal = family.name == "causal"
    limits = ((getattr(args, "max_prompt_length", None), getattr(args, "max_completion_length", None)) if causal
              else (getattr(args, "max_source_length", None), getattr(args, "max_target_length", None)))
    keep_references = "references" in columns

    def tokenize(batch):
        if target is None:  # prompts / sources only: the rewards read `references`
            out = {"sources": [source_text(value) for value in batch[source]]}
            if causal:
                ids = [prompt_token_ids(value, tokenizer, limits[0]) for value in batch[source]]
                out.update(input_ids=ids, attention_mask=[[1] * len(row) for row in ids])
            else:
                enc = tokenizer(list(batch[source]), max_length=limits[0], truncation=limits[0] is not None)
                out.update(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
            return out
        out = tokenize_for(batch, family, tokenizer, source, target, limits[0], limits[1],
                           decoder_start_token_id=decoder_start_token_id)
        if keep_references:
            out.pop("references", None)
        return dict(out)

    used = [c for c in (source, target) if c is not None and c not in ("references", "sources")]
    return dataset.map(tokenize, batched=True, remove_columns=used, desc=f"{name}: tokenize")


def source_text(value) -> str:
    """Returns the text of a source or prompt cell: a string, or the user turns of a list of chat messages."""
    if isinstance(value, str):
        return value
    return _message_text([m for m in value if m.get("role") == "user"] or value)
