"""Text → token features for both model families: source/target pairs for encoder-decoder models, prompt +
completion rows for decoder-only ones, and text datasets tokenized when a trainer is built (as TRL takes them)."""

from __future__ import annotations

from ..models.tokens import decoder_start_id, pad_columns
from .checks import check_text_column, has_text, missing_targets_message, normalize_references

# The column `count_cut=True` adds to the tokenized rows: [source cut, target cut]; `report_cut` counts and removes it.
CUT_COLUMN = "cut_to_max_length"

# ---- encoder-decoder models: source → input_ids, target → labels ----------------------------------------------


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
    count_cut: bool = False,
) -> dict[str, list]:
    """Returns tokenized `input_ids`, `attention_mask`, `labels` and raw `references` / `sources` (batched map); with
    `count_cut`, also `CUT_COLUMN`: per row, whether truncation cut its source and its target (`report_cut`).

    A target cell may hold one string or a list of references; the first reference is the training label,
    all of them are kept as rewards' references. With `decoder_start_token_id`, labels lose a leading copy of
    that token (`strip_start_token`).
    """
    sources = examples[source_column]
    for i, src in enumerate(sources):
        if not has_text(src):
            raise ValueError(f"Row {i} of this batch has an empty or non-string {source_column!r}: drop or fix it.")
    # Raises on an empty target too: every reference of a row must have text.
    references = normalize_references(examples[target_column], field_name=target_column)
    texts = [prefix + s for s in sources]
    model_inputs = tokenizer(texts, max_length=max_source_length, truncation=True)
    targets = [refs[0] for refs in references]
    labels = tokenizer(text_target=targets, max_length=max_target_length, truncation=True)
    model_inputs["labels"] = strip_start_token(labels["input_ids"], decoder_start_token_id)
    model_inputs["references"] = references
    model_inputs["sources"] = list(sources)
    if count_cut:
        source_cut = was_cut(tokenizer, texts, model_inputs["input_ids"], max_source_length)
        target_cut = was_cut(tokenizer, targets, labels["input_ids"], max_target_length, target=True)
        model_inputs[CUT_COLUMN] = [[s, t] for s, t in zip(source_cut, target_cut)]
    return model_inputs


def was_cut(tokenizer, texts: list[str], ids: list[list[int]], max_length: int | None, target: bool = False):
    """Returns, per text, whether truncation to `max_length` cut it: only the rows that came out at the limit are
    tokenized again, whole."""
    cut = [False] * len(texts)
    if max_length is None:
        return cut
    at_limit = [i for i, row in enumerate(ids) if len(row) >= max_length]
    if at_limit:
        whole = [texts[i] for i in at_limit]
        lengths = tokenizer(text_target=whole)["input_ids"] if target else tokenizer(whole)["input_ids"]
        for i, row in zip(at_limit, lengths):
            cut[i] = len(row) > max_length
    return cut


def report_cut(dataset, name: str, limits: tuple[int | None, int | None], roles=("source", "target")):
    """Returns `dataset` without its `CUT_COLUMN`, after a warning that counts the rows whose source and target were
    cut to `limits` (nothing is said when none was)."""
    if CUT_COLUMN not in (getattr(dataset, "column_names", None) or []):
        return dataset
    flags = dataset[CUT_COLUMN]
    counts = [sum(bool(row[k]) for row in flags) for k in range(2)]
    parts = [f"{count} of {len(flags)} {role}s cut to {limit} tokens"
             for count, role, limit in zip(counts, roles, limits) if count]
    if parts:
        import warnings

        warnings.warn(f"{name}: {' and '.join(parts)} (max_{roles[0]}_length / max_{roles[1]}_length; raise them to "
                      "keep more).", stacklevel=2)
    return dataset.remove_columns(CUT_COLUMN)


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


def source_text(value) -> str:
    """Returns the text of a source or prompt cell: a string, or the user turns of a list of chat messages."""
    if isinstance(value, str):
        return value
    return _message_text([m for m in value if m.get("role") == "user"] or value)


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
    count_cut: bool = False,
) -> dict[str, list]:
    """Returns causal-LM features (batched map; `count_cut` as in `tokenize_pairs`): `input_ids` = prompt +
    completion + EOS, `attention_mask`, `labels`
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
    if count_cut:
        features[CUT_COLUMN] = []
    for i, (prompt, target) in enumerate(zip(prompts, targets)):
        source = source_text(prompt)
        if isinstance(prompt, str):
            if not has_text(prompt):
                raise ValueError(f"Row {i} of this batch has an empty {prompt_column!r}: drop or fix it.")
            prompt = prompt_template.format(prompt=prompt) if prompt_template else prompt
            if use_chat_template:
                prompt = [{"role": "user", "content": prompt}]
        is_list_of_refs = isinstance(target, (list, tuple)) and target and isinstance(target[0], str)
        references = [_message_text(t) for t in target] if is_list_of_refs else [_message_text(target)]
        if not has_text(references[0]):
            raise ValueError(f"Row {i} of this batch has an empty {completion_column!r}: drop or fix it.")
        prompt_ids = prompt_token_ids(prompt, tokenizer, max_prompt_length)
        completion_ids = completion_token_ids(references[0], tokenizer, max_completion_length)
        if count_cut:  # only a part that came out at its limit is tokenized again, whole
            features[CUT_COLUMN].append([
                len(prompt_ids) == max_prompt_length and len(prompt_token_ids(prompt, tokenizer)) > len(prompt_ids),
                len(completion_ids) == max_completion_length
                and len(completion_token_ids(references[0], tokenizer)) > len(completion_ids)])
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
                 use_chat_template: bool = False, count_cut: bool = False) -> dict[str, list]:
    """Returns the tokenized features of source/target pairs for a model of `family` (a `datasets.map(batched=True)`
    function): `tokenize_pairs` for encoder-decoder models, `tokenize_prompt_completion` for decoder-only ones."""
    if family.name == "seq2seq":
        if prompt_template is not None or use_chat_template:
            raise ValueError("prompt_template and use_chat_template shape the prompts of decoder-only models; an "
                             "encoder-decoder model reads the source itself (source_prefix adds a task prefix).")
        return tokenize_pairs(examples, tokenizer, source_column, target_column, max_source_length,
                              max_target_length, prefix, decoder_start_token_id, count_cut)
    if prefix and prompt_template is None:
        prompt_template = prefix + "{prompt}"
    return tokenize_prompt_completion(examples, tokenizer, source_column, target_column, max_source_length,
                                      max_target_length, prompt_template, use_chat_template, count_cut)


def check_sources_have_text(sources, rows, column: str, name: str, causal: bool) -> None:
    """Raises a ValueError naming the `rows` (of the dataset `name`) whose source or prompt in `column` is empty."""
    empty = [row for row, value in zip(rows, sources) if not has_text(source_text(value))]
    if empty:
        raise ValueError(f"{name} rows {empty}: the {column!r} text is empty, so there is nothing to "
                         f"{'prompt' if causal else 'translate or summarize'}. Drop or fix those rows.")


def tokenize_source_rows(examples: dict[str, list], family, tokenizer, source_column: str,
                         max_source_length: int | None = None, prefix: str = "", prompt_template: str | None = None,
                         use_chat_template: bool = False, rows=None, name: str = "dataset") -> dict[str, list]:
    """Returns the features of rows of sources or prompts alone, with no target (a `datasets.map(batched=True)`
    function): `input_ids`, `attention_mask` and the raw `sources`, each source read as `tokenize_for` reads it
    (`prefix` before an encoder-decoder's source; a decoder-only prompt shaped by `prompt_template` /
    `use_chat_template` and cut from the left). Raises naming the `rows` (of the dataset `name`) whose source is
    empty or whose prompt tokenizes to nothing."""
    sources = list(examples[source_column])
    rows = range(len(sources)) if rows is None else rows
    check_sources_have_text(sources, rows, source_column, name, family.name == "causal")
    if family.name == "seq2seq":
        if prompt_template is not None or use_chat_template:
            raise ValueError("prompt_template and use_chat_template shape the prompts of decoder-only models; an "
                             "encoder-decoder model reads the source itself (source_prefix adds a task prefix).")
        enc = tokenizer([prefix + text for text in sources], max_length=max_source_length,
                        truncation=max_source_length is not None)
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "sources": sources}
    template = prompt_template or (prefix + "{prompt}" if prefix else None)
    ids = []
    for prompt in sources:
        if isinstance(prompt, str):
            prompt = template.format(prompt=prompt) if template else prompt
            prompt = [{"role": "user", "content": prompt}] if use_chat_template else prompt
        ids.append(prompt_token_ids(prompt, tokenizer, max_source_length))
    nothing = [row for row, prompt in zip(rows, ids) if not prompt]
    if nothing:
        raise ValueError(f"{name} rows {nothing}: the prompt tokenizes to no token at all, so there is nothing to "
                         "sample from. Drop or fix those rows.")
    return {"input_ids": ids, "attention_mask": [[1] * len(row) for row in ids],
            "sources": [source_text(prompt) for prompt in sources]}


def tokenize_sources(family, tokenizer, sources, max_length: int | None = None) -> dict:
    """Returns the padded `input_ids` / `attention_mask` tensors `(B, S)` of source or prompt texts (prompts
    left-padded, as decoder-only models continue them)."""
    import torch

    if family.name == "seq2seq":
        enc = tokenizer(list(sources), return_tensors="pt", padding=True, truncation=max_length is not None,
                        max_length=max_length)
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    rows = [torch.tensor([prompt_token_ids(source, tokenizer, max_length)], dtype=torch.long) for source in sources]
    width = max(row.shape[1] for row in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return {"input_ids": torch.cat([pad_columns(row, width, pad, "left") for row in rows]),
            "attention_mask": torch.cat([pad_columns(torch.ones_like(row), width, 0, "left") for row in rows])}


def tokenize_targets(family, model, tokenizer, texts, max_length: int | None = None) -> list[list[int]]:
    """Returns the target token ids of reference texts, EOS included, as a model of `family` writes them."""
    if family.name == "seq2seq":
        ids = tokenizer(text_target=list(texts), truncation=max_length is not None, max_length=max_length)["input_ids"]
        return strip_start_token(ids, decoder_start_id(model))
    return [completion_token_ids(text, tokenizer, max_length) for text in texts]


# ---- text datasets as TRL's trainers take them: tokenized when a trainer is built ------------------------------

SOURCE_COLUMNS, TARGET_COLUMNS = ("source", "prompt"), ("target", "completion")


def _pick(columns: list[str], given: str | None, defaults: tuple[str, ...]) -> str | None:
    """Returns `given` when it is a column (None when it is not), else the first of `defaults` that is one."""
    if given is not None:
        return given if given in columns else None
    return next((name for name in defaults if name in columns), None)


def check_target_column(columns: list[str], name: str, args, field_name: str, evaluation: bool) -> None:
    """Raises a ValueError when `args.<field_name>` (`target_column` or `eval_target_column`) names a column that the
    dataset `name` (an `evaluation` split or the train split) lacks, naming the field that fixes it: an evaluation
    split read through `target_column` takes its own column through `eval_target_column`, which leaves the train
    split's alone."""
    given = getattr(args, field_name, None)
    if given is None or given in columns:
        return
    if evaluation and field_name == "target_column":
        fix = (f"set eval_target_column to the column of its targets (e.g. the gold references when training on a "
               f"teacher's outputs); target_column={given!r} stays the train split's")
    else:
        fix = f"set {field_name} to one of them" + (" (eval_target_column names the evaluation splits')"
                                                    if not evaluation else "")
    raise ValueError(f"{name} has no column {given!r} ({type(args).__name__}.{field_name}; its columns: {columns}): "
                     f"{fix}.")


def check_source_column(columns: list[str], name: str, args) -> None:
    """Raises a ValueError naming `args.source_column`, the columns of the dataset `name` and the closest of them,
    when that column is not one of `columns`."""
    import difflib

    given = args.source_column
    if given in columns:
        return
    close = difflib.get_close_matches(given, columns, n=1)
    raise ValueError(f"{name} has no column {given!r} ({type(args).__name__}.source_column; its columns: {columns}): "
                     f"set source_column to the column of its sources or prompts"
                     f"{f' (did you mean {close[0]!r}?)' if close else ''}.")


def tokenize_text_dataset(dataset, name: str, family, tokenizer, args, decoder_start_token_id: int | None = None,
                          evaluation: bool = False, target_reasons: list[str] | None = None):
    """Returns `dataset` tokenized for a model of `family` when it holds text columns instead of `input_ids`
    (one `datasets.map`, cached as `datasets` caches maps; an `IterableDataset` is tokenized on the fly as its rows
    are read); tokenized datasets and other iterables are returned as they are.

    Encoder-decoder models read a source column (`args.source_column`; default `source`, else `prompt`) and a
    target column (`args.target_column`; default `target`, else `completion`), decoder-only models the same pair
    as prompt → completion (text or chat messages); an `evaluation` split reads `args.eval_target_column` when set
    (the gold references of a model trained on a teacher's outputs). The target may be left out when a `references`
    column gives the rewards' references (RL without cross-entropy), and when `target_reasons` is an empty list (no
    setting of the run reads a target: `hf_seqrl.trainers.services.references`): the rows then hold the sources alone. With
    reasons, a dataset without targets is refused naming them; `None` needs targets whatever the settings. Every other
    column stays and reaches the rewards; a `references` column of the dataset is kept over the target's.
    """
    from datasets import IterableDataset

    streamed = isinstance(dataset, IterableDataset)
    columns = getattr(dataset, "column_names", None)
    if streamed and columns is None:  # features unknown until read: the first row names the columns
        columns = list(next(iter(dataset)).keys())
    if not isinstance(columns, list) or "input_ids" in columns:
        return dataset
    target_field = "eval_target_column" if evaluation and getattr(args, "eval_target_column", None) else "target_column"
    source = _pick(columns, getattr(args, "source_column", None), SOURCE_COLUMNS)
    target = _pick(columns, getattr(args, target_field, None), TARGET_COLUMNS)
    if source is None and getattr(args, "source_column", None) is not None:
        check_source_column(columns, name, args)
    untargeted = target is None and "references" not in columns  # sources alone
    if source is not None and untargeted:
        check_target_column(columns, name, args, target_field, evaluation)
        if target_reasons:
            raise ValueError(missing_targets_message(name, columns, target_reasons))
    if source is None or (untargeted and target_reasons is None):
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

    def tokenize(batch, indices):
        check_text_column(batch[source], source, "prompt" if causal else "text", name, indices)
        if target is not None:
            check_text_column(batch[target], target, "completion" if causal else "references", name, indices)
        if target is None:  # prompts / sources only: the rewards read `references`, or none
            return tokenize_source_rows(batch, family, tokenizer, source, limits[0], rows=indices, name=name)
        check_sources_have_text(batch[source], indices, source, name, causal)
        out = tokenize_for(batch, family, tokenizer, source, target, limits[0], limits[1],
                           decoder_start_token_id=decoder_start_token_id, count_cut=not streamed)
        if keep_references:
            out.pop("references", None)
        return dict(out)

    used = [c for c in (source, target) if c is not None and c not in ("references", "sources")]
    if streamed:  # tokenized on the fly, as the rows are read
        return dataset.map(tokenize, batched=True, with_indices=True, remove_columns=used)
    tokenized = dataset.map(tokenize, batched=True, with_indices=True, remove_columns=used, desc=f"{name}: tokenize")
    return report_cut(tokenized, name, limits, ("prompt", "completion") if causal else ("source", "target"))
