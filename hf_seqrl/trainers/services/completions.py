"""Sample logs (`SeqRLConfig.log_completions`): the rows of a rollout, gathered, written, printed and reported.

Each process keeps the rows of the last optimizer step that rolled out (`CompletionLog.add`; a new step replaces
the old rows, so memory stays one step's samples). At each training log, `CompletionLog.publish` gathers every
process's rows on the main process, which writes them all to `output_dir/completions/step-N.jsonl` (N: the
optimizer step of the log), prints `num_completions_to_print` of them as a table, and hands them to the TensorBoard
(`add_text`, a markdown table) and W&B (`wandb.Table`) callbacks when those are active. Rows are written once: a
log with no rollout since the last one (warm-up, the reused steps of `num_iterations > 1`) writes no file.

The console table fits the terminal (`shutil.get_terminal_size`): one line per row, long text cut with "…"
(`fit_widths`), the sample given the most room and the source cut from the left so that the end of a prompt shows;
the file and the integrations keep the whole text. The rest are pure functions of the rows
(`completion_rows`, `table`, `table_text`, `markdown_table`, `write_jsonl`), tested without a model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from collections.abc import Sequence
from typing import Any

from ...models.languages import decode_texts
from ...rewards.spans import TokenScore, sentence_score
from ...types import repeat_rows

COMPLETIONS_DIR = "completions"
MAX_COLUMN_CHARS = 1000  # a dataset column's value goes into a row when its JSON is at most this long
# What the console table shows (the file, TensorBoard and W&B get every column of `table`).
CONSOLE_COLUMNS = ("source", "references", "prediction", "greedy", "reward", "advantage", "truncated")
MIN_TEXT_WIDTH = 8  # a text column narrower than this shows too little to read
# How the console shares its width among the text columns: the sample most, the greedy decode and the source next.
TEXT_WEIGHTS = {"prediction": 3, "greedy": 2, "source": 2, "references": 1}
# Cut from the left ("…" first): the end of a prompt says what it asks for (a chat template's fixed part comes first).
CUT_FROM_LEFT = ("source",)


def json_safe(value: Any) -> Any:
    """Returns `value` as JSON can hold it: NaN and inf become None, tensors and arrays lists, tuples lists, a
    dataclass the dict of its fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    return value


def small_columns(columns: dict[str, Any]) -> dict[str, Any]:
    """Returns the entries of `columns` (one row's other dataset columns) that JSON holds in at most
    `MAX_COLUMN_CHARS` characters; larger or unserializable values are left out."""
    kept = {}
    for name, value in columns.items():
        value = json_safe(value)
        try:
            if len(json.dumps(value)) <= MAX_COLUMN_CHARS:
                kept[name] = value
        except (TypeError, ValueError):
            continue
    return kept


def completion_rows(step: int, process_index: int, num_samples: int, predictions: Sequence[str],
                    references: Sequence[Sequence[str]], parts: dict[str, Sequence[Any]],
                    rewards: Sequence[Any], sources: Sequence[str] | None = None,
                    greedy: Sequence[str] | None = None, baselines: Sequence[float] | None = None,
                    advantages: Sequence[float] | None = None, truncated: Sequence[bool] | None = None,
                    columns: dict[str, Sequence[Any]] | None = None) -> list[dict]:
    """Returns one JSON-ready dict per sample: `step`, `process`, `sample` (its index among its source's
    `num_samples`), `source`, `references`, `prediction`, `greedy`, `rewards` (each reward's number by name),
    `reward` (the total's number), `baseline`, `advantage`, `truncated`; `reward_spans` / `reward_tokens` when a
    reward gave token-level values (`token_level_values`), and `columns` when the batch has other small columns.

    Every sequence argument holds one entry per sample (`N = B * num_samples`, a source's samples contiguous; see
    `repeat_rows`); `parts` maps each reward's name to its `N` values, `rewards` holds the total (numbers, None, or
    token-level `TokenScore`s, written as their sentence score: `reward_number`). Missing ones (`sources`, `greedy`,
    `baselines`, `advantages`, `truncated`) are None in every row; non-finite numbers are None. A trainer without a
    reward passes no `parts` and None rewards.
    """
    def at(values, i):
        return None if values is None else values[i]

    rows = []
    for i, prediction in enumerate(predictions):
        sample_rewards = {name: part[i] for name, part in parts.items()}
        row = {
            "step": step,
            "process": process_index,
            "sample": i % num_samples,
            "source": at(sources, i),
            "references": list(references[i]),
            "prediction": prediction,
            "greedy": at(greedy, i),
            "rewards": {name: reward_number(value) for name, value in sample_rewards.items()},
            "reward": reward_number(rewards[i]),
            "baseline": None if baselines is None else json_safe(float(baselines[i])),
            "advantage": None if advantages is None else json_safe(float(advantages[i])),
            "truncated": None if truncated is None else bool(truncated[i]),
        }
        row.update(token_level_values(sample_rewards))
        extra = small_columns({name: values[i] for name, values in (columns or {}).items()})
        if extra:
            row["columns"] = extra
        rows.append(row)
    return rows


def reward_number(value: Any) -> float | None:
    """Returns a reward's value as the sample log writes it: a number as it is, a token-level reward's sentence score
    (`spans.sentence_score`: 0 when it gave per-token values only, the number the loss and `rl/rewards/<name>/mean`
    use), None where it gave none or a non-finite one."""
    return json_safe(sentence_score(value))


def token_level_values(values: dict[str, Any]) -> dict[str, dict[str, list]]:
    """Returns the token-level parts of one sample's rewards (`values`, each reward's value by name), as the fields
    of its sample log row: `reward_spans` (each reward's character spans `[start, end, value]` of the prediction) and
    `reward_tokens` (each reward's per-token values), for the rewards that gave them, as they gave them (before
    `reward_weights`); neither field when none did."""
    scores = {name: value for name, value in values.items() if isinstance(value, TokenScore)}
    fields = {"reward_spans": {name: json_safe(s.spans) for name, s in scores.items() if s.spans},
              "reward_tokens": {name: json_safe(s.tokens) for name, s in scores.items() if s.tokens is not None}}
    return {field: by_name for field, by_name in fields.items() if by_name}


def reward_cell(score: Any, spans: Sequence | None = None, tokens: Sequence | None = None) -> Any:
    """Returns a reward's table cell: its number `score`, or with token-level values (a row's `reward_spans` /
    `reward_tokens` of that reward) the number and how many spans and per-token values it gave, e.g. "0.5 +2 spans"."""
    if not spans and tokens is None:
        return score
    parts = [] if score is None else [f"{score:.4g}"]
    parts += [f"+{len(spans)} span{'s' * (len(spans) != 1)}"] if spans else []
    parts += [f"+{len(tokens)} token values"] if tokens is not None else []
    return " ".join(parts)


def table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> tuple[list[str], list[list[Any]]]:
    """Returns `(column names, cells)` of the rows flattened for a table: `step`, `process`, `source`, `references`
    (joined by " | "; None without any: rows of sources alone), `prediction`, `greedy`, `reward/<name>` per reward (`reward_cell`: with its span count where
    it gave spans), `reward` (a number), `baseline`, `advantage`, `truncated`, or only those of `columns`; a column
    that is None in every row is left out."""
    reward_names = list(dict.fromkeys(name for row in rows for name in row["rewards"]))
    flat = [{"step": row["step"], "process": row["process"], "source": row["source"],
             "references": " | ".join(row["references"]) or None, "prediction": row["prediction"], "greedy": row["greedy"],
             **{f"reward/{name}": reward_cell(row["rewards"].get(name), row.get("reward_spans", {}).get(name),
                                              row.get("reward_tokens", {}).get(name)) for name in reward_names},
             "reward": row["reward"], "baseline": row["baseline"], "advantage": row["advantage"],
             "truncated": row["truncated"]} for row in rows]
    names = [name for name in (flat[0] if flat else {}) if (columns is None or name in columns)
             and any(f[name] is not None for f in flat)]
    return names, [[f[name] for name in names] for f in flat]


def _cell(value: Any, width: int | None = None, from_left: bool = False) -> str:
    text = f"{value:.4f}" if isinstance(value, float) else "" if value is None else str(value)
    text = " ".join(text.split())  # one line per row
    if width is None or len(text) <= width:
        return text
    keep = max(width - 1, 0)
    return "…" + text[len(text) - keep:] if from_left else text[:keep] + "…"


def fit_widths(natural: Sequence[int], total: int, separator: int = 2,
               weights: Sequence[float] | None = None) -> list[int]:
    """Returns column widths that fit a line of `total` characters, each column at most its `natural` width.

    Columns separated by `separator` characters share the room: each wide column is cut to `weights[j]` (default 1)
    times one common width, the largest at which the line fits, so the narrow ones (numbers, flags) keep theirs and
    a column of weight 2 gets twice the room of one of weight 1. A cut width is at least `MIN_TEXT_WIDTH`: a very
    narrow terminal gets a line longer than `total` rather than unreadable cells.
    """
    weights = [1.0] * len(natural) if weights is None else list(weights)
    room = total - separator * max(len(natural) - 1, 0)
    if sum(natural) <= room:
        return list(natural)

    def capped(unit: int) -> list[int]:
        return [min(w, max(int(weight * unit), MIN_TEXT_WIDTH)) for w, weight in zip(natural, weights)]

    low, high = 0, max(natural)
    while low < high:  # bisection for the largest common width whose capped widths fit
        mid = (low + high + 1) // 2
        low, high = (mid, high) if sum(capped(mid)) <= room else (low, mid - 1)
    return capped(low)


def console_cells(rows: Sequence[dict], total_width: int, margin: int, separator: int
                  ) -> tuple[list[str], list[list[str]], list[int]]:
    """Returns `(names, cells, widths)` of `CONSOLE_COLUMNS` for a console `total_width` wide (`margin` characters of
    borders and padding per column besides `separator`): the text columns share the room by `TEXT_WEIGHTS`, each cell
    cut to its width, the source's from the left."""
    names, values = table(rows, CONSOLE_COLUMNS)
    texts = [[_cell(value) for value in row] for row in values]
    natural = [max([len(name)] + [len(row[j]) for row in texts]) for j, name in enumerate(names)]
    widths = fit_widths(natural, total_width - margin * len(names), separator,
                        [TEXT_WEIGHTS.get(name, 1) for name in names])
    cells = [[_cell(text, width, name in CUT_FROM_LEFT) for text, width, name in zip(row, widths, names)]
             for row in texts]
    return names, cells, widths


def console_width() -> int:
    """Returns the terminal's width in characters (`COLUMNS`, then the terminal, else 80)."""
    return shutil.get_terminal_size(fallback=(80, 24)).columns


def table_text(rows: Sequence[dict], width: int | None = None, total_width: int | None = None) -> str:
    """Returns the rows as a plain text table (`CONSOLE_COLUMNS`, one line per row, numbers to 4 decimals), for
    consoles without `rich`: the text of a cell is cut to `width` characters when given, and the columns to fit
    `total_width` (default: the terminal's width, `console_width`)."""
    if width is not None:
        rows = [{**row, **{name: _cell(row[name], width, name in CUT_FROM_LEFT) for name in TEXT_WEIGHTS
                           if isinstance(row.get(name), str)}} for row in rows]
    names, cells, widths = console_cells(rows, total_width or console_width(), margin=0, separator=2)
    texts = [[_cell(name, w) for name, w in zip(names, widths)]] + cells
    lines = ["  ".join(text.ljust(w) for text, w in zip(row, widths)).rstrip() for row in texts]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows: Sequence[dict]) -> str:
    """Returns the rows as a markdown table (what TensorBoard's text tab renders)."""
    names, cells = table(rows)

    def line(values):
        return "| " + " | ".join(_cell(v).replace("|", "\\|") for v in values) + " |"

    return "\n".join([line(names), "|" + "---|" * len(names), *(line(row) for row in cells)])


def write_jsonl(rows: Sequence[dict], path: str) -> None:
    """Writes one JSON object per row to `path` (its folder created), atomically."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
    os.replace(path + ".tmp", path)


def print_table(rows: Sequence[dict], step: int, total_width: int | None = None) -> None:
    """Prints the rows' `CONSOLE_COLUMNS` as a table that fits `total_width` (default: the terminal's width), one line
    per row: with `rich` when it is installed, else as `table_text`."""
    total_width = total_width or console_width()
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(f"completions at step {step}\n{table_text(rows, total_width=total_width)}", flush=True)
        return
    # rich's box: a border before each column and after the last, one space of padding on each side of a cell.
    names, cells, widths = console_cells(rows, total_width - 1, margin=3, separator=0)
    shown = Table(title=f"completions at step {step}", show_lines=True)
    for name, width in zip(names, widths):
        shown.add_column(name, width=width, no_wrap=True, overflow="ellipsis")
    for row in cells:
        shown.add_row(*row)
    Console(width=max(total_width, sum(widths) + 3 * len(widths) + 1)).print(shown)


class CompletionLog:
    """One process's rows of the last optimizer step that rolled out, until a training log publishes them."""

    def __init__(self):
        self.rows: list[dict] = []
        self.step: int | None = None

    def add(self, step: int, rows: list[dict]) -> None:
        """Keeps `rows` of optimizer step `step` (0-based, as `state.global_step` reads during the step): the rows
        of an earlier step are dropped, those of the same step's other micro-batches kept."""
        if step != self.step:
            self.rows, self.step = [], step
        self.rows.extend(rows)

    def add_samples(self, step: int, process_index: int, tokenizer, text, samples, sample_cut, prompts=None,
                    baselines=None, advantages=None, greedy_ids=None) -> None:
        """Keeps the rows of a micro-batch's samples (`completion_rows`) for optimizer step `step` (0-based).

        Args:
            text (`BatchText`): the batch's `B` rows; samples (`RewardValues`): the `B*n` samples'.
            sample_cut (`torch.BoolTensor` of shape `(B*n,)`): the samples cut at the length limit.
            prompts (`torch.LongTensor` of shape `(B, P)`, *optional*): each row's source or prompt ids, decoded as its
                source when `text` has none.
            baselines, advantages (`torch.Tensor` of shape `(B*n,)`, *optional*); greedy_ids (`(B, T')`, *optional*).
        """
        n = sample_cut.shape[0] // len(text.references)
        sources = None if prompts is None else decode_texts(tokenizer, prompts)
        greedy = None if greedy_ids is None else decode_texts(tokenizer, greedy_ids)
        per_sample = repeat_rows(text._replace(sources=text.sources if text.sources is not None else sources), n)
        self.add(step, completion_rows(
            step + 1, process_index, n, samples.predictions, per_sample.references, samples.parts, samples.values,
            per_sample.sources, None if greedy is None else [g for g in greedy for _ in range(n)],
            None if baselines is None else baselines.tolist(), None if advantages is None else advantages.tolist(),
            sample_cut.tolist(), per_sample.columns))

    def publish(self, trainer) -> list[dict]:
        """Gathers every process's kept rows on the main process, which writes, prints and reports them; returns
        the gathered rows (on every process). Collective: every process calls it at the same log."""
        from accelerate.utils import gather_object

        rows, self.rows, self.step = self.rows, [], None
        if trainer.accelerator.num_processes > 1:
            rows = gather_object(rows)
        if not rows or not trainer.is_world_process_zero():
            return rows
        step, args = trainer.state.global_step, trainer.args
        write_jsonl(rows, os.path.join(args.output_dir, COMPLETIONS_DIR, f"step-{step}.jsonl"))
        limit = args.num_completions_to_print
        if limit is None or limit > 0:
            print_table(rows if limit is None else rows[:limit], step)
        report(rows, step, trainer.callback_handler.callbacks)
        return rows


def report(rows: Sequence[dict], step: int, callbacks) -> None:
    """Hands the rows to the active TensorBoard (a markdown table as text, tag `completions`) and W&B (a
    `wandb.Table` under `completions`) callbacks."""
    from transformers.integrations import TensorBoardCallback, WandbCallback

    for callback in callbacks:
        if isinstance(callback, TensorBoardCallback) and callback.tb_writer is not None:
            callback.tb_writer.add_text("completions", markdown_table(rows), step)
        elif isinstance(callback, WandbCallback) and getattr(callback, "_initialized", False) \
                and callback._wandb is not None:
            names, cells = table(rows)
            callback._wandb.log({"completions": callback._wandb.Table(columns=names, data=cells),
                                 "train/global_step": step})
