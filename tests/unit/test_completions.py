"""The sample log's pure parts (`hf_seqrl.trainers.services.completions`): rows, tables, JSONL files, the config fields."""

import json
import math

import pytest

from hf_seqrl.rewards.spans import TokenScore
from hf_seqrl.trainers.services.completions import (CompletionLog, completion_rows, json_safe, markdown_table, report,
                                           small_columns, table, table_text, write_jsonl)


def two_sources_two_samples(**overrides):
    """Rows of 2 sources x 2 samples scored by two rewards (weights 0.5 / 0.5), built by hand."""
    settings = dict(
        step=3, process_index=1, num_samples=2,
        predictions=["ab", "a", "xyz", ""],
        references=[["ab"], ["ab"], ["xy", "xyz"], ["xy", "xyz"]],
        parts={"bleu": [1.0, 0.0, 1.0, float("nan")], "len": [0.5, 0.25, 0.75, 0.0]},
        rewards=[0.75, 0.125, 0.875, float("nan")],
        sources=["ab", "ab", "zyx", "zyx"],
        greedy=["ab", "ab", "xy", "xy"],
        baselines=[0.75, 0.75, 0.5, 0.5],
        advantages=[0.0, -0.625, 0.375, 0.0],  # reward - baseline; the NaN reward's advantage is 0
        truncated=[False, False, False, True],
        columns={"domain": ["toy", "toy", "toy", "toy"], "blob": ["x" * 5000] * 4},
    )
    settings.update(overrides)
    return completion_rows(**settings)


def test_completion_rows_hold_every_field_of_every_sample():
    rows = two_sources_two_samples()
    assert len(rows) == 4
    assert rows[1] == {"step": 3, "process": 1, "sample": 1, "source": "ab", "references": ["ab"], "prediction": "a",
                       "greedy": "ab", "rewards": {"bleu": 0.0, "len": 0.25}, "reward": 0.125, "baseline": 0.75,
                       "advantage": -0.625, "truncated": False, "columns": {"domain": "toy"}}  # the 5000-char column left out
    assert [row["sample"] for row in rows] == [0, 1, 0, 1]
    # NaN has no JSON: it becomes null; the flag stays a bool
    assert rows[3]["reward"] is None and rows[3]["rewards"]["bleu"] is None and rows[3]["truncated"] is True
    # missing pieces (no greedy decode, no baseline) are null in every row; no other columns: no "columns" key
    bare = two_sources_two_samples(greedy=None, baselines=None, advantages=None, sources=None, columns=None)
    assert all(row["greedy"] is None and row["baseline"] is None and row["source"] is None for row in bare)
    assert "columns" not in bare[0]


def test_json_safe_and_small_columns():
    import torch

    assert json_safe([1.0, math.inf, (2, -math.nan)]) == [1.0, None, [2, None]]
    assert json_safe(torch.tensor([0.5, 1.5])) == [0.5, 1.5]
    assert json_safe({"a": math.nan}) == {"a": None}
    # a dataclass: its fields, the tuples as lists, a non-finite value None
    score = TokenScore(0.5, spans=((0, 3, -1.0),), tokens=(0.25, math.nan))
    assert json_safe({"spans": score}) == {"spans": {"score": 0.5, "spans": [[0, 3, -1.0]], "tokens": [0.25, None]}}
    assert small_columns({"n": 3, "big": list(range(1000)), "obj": object(), "t": torch.tensor([1, 2])}) == {
        "n": 3, "t": [1, 2]}


def test_write_jsonl_writes_one_object_per_row(tmp_path):
    rows = two_sources_two_samples()
    path = tmp_path / "completions" / "step-3.jsonl"
    write_jsonl(rows, str(path))
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4 and [json.loads(line) for line in lines] == rows  # strict JSON: no NaN literal
    assert "NaN" not in path.read_text() and not (tmp_path / "completions" / "step-3.jsonl.tmp").exists()


def test_table_flattens_rows_and_drops_empty_columns():
    names, cells = table(two_sources_two_samples())
    assert names == ["step", "process", "source", "references", "prediction", "greedy", "reward/bleu", "reward/len",
                     "reward", "baseline", "advantage", "truncated"]
    assert cells[2] == [3, 1, "zyx", "xy | xyz", "xyz", "xy", 1.0, 0.75, 0.875, 0.5, 0.375, False]
    names, _ = table(two_sources_two_samples(greedy=None, baselines=None, advantages=None))  # MRT has neither
    assert "greedy" not in names and "baseline" not in names and "advantage" not in names
    names, _ = table(two_sources_two_samples(references=[[]] * 4))  # sources alone: no references column
    assert "references" not in names and "source" in names
    names, _ = table(two_sources_two_samples(), columns=("prediction", "reward"))
    assert names == ["prediction", "reward"]
    assert table([]) == ([], [])
    # a token-level reward's column shows its sentence score and what it gave at the token level; the total a number
    spans = [TokenScore(0.5, ((0, 1, -1.0), (1, 2, -0.5))), None, TokenScore(1.0, ((0, 1, -1.0),)),
             TokenScore(None, tokens=(0.1, 0.2))]
    names, cells = table(two_sources_two_samples(parts={"spans": spans}, rewards=spans))
    assert [row[names.index("reward/spans")] for row in cells] == ["0.5 +2 spans", None, "1 +1 span",
                                                                   "0 +2 token values"]
    assert [row[names.index("reward")] for row in cells] == [0.5, None, 1.0, 0.0]


def test_a_token_level_reward_is_its_number_and_its_spans_a_field_of_their_own():
    """The `reward` and `rewards` fields hold numbers (the sentence score the loss uses; 0 for per-token values only);
    each reward's spans and per-token values go to `reward_spans` / `reward_tokens`, by name, as it gave them."""
    spans = TokenScore(0.5, ((0, 1, -1.0), (1, 2, -0.5)))
    tokens = TokenScore(None, tokens=(0.1, math.nan))
    total = TokenScore(0.5 * 0.5 + 0.5 * 0.25, tuple((s, e, 0.5 * v) for s, e, v in spans.spans), (0.05, math.nan))
    rows = two_sources_two_samples(parts={"spans": [spans, None, spans, spans], "tokens": [tokens, None, None, None],
                                          "bleu": [0.25, 0.0, 1.0, 0.5]},
                                   rewards=[total, None, 0.75, float("nan")])
    assert rows[0]["rewards"] == {"spans": 0.5, "tokens": 0.0, "bleu": 0.25} and rows[0]["reward"] == 0.375
    assert rows[0]["reward_spans"] == {"spans": [[0, 1, -1.0], [1, 2, -0.5]]}
    assert rows[0]["reward_tokens"] == {"tokens": [0.1, None]}
    assert rows[1]["rewards"] == {"spans": None, "tokens": None, "bleu": 0.0} and rows[1]["reward"] is None
    assert "reward_spans" not in rows[1] and "reward_tokens" not in rows[1]
    assert rows[2]["reward_spans"] == rows[0]["reward_spans"] and "reward_tokens" not in rows[2]
    json.dumps(rows, allow_nan=False)  # strict JSON
    # the console's `reward` cell is the number, as for any reward
    assert table_text(rows, total_width=200).splitlines()[2].split()[-3:-1] == ["0.3750", "0.0000"]


def test_rows_without_a_reward_hold_the_samples():
    """A trainer without a reward (distillation) logs its samples: no reward or advantage column."""
    rows = completion_rows(step=1, process_index=0, num_samples=1, predictions=["ab", "c"], references=[["ab"], ["d"]],
                           parts={}, rewards=[None, None], sources=["ba", "d"], truncated=[False, True])
    assert [(row["source"], row["prediction"], row["rewards"], row["reward"]) for row in rows] == [
        ("ba", "ab", {}, None), ("d", "c", {}, None)]
    names, _ = table(rows)
    assert names == ["step", "process", "source", "references", "prediction", "truncated"]


def test_table_text_is_aligned_and_cut():
    rows = two_sources_two_samples(predictions=["ab", "a", "q" * 100, ""])
    lines = table_text(rows, width=10).splitlines()
    # header, rule, one line per row: the console columns only, numbers to 4 decimals, long text cut to 10
    assert lines[0].split() == ["source", "references", "prediction", "greedy", "reward", "advantage", "truncated"]
    assert set(lines[1]) <= {"-", " "}
    assert len(lines) == 2 + 4
    assert lines[2].split() == ["ab", "ab", "ab", "ab", "0.7500", "0.0000", "False"]
    assert "q" * 9 + "…" in lines[4] and "q" * 10 not in lines[4]


def test_markdown_table_escapes_cell_pipes():
    text = markdown_table(two_sources_two_samples())
    lines = text.splitlines()
    assert lines[0].startswith("| step | process | source |") and lines[1] == "|" + "---|" * 12
    assert len(lines) == 2 + 4 and "xy \\| xyz" in lines[4]


def test_completion_log_keeps_the_last_step_that_rolled_out():
    log = CompletionLog()
    log.add(0, [{"a": 1}])
    log.add(1, [{"a": 2}])
    log.add(1, [{"a": 3}])  # another micro-batch of the same optimizer step
    assert log.rows == [{"a": 2}, {"a": 3}] and log.step == 1


def test_report_hands_the_rows_to_tensorboard_and_wandb():
    from transformers.integrations import TensorBoardCallback, WandbCallback

    calls = []

    class Writer:
        def add_text(self, tag, text, step):
            calls.append(("tensorboard", tag, text.splitlines()[0], step))

    class FakeWandb:
        class Table:
            def __init__(self, columns, data):
                self.columns, self.data = columns, data

        @staticmethod
        def log(values):
            calls.append(("wandb", sorted(values), values["completions"].columns[:2], len(values["completions"].data),
                          values["train/global_step"]))

    tensorboard = TensorBoardCallback.__new__(TensorBoardCallback)
    tensorboard.tb_writer = Writer()
    wandb = WandbCallback.__new__(WandbCallback)
    wandb._wandb, wandb._initialized = FakeWandb, True
    idle = WandbCallback.__new__(WandbCallback)  # set up but not initialized: left alone
    idle._wandb, idle._initialized = FakeWandb, False
    report(two_sources_two_samples(), 7, [tensorboard, wandb, idle, object()])
    assert calls == [("tensorboard", "completions", "| step | process | source | references | prediction | greedy "
                      "| reward/bleu | reward/len | reward | baseline | advantage | truncated |", 7),
                     ("wandb", ["completions", "train/global_step"], ["step", "process"], 4, 7)]


def test_config_fields_are_checked():
    from hf_seqrl import SeqRLConfig

    config = SeqRLConfig(output_dir="unused", report_to=[], log_completions=True, num_completions_to_print=2)
    assert config.log_completions and config.num_completions_to_print == 2
    defaults = SeqRLConfig(output_dir="unused", report_to=[])
    assert defaults.log_completions is False and defaults.num_completions_to_print is None
    with pytest.raises(ValueError, match="num_completions_to_print must be >= 0"):
        SeqRLConfig(output_dir="unused", report_to=[], num_completions_to_print=-1)
    with pytest.raises(ValueError, match="log_completions=True .* logging_strategy='no' never logs"):
        SeqRLConfig(output_dir="unused", report_to=[], log_completions=True, logging_strategy="no")
