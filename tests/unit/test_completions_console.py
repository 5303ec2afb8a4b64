"""The console table of the sample logs fits the terminal: one line per row, long text cut, with and without rich."""

import sys

import pytest

from hf_seqrl.trainers.services.completions import completion_rows, fit_widths, print_table, table_text

ABSTRACT = " ".join(f"word{i}" for i in range(230))  # a summarization source: 230 words


def summarization_rows():
    return completion_rows(step=5, process_index=0, num_samples=1, predictions=["a short summary " * 3, "x"],
                           references=[["the reference summary of the abstract"], ["y"]], parts={"rougeL": [0.5, 0.0]},
                           rewards=[0.5, 0.0], sources=[ABSTRACT, ABSTRACT[:40]], greedy=["g", "g"],
                           baselines=[0.25, 0.25], advantages=[0.25, -0.25], truncated=[True, False])


def test_the_sample_gets_the_most_room_and_a_chat_prompt_shows_its_end():
    prompt = "<|im_start|>user\nTranslate the following German sentence into English: " + "ein Hund läuft im Park"
    rows = completion_rows(step=1, process_index=0, num_samples=1, predictions=["a dog runs in the park " * 4],
                           references=[["a dog runs in the park"]], parts={"chrf": [0.5]}, rewards=[0.5],
                           sources=[prompt], truncated=[False])
    header, rule, line = table_text(rows, total_width=100).splitlines()
    assert len(line) <= 100 and line.startswith("…") and "im Park" in line  # the part that differs
    widths = [len(dashes) for dashes in rule.split("  ")]  # source, references, prediction, reward, truncated
    assert widths[2] > widths[0] > widths[1] >= 8
    # room 64 - 2 * 2 = 60: widths 1 : 2 : 3 of a common 10; at 62 (room 58) the common width is 9
    assert fit_widths([100, 100, 100], 64, weights=[1, 2, 3]) == [10, 20, 30]
    assert fit_widths([100, 100, 100], 62, weights=[1, 2, 3]) == [9, 18, 27]


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
    # the source cut from the left: its end shows (what a prompt asks comes last)
    assert "word229" in lines[4] and "│ …" in lines[4] and "word0 " not in lines[4]
    assert "0.5000" in lines[4] and "True" in lines[4]  # numbers and flags are never cut


def test_plain_table_fits_the_terminal_without_rich(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rich.console", None)  # `import rich.console` now fails
    monkeypatch.setenv("COLUMNS", "90")
    print_table(summarization_rows(), step=5)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "completions at step 5" and len(lines) == 1 + 2 + 2
    assert max(len(line) for line in lines) <= 90 and "…" in lines[3]
    assert len(table_text(summarization_rows(), total_width=200).splitlines()[2]) <= 200
