"""Every `hf-seqrl` line of the README's and the docs' ```bash blocks runs as written, with tiny models: the demo first
(its output folder is what `evaluate` and `diagnose` read), then the training lines, then the rest. Each line only
gains flags that shorten it (`--quick`, a few steps, a few rows) and has its output paths moved into a temporary
folder; a flag the line itself sets is never changed."""

import re
import shlex

import pytest

from helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ORDER = {"demo": 0, "train": 1, "evaluate": 2, "diagnose": 2, "distill-data": 2}
# Flags added to a line (where the line does not set them) so that it runs in seconds.
SHORTER = {
    "demo": [("--quick",)],
    "train": [("--max_steps", "4"), ("--warmup_xe_steps", "2"), ("--eval_strategy", "no"), ("--max_eval_samples", "4"),
              ("--max_test_samples", "4"), ("--logging_steps", "2")],
    "evaluate": [("--max_examples", "8")],
    "diagnose": [("--max_examples", "8")],
    "distill-data": [("--max_examples", "8")],
}
OUTPUTS = ("demo_out", "diag_out", "outputs/", "scores.json")


def cli_lines() -> list[tuple[str, str]]:
    """Returns `(page, line)` for each `hf-seqrl` command in the pages' bash blocks (a `&&` chain's too)."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                for command in line.split("&&"):
                    if command.strip().startswith("hf-seqrl "):
                        found.append((page.name, command.strip()))
    return found


def order(line: str) -> int:
    """Returns when a line runs (`ORDER`); a training line whose --train_file a line writes (under outputs/) runs
    after the lines that write files."""
    argv = shlex.split(line, comments=True)[1:]
    if argv[0] == "train" and "--train_file" in argv and argv[argv.index("--train_file") + 1].startswith("outputs/"):
        return max(ORDER.values()) + 1
    return ORDER[argv[0]]


def runnable(line: str, tmp_path, index: int) -> list[str]:
    """Returns the argv of `line` (after `hf-seqrl`) with its outputs under `tmp_path` and the shortening flags."""
    argv = shlex.split(line, comments=True)[1:]
    moved = [str(tmp_path / token) if token.startswith(OUTPUTS) else token for token in argv]
    given = {token.split("=")[0] for token in moved if token.startswith("--")}
    added = [token for flag in SHORTER[moved[0]] if flag[0] not in given for token in flag]
    if moved[0] == "train" and "--output_dir" not in given:
        added += ["--output_dir", str(tmp_path / f"train_{index}")]
    return moved + added


def test_the_pages_have_cli_lines():
    pages = {page for page, _ in cli_lines()}
    assert {"README.md", "recipes.md"} <= pages
    assert any("--algorithm mrt --baseline none" in line for _, line in cli_lines())


@pytest.mark.slow
def test_every_cli_line_of_the_readme_and_the_docs_runs(tmp_path, monkeypatch):
    from hf_seqrl.cli import main

    monkeypatch.chdir(REPO)  # the lines name configs and data relative to the repository root
    lines = sorted(dict.fromkeys(cli_lines()), key=lambda item: order(item[1]))
    for index, (page, line) in enumerate(lines):
        argv = runnable(line, tmp_path, index)
        assert main(argv) == 0, f"{page}: {line}"
    assert (tmp_path / "demo_out" / "model.safetensors").is_file() and (tmp_path / "scores.json").is_file()
    assert (tmp_path / "diag_out" / "diagnostics.json").is_file()
