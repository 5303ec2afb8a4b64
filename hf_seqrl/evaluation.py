"""Generation for evaluation and corpus metrics: a model's outputs on source texts (greedy or beam search), their
corpus scores against every reference, and `build_compute_metrics` for `Seq2SeqTrainer`-style evaluation.
`hf-seqrl evaluate` (`hf_seqrl.cli.evaluate`) runs them on a checkpoint and a data file.

`corpus_scores` gives sacrebleu corpus BLEU / chrF (every reference of each source) and the mean sentence ROUGE F1,
apart from the sentence rewards of training (`hf_seqrl.rewards`); `bleu_brevity` splits a BLEU change into a length
change and a precision change. Corpus metrics are on one scale everywhere, 0-100 (`evaluate`, `diagnose` and the
trainers' `eval_*` metrics); sentence rewards (`rl/*`) stay in [0, 1].

A saved run records how it cut and generated (`write_run_settings`: `seqrl_run.json` beside the weights), so that
evaluating the folder later reproduces the trainer's own evaluation (`read_run_settings`, `run_generation_settings`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .data import has_text, normalize_references, prompt_token_ids, tokenize_sources
from .models import family_for
from .models.base import eval_mode
from .models.languages import decode_texts
from .rewards import BUILTIN_REWARDS
from .rewards.convention import is_evaluation_module, is_number
from .rewards.modules import accepts_reference_lists


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


def empty_source_rows(family, tokenizer, sources: Sequence, max_source_length: int | None = None) -> list[int]:
    """Returns the indices of the sources that are blank or tokenize to no token at all (a decoder-only model would
    then continue nothing: `generate` fails on an empty prompt, or reads a row of padding)."""
    blank = {i for i, source in enumerate(sources) if isinstance(source, str) and not has_text(source)}
    if family.name == "causal":
        lengths = [len(prompt_token_ids(source, tokenizer, max_source_length)) for source in sources]
    else:
        lengths = [len(ids) for ids in tokenizer([str(s) for s in sources])["input_ids"]] if sources else []
    return sorted(blank | {i for i, length in enumerate(lengths) if length == 0})


def check_sources(family, tokenizer, sources: Sequence, max_source_length: int | None = None) -> None:
    """Raises a ValueError naming the rows (0-based, in the order given) whose source is blank or tokenizes to
    nothing (`empty_source_rows`)."""
    empty = empty_source_rows(family, tokenizer, sources, max_source_length)
    if empty:
        shown = ", ".join(map(str, empty[:20])) + (f" and {len(empty) - 20} more" if len(empty) > 20 else "")
        what = "prompts" if family.name == "causal" else "sources"
        raise ValueError(f"{len(empty)} of {len(sources)} {what} tokenize to no token with this tokenizer "
                         f"({type(tokenizer).__name__}; rows {shown}, counted from 0): drop or fix those rows, or use "
                         "the tokenizer the model was trained with.")


def generate_texts(model, tokenizer, sources: Sequence, *, num_beams: int = 1, batch_size: int = 32,
                   max_new_tokens: int | None = None, max_length: int | None = None,
                   max_source_length: int | None = None, progress: bool = True, desc: str = "generate",
                   decode: str = "beam", **selection: Any) -> list[str]:
    """Returns the model's decoded output for each source, in order (greedy when `num_beams` is 1).

    `decode="mbr"` or `"qe"` decodes candidates and picks one per source instead (`hf_seqrl.candidates`; docs/mbr.md):
    `selection` holds `candidates`, `num_candidates`, `utility`, `qe_reward`, `epsilon_cutoff`, `seed`
    (`SelectionDecoding`).

    Sources are batched by length (less padding); the model's own generation config applies otherwise (its
    `max_new_tokens` when not given), except that decoding always uses the KV cache (see
    `models.seq2seq.rollout_generation_config`). `max_length` is read as the trainers read `generation_max_length`
    (the decoder's length for encoder-decoder models, completion tokens for decoder-only ones); `max_new_tokens`
    wins over it. A source is text, or for decoder-only models a list of chat messages. Sources that tokenize to
    nothing are refused with their rows named (`check_sources`). The model is left in its original train/eval mode.
    """
    from tqdm.auto import tqdm

    family = family_for(model)
    if num_beams < 1 or batch_size < 1:
        raise ValueError(f"num_beams and batch_size must be >= 1, got {num_beams} and {batch_size}.")
    check_sources(family, tokenizer, sources, max_source_length)
    if decode != "beam" or selection:
        from .candidates import SelectionDecoding, selected_texts

        if num_beams != 1:
            raise ValueError(f"num_beams={num_beams} with decode={decode!r}: the candidates are decoded as "
                             "`candidates` says (the beam's n-best: num_candidates wide); leave num_beams 1.")
        return selected_texts(model, tokenizer, sources, SelectionDecoding(decode, **selection), batch_size=batch_size,
                              progress=progress, desc=desc, max_new_tokens=max_new_tokens, max_length=max_length,
                              max_source_length=max_source_length)
    order = sorted(range(len(sources)), key=lambda i: len(str(sources[i])))
    outputs = [""] * len(sources)
    kwargs = {"num_beams": num_beams, "do_sample": False, "use_cache": True}
    if max_new_tokens is not None:
        kwargs["max_new_tokens"] = max_new_tokens
    elif max_length is not None:
        kwargs["max_length"] = max_length
    with eval_mode(model), torch.no_grad():
        for start in tqdm(range(0, len(order), batch_size), desc=desc, leave=False, disable=not progress):
            rows = order[start:start + batch_size]
            batch = tokenize_sources(family, tokenizer, [sources[i] for i in rows], max_source_length)
            ids = family.generate(model, {k: v.to(model.device) for k, v in batch.items()}, **kwargs)
            for i, text in zip(rows, decode_texts(tokenizer, ids)):
                outputs[i] = text.strip()
    return outputs


def write_teacher_outputs(model, tokenizer, rows: Sequence[dict], source_column: str, output: str, *,
                          output_column: str = "teacher_target", num_beams: int = 4, batch_size: int = 32,
                          chunk: int = 256, progress: bool = True, overwrite: bool = False, **generate_kwargs) -> int:
    """Writes `model`'s decodes of the rows' sources (beam search: sequence-level knowledge distillation's data, Kim &
    Rush, 2016) to the JSON lines file `output`, one line per row: every column of the row as it is, and the decode
    in `output_column`. Returns how many rows this call wrote.

    Resumable: a file already holding the first `K` rows (their sources checked against `rows`) is continued from
    row `K`; rows are decoded and appended `chunk` at a time, so an interrupted run keeps what it wrote. The decode's
    settings (`teacher_output_settings`) are recorded beside the file, in `output + ".settings.json"`, before its
    first row, and a file written with other settings is refused naming each one that differs: one file holds one
    kind of target. `overwrite=True` discards the file and decodes every row again. `generate_kwargs` go to
    `generate_texts` (`max_new_tokens`, `max_length`, `max_source_length`; `decode="mbr"` or `"qe"` with its
    `candidates`, `num_candidates`, `utility`, `qe_reward`, `epsilon_cutoff`, `seed`: MBR / QE fine-tuning's data,
    docs/mbr.md).
    Under MBR / QE the candidates of the rows from `start` on are drawn with seed `seed + start` (`start` a multiple of
    `chunk`), so a continued file holds what one uninterrupted run writes."""
    from tqdm.auto import tqdm

    sources = [" ".join(map(str, s)) if isinstance(s, list) else s for s in (row[source_column] for row in rows)]
    lengths = ("max_new_tokens", "max_length", "max_source_length")
    selection = {name: value for name, value in generate_kwargs.items() if name not in lengths}
    settings = teacher_output_settings(model, tokenizer, source_column, output_column, num_beams, **{
        name: generate_kwargs.get(name) for name in lengths}, selection=selection)
    done = 0 if overwrite else _rows_to_continue(output, settings, rows, source_column, output_column)
    if done == 0:
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        _write_json(output + TEACHER_SETTINGS_SUFFIX, settings)
    if settings["selection"] and done < len(rows):  # a reward by name loaded once, not once per chunk
        from .candidates import SelectionDecoding, with_reward_built

        built = with_reward_built(SelectionDecoding(**selection), model.device)
        generate_kwargs = {**generate_kwargs, "utility": built.utility, "qe_reward": built.qe_reward}
    with open(output, "a" if done else "w", encoding="utf-8") as f, \
            tqdm(total=len(rows), initial=done, desc="teacher outputs", disable=not progress) as bar:
        for start in range(done, len(rows), chunk):
            stop = min(start + chunk, len(rows))
            seeded = {"seed": selection.get("seed", 0) + start} if settings["selection"] else {}
            decoded = generate_texts(model, tokenizer, sources[start:stop], num_beams=num_beams, batch_size=batch_size,
                                     progress=False, **{**generate_kwargs, **seeded})
            for row, text in zip(rows[start:stop], decoded):
                f.write(json.dumps({**row, output_column: text}, ensure_ascii=False) + "\n")
            f.flush()
            bar.update(stop - start)
    return len(rows) - done


# Beside the teacher's decodes (`output + TEACHER_SETTINGS_SUFFIX`): the settings they were decoded with.
TEACHER_SETTINGS_SUFFIX = ".settings.json"
_RESTART = "pass overwrite=True (`hf-seqrl distill-data --overwrite`) to decode every row again"


def teacher_output_settings(model, tokenizer, source_column: str, output_column: str, num_beams: int,
                            max_new_tokens: int | None = None, max_length: int | None = None,
                            max_source_length: int | None = None, selection: dict | None = None) -> dict[str, Any]:
    """Returns what decides `write_teacher_outputs`' decodes besides the sources, as JSON data: the columns, the beam
    width and length limits, the teacher (`teacher`: its name or folder, recorded but not compared; `teacher_weights`:
    `weights_fingerprint`; `teacher_dtype`), the tokenizer's language codes (`src_lang`, `tgt_lang`), the
    teacher's generation config where it differs from transformers' defaults (its `forced_bos_token_id`, length
    penalty, ...) and `selection`: None for greedy or beam search, else the MBR / QE settings
    (`SelectionDecoding.record`: decode, candidates, utility or QE reward by name, epsilon, seed)."""
    name = getattr(model, "name_or_path", "") or ""
    generation = {key: value for key, value in model.generation_config.to_diff_dict().items()
                  if not key.startswith("_") and key != "transformers_version"}
    settings = {"source_column": source_column, "output_column": output_column, "num_beams": num_beams,
                "max_new_tokens": max_new_tokens, "max_length": max_length, "max_source_length": max_source_length,
                "teacher": os.path.abspath(name) if os.path.isdir(name) else name,
                "teacher_weights": weights_fingerprint(model), "teacher_dtype": str(model.dtype).replace("torch.", ""),
                "src_lang": getattr(tokenizer, "src_lang", None), "tgt_lang": getattr(tokenizer, "tgt_lang", None),
                "generation_config": generation, "selection": None}
    if selection and selection != {"decode": "beam"}:  # MBR / QE settings without decode="mbr" | "qe" are refused
        from .candidates import SelectionDecoding

        settings["selection"] = SelectionDecoding(**{"decode": "beam", **selection}).record()
    return json.loads(json.dumps(settings, default=str))  # as the file reads back (tuples as lists)


def weights_fingerprint(model, values_per_tensor: int = 64) -> str:
    """Returns 16 hex digits of a SHA-256 over every parameter's name, shape and `values_per_tensor` values spread
    along it: the same weights give the same digits on any device; retrained ones, other ones."""
    import hashlib

    digest, samples = hashlib.sha256(), []
    for name, weight in model.named_parameters():
        digest.update(f"{name}{tuple(weight.shape)};".encode())
        flat = weight.detach().reshape(-1)
        samples.append(flat[:: max(1, flat.numel() // values_per_tensor)][:values_per_tensor].float())
    if samples:
        digest.update(torch.cat(samples).cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def settings_changes(old: dict[str, Any], new: dict[str, Any], ignore: Sequence[str] = ()) -> list[str]:
    """Returns `"name: old → new"` for each setting that differs between two records, in `new`'s order then `old`'s
    (a nested dict's entries as `name.entry`; a missing one reads None), leaving out the names in `ignore`."""
    flat_old, flat_new = _flatten(old), _flatten(new)
    names = [*flat_new, *(name for name in flat_old if name not in flat_new)]
    return [f"{name}: {flat_old.get(name)!r} → {flat_new.get(name)!r}" for name in names
            if name not in ignore and flat_old.get(name) != flat_new.get(name)]


def _flatten(settings: dict[str, Any]) -> dict[str, Any]:
    flat = {}
    for name, value in settings.items():
        if isinstance(value, dict):
            flat.update({f"{name}.{key}": entry for key, entry in value.items()})
        else:
            flat[name] = value
    return flat


def _rows_to_continue(output: str, settings: dict[str, Any], rows: Sequence[dict], source_column: str,
                      output_column: str) -> int:
    """Returns how many rows `output` already holds (0 when it does not exist or is empty) after checking that they
    were decoded with `settings` and are the first rows of `rows`; raises a ValueError naming what differs."""
    if not os.path.exists(output):
        return 0
    with open(output, encoding="utf-8") as f:
        written = [json.loads(line) for line in f if line.strip()]
    if not written:
        return 0
    record = output + TEACHER_SETTINGS_SUFFIX
    if not os.path.exists(record):
        raise ValueError(f"{output} holds {len(written)} rows but no record of the settings they were decoded with "
                         f"({record}), so continuing it could mix two kinds of target: {_RESTART}.")
    with open(record, encoding="utf-8") as f:
        recorded = json.load(f)
    changes = settings_changes(recorded, settings, ignore=("teacher",))
    if changes:
        teachers = "" if recorded.get("teacher") == settings["teacher"] else \
            f" (teacher {recorded.get('teacher')!r} then, {settings['teacher']!r} now)"
        raise ValueError(f"{output} holds {len(written)} rows decoded with other settings{teachers}: "
                         f"{'; '.join(changes)}. Continue it with the settings of {record}, or {_RESTART}.")
    for i, line in enumerate(written):
        if i >= len(rows) or line.get(source_column) != rows[i][source_column] or output_column not in line:
            raise ValueError(f"{output} holds {len(written)} rows, and row {i} is not the decode of the data's row "
                             f"{i}: give the data it was written from, or {_RESTART}.")
    return len(written)


def _write_json(path: str, data: dict[str, Any]) -> None:
    """Writes `data` to `path` as indented JSON, atomically (through `path + ".tmp"`)."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
    os.replace(path + ".tmp", path)


def evaluate_model(model, tokenizer, sources: Sequence[str], references: Sequence[Sequence[str]],
                   metrics: Sequence[str] = ("bleu", "chrf"), **generate_kwargs) -> tuple[dict[str, float], list[str]]:
    """Returns `(scores, predictions)`: corpus scores in [0, 100] against every reference of each source
    (`corpus_scores`), and the decoded outputs. `generate_kwargs` go to `generate_texts`."""
    unknown = [m for m in metrics if m not in BUILTIN_REWARDS]
    if unknown:
        raise ValueError(f"Unknown metric(s) {', '.join(unknown)}; choose from {', '.join(BUILTIN_REWARDS)}.")
    if len(sources) != len(references):
        raise ValueError(f"Got {len(sources)} sources but {len(references)} reference rows: give one row per source.")
    predictions = generate_texts(model, tokenizer, sources, **generate_kwargs)
    return corpus_scores(predictions, [list(r) for r in references], metrics), predictions


def build_compute_metrics(tokenizer, metrics: Sequence = ("bleu", "chrf"), references: Sequence | None = None):
    """Returns a `compute_metrics` for `Seq2SeqTrainer`-style evaluation with `predict_with_generate=True`.

    Args:
        tokenizer: decodes the generated ids (and the labels when `references` is None).
        metrics (`list`): built-in names (`"bleu"`, `"chrf"`: sacrebleu corpus scores; ROUGE names: mean sentence F1;
            all in [0, 100], every reference of a source) and `evaluate.EvaluationModule`s, called once on the
            whole split; each numeric output of a module is reported as `<module name>_<output>` (just the name when
            the output carries it). A module whose `references` feature is not a sequence gets the first reference.
        references (`list[str | list[str]]`, *optional*): the split's references in dataset order (a `references`
            column keeps every reference); None scores against the decoded `labels`.

    The metrics also hold `gen_len`, the mean generated length in tokens.
    """

    for metric in metrics:
        if not (is_evaluation_module(metric) or metric in BUILTIN_REWARDS):
            raise ValueError(f"compute_metrics: unknown metric {metric!r}; use one of {', '.join(BUILTIN_REWARDS)} or "
                             "an evaluate.EvaluationModule.")
    fixed = None if references is None else normalize_references(references)
    pad = tokenizer.pad_token_id

    def compute_metrics(prediction) -> dict[str, float]:
        ids = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        ids = np.where(ids < 0, pad, ids)
        texts = [t.strip() for t in decode_texts(tokenizer, ids)]
        if fixed is None:
            labels = np.where(prediction.label_ids < 0, pad, prediction.label_ids)
            refs = [[t.strip()] for t in decode_texts(tokenizer, labels)]
        else:
            if len(texts) < len(fixed):
                raise ValueError(f"Got {len(texts)} predictions for {len(fixed)} references: evaluate the split "
                                 "whose references this compute_metrics was built with.")
            # Across processes the gather keeps the copies of the first rows that pad the last batches: the real
            # rows come first, in dataset order.
            texts, ids, refs = texts[: len(fixed)], ids[: len(fixed)], fixed
        scores = {"gen_len": float(np.mean([(row != pad).sum() for row in ids]))}
        names = [m for m in metrics if isinstance(m, str)]
        scores.update(corpus_scores(texts, refs, names))
        for module in (m for m in metrics if not isinstance(m, str)):
            module_refs = refs if accepts_reference_lists(module) else [r[0] for r in refs]
            for key, value in module.compute(predictions=texts, references=module_refs).items():
                if is_number(value):
                    scores[module.name if key == module.name else f"{module.name}_{key}"] = float(value)
        return scores

    return compute_metrics


# ---- the run's own settings, saved with the model ------------------------------------------------------------------

RUN_SETTINGS_FILE = "seqrl_run.json"
# Config fields that decide what an evaluation of the saved model reads and writes.
RUN_SETTING_FIELDS = ("task", "source_column", "target_column", "eval_target_column", "max_source_length",
                      "max_target_length", "max_prompt_length", "max_completion_length", "generation_max_length",
                      "generation_num_beams", "max_new_tokens")
# What a data pipeline may add (the trainer does not see them: they shape the text before tokenization).
PIPELINE_SETTINGS = ("source_prefix", "prompt_template", "use_chat_template")


def run_settings(args, family_name: str, extra: dict | None = None, training: dict | None = None,
                 selection: dict | None = None) -> dict[str, Any]:
    """Returns what `write_run_settings` writes: the model family, `RUN_SETTING_FIELDS` of `args` (None where `args`
    lacks one), the MBR / QE decoding of its evaluation (`selection`, a `SelectionDecoding.record`) as
    `generation_selection` when given, the `PIPELINE_SETTINGS` among `extra` that are set, and `training` when
    given."""
    settings: dict[str, Any] = {"family": family_name}
    settings.update({name: getattr(args, name, None) for name in RUN_SETTING_FIELDS})
    if selection:
        settings["generation_selection"] = selection
    settings.update({name: value for name, value in (extra or {}).items()
                     if name in PIPELINE_SETTINGS and value not in (None, "", False)})
    if training is not None:
        settings["training"] = training
    return settings


def write_run_settings(folder: str, args, family_name: str, extra: dict | None = None,
                       training: dict | None = None, selection: dict | None = None) -> str:
    """Returns the path of `folder/seqrl_run.json` after writing `run_settings(args, family_name, extra, training,
    selection)` there.

    Args:
        folder: where the model is saved (the trainers call this from `save_model`, checkpoints included).
        args: the trainer's config; its truncation (`max_source_length` ... `max_completion_length`) and generation
            (`generation_max_length`, `generation_num_beams`) fields are what its own evaluation used.
        family_name: `"seq2seq"` or `"causal"` (`hf_seqrl.models`).
        extra (`dict`, *optional*): `source_prefix`, `prompt_template`, `use_chat_template` of a pipeline that
            shaped the text before the trainer saw it (a trainer passes its `run_settings` attribute when set).
        training (`dict`, *optional*): what trained the model (`SeqRLBaseTrainer.training_record`: the trainer, the
            algorithm and method that ran, reward, baseline, teacher, steps), under `training`.
        selection (`dict`, *optional*): the MBR / QE decoding of its evaluation (`generation_selection` as the
            trainer built it, `SelectionDecoding.record`: rewards by name, the seed that applied).
    """
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, RUN_SETTINGS_FILE)
    _write_json(path, run_settings(args, family_name, extra, training, selection))
    return path


def read_run_settings(model_name_or_path: str) -> dict[str, Any]:
    """Returns the `seqrl_run.json` saved with a model (a local folder, or a Hub repo in the cache or reachable), or
    an empty dict when there is none."""
    path = os.path.join(model_name_or_path, RUN_SETTINGS_FILE)
    if not os.path.isdir(model_name_or_path):
        from transformers.utils import cached_file

        try:
            path = cached_file(model_name_or_path, RUN_SETTINGS_FILE, _raise_exceptions_for_missing_entries=False,
                               _raise_exceptions_for_connection_errors=False)
        except (OSError, ValueError):
            path = None
    if not path or not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def run_generation_settings(settings: dict[str, Any], family_name: str) -> dict[str, Any]:
    """Returns the evaluation settings that reproduce a run's own evaluation, from its `seqrl_run.json`:
    `max_source_length` (sources cut as the trainer cut them: `max_prompt_length` for decoder-only models, else
    `max_source_length`, which the `hf-seqrl train` pipeline uses for prompts too), `max_length`
    (`generation_max_length`), `num_beams` (`generation_num_beams`), `selection` (`generation_selection`: the
    keywords of `generate_texts` that decode by MBR / QE as the run's evaluation did), `task` and the pipeline's
    text settings; only those the run set."""
    source_length = settings.get("max_prompt_length") if family_name == "causal" else None
    recorded = settings.get("generation_selection")
    found = {"max_source_length": source_length or settings.get("max_source_length"),
             "max_length": settings.get("generation_max_length"), "num_beams": settings.get("generation_num_beams"),
             "selection": {k: v for k, v in recorded.items() if v is not None} if recorded else None,
             "task": settings.get("task"), **{name: settings.get(name) for name in PIPELINE_SETTINGS}}
    return {name: value for name, value in found.items() if value is not None}


def prepare_sources(sources: Sequence[str], family_name: str, source_prefix: str | None = None,
                    prompt_template: str | None = None, use_chat_template: bool = False) -> list:
    """Returns the sources as the training pipeline fed them (`hf_seqrl.data.tokenize_for`): `source_prefix` before
    each source of an encoder-decoder model; for decoder-only models `prompt_template` (or `source_prefix +
    "{prompt}"`) formatted with the source, sent as one user message when `use_chat_template`."""
    if family_name == "seq2seq":
        return [(source_prefix or "") + source for source in sources]
    template = prompt_template or ((source_prefix or "") + "{prompt}")
    prompts = [template.format(prompt=source) for source in sources]
    return [[{"role": "user", "content": p}] for p in prompts] if use_chat_template else prompts
