"""The docs: the README stays short, relative links resolve, and the docs and results speak of the project only."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 250

# Words about how the work was done rather than what the project is (who worked when, on which machine, under
# which quotas, towards which quoted target). Specific enough not to hit ordinary words ("equivalent", "talent",
# "issues" in a link to an issue tracker).
PROCESS_WORDS = re.compile(
    r"\bsessions?\b|\blent\b|\bborrow(ed|ing)?\b|\btransfer\s+limits?\b|\bthe issue\b|\bissue asks\b",
    re.IGNORECASE,
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def tracked_files() -> list[str]:
    """Returns the repository's tracked paths, relative to its root (skips outside a git checkout)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out.stdout.decode().split("\0") if p]


def relative_links(path: Path) -> list[str]:
    """Returns the link targets of a markdown file outside fenced code blocks, minus URLs and pure anchors."""
    targets, in_code = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            in_code = not in_code
            continue
        if in_code:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
                continue
            targets.append(target.split("#", 1)[0])
    return targets


def test_readme_is_at_most_250_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move reference material to docs/"


@pytest.mark.parametrize("name", ["README.md", "benchmarks/README.md",
                                  *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))])
def test_relative_links_point_to_existing_files(name):
    path = ROOT / name
    missing = [t for t in relative_links(path) if not (path.parent / t).exists()]
    assert not missing, f"{name} links to missing files: {missing}"


def test_readme_links_the_docs_and_the_benchmarks():
    links = set(relative_links(ROOT / "README.md"))
    assert "benchmarks/README.md" in links
    assert any(link.startswith("docs/") for link in links)


def test_docs_and_results_describe_the_project_not_how_it_was_made():
    paths = [p for p in tracked_files() if p.endswith(".md") or p.startswith("benchmarks/results/")]
    assert paths, "no tracked markdown or result files found"
    hits = []
    for rel in paths:
        path = ROOT / rel
        if not path.is_file():
            continue  # deleted in the working tree
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            match = PROCESS_WORDS.search(line)
            if match:
                hits.append(f"{rel}:{number}: {match.group(0)!r}")
    assert not hits, "words about how the work was done (PROCESS_WORDS):\n" + "\n".join(hits[:20])


def test_link_parser_and_word_filter(tmp_path):
    sample = tmp_path / "sample.md"
    sample.write_text("[a](docs/x.md#part) [b](https://example.org) [c](#top)\n```\n[d](nope.md)\n```\n",
                      encoding="utf-8")
    assert relative_links(sample) == ["docs/x.md"]
    # Phrases the filter must catch, assembled so that this file does not itself read as one of them.
    for words in (("in", "session", "7"), ("the H200", "lent", "to us"), ("borrowed", "GPU"),
                  ("the transfer", "limit"), ("the", "issue", "asks +1.0")):
        text = " ".join(words)
        assert PROCESS_WORDS.search(text), text
    for text in ("equivalent", "talent", "lentil", "sessional", "tissue", "see issues/12"):
        assert not PROCESS_WORDS.search(text), text
