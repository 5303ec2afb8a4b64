"""The console table of the sample logs fits the terminal: one line per row, long text cut, with and without rich."""

import sys

import pytest

from hf_seqrl.trainers.completions import completion_rows, fit_widths, print_table, table_text

ABSTRACT = " ".join(f"word{i}" for i in range(230))  # a summarization source: 230 words


def summarization_rows():
    return completion_rows(step=5, process_index=0, num_samples=1, predictions=["a short summary " * 3, "x"],
                           references=[["the reference summary of the abstract"], ["y"]], parts={"rougeL": [0.5, 0.0]},
                           rewards=[0.5, 0.0], sources=[ABSTRACT, ABSTRACT[:40]], greedy=["g", "g"],
                           baselines=[0.25, 0.25], advantages=[0.25, -0.25], truncated=[True, False])


def test_fit_widths_cuts_the_widest_columns_to_one_width():
    assert fit_widths([5, 6], 80) == [5, 6]  # room enough: unchanged
    # room 80 - 3 * 2 = 74: the 300 and 40 columns get 29 each (10 + 29 + 29 + 6 = 74), the narrow ones keep theirs
    assert fit_widths([10, 300, 40, 6], 80) == [10, 29, 29, 6]
    assert fit_widths([100, 100], 20) == [9, 9]  # (20 - 2) / 2
    assert fit_widths([100, 100], 10) == [8, 8]  # never below MIN_TEXT_WIDTH


@pytest.mark.parametrize("columns", [80, 120])
def test_rich_table_has_one_line_per_row_within_the_terminal(columns, monkeypatch, capsys):
    pytest.importorskip("rich")
    monkeypatch.setenv("COLUMNS", str(columns))
    print_table(summarization_rows(), step=5)
    lines = capsys.readouterr().out.splitlines()
    # title, top border, header, header rule, row, rule, row, bottom border
    assert len(lines) == 8, "\n".join(lines)
    assert max(len(line) for line in lines) <= columns
    assert "word0" in lines[4] and "…" in lines[4] and "word229" not in lines[4]
    assert "0.5000" in lines[4] and "True" in lines[4]  # numbers and flags are never cut


def test_plain_table_fits_the_terminal_without_rich(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rich.console", None)  # `import rich.console` now fails
    monkeypatch.setenv("COLUMNS", "90")
    print_table(summarization_rows(), step=5)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "completions at step 5" and len(lines) == 1 + 2 + 2
    assert max(len(line) for line in lines) <= 90 and "…" in lines[3]
    assert len(table_text(summarization_rows(), total_width=200).splitlines()[2]) <= 200
