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
URL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def tracked_files() -> list[str]:
    """Returns the repository's tracked paths, relative to its root (skips outside a git checkout)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out.stdout.decode().split("\0") if p]


def prose_lines(path: Path) -> list[str]:
    """Returns the lines of a markdown file outside its fenced code blocks."""
    lines, in_code = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            in_code = not in_code
        elif not in_code:
            lines.append(line)
    return lines


def link_targets(path: Path) -> list[str]:
    """Returns the link targets of a markdown file outside fenced code blocks, minus URLs."""
    return [target for line in prose_lines(path) for target in LINK.findall(line) if not URL.match(target)]


def relative_links(path: Path) -> list[str]:
    """Returns the link targets of a markdown file outside fenced code blocks, minus URLs and pure anchors."""
    return [target.split("#", 1)[0] for target in link_targets(path) if not target.startswith("#")]


def heading_anchors(path: Path) -> set[str]:
    """Returns the anchors GitHub gives a markdown file's headings: the text lowercased, links reduced to their text,
    every character but letters, digits, `-`, `_` and spaces dropped, spaces made `-`; a repeated one gets `-1`,
    `-2`."""
    anchors, seen = set(), {}
    for line in prose_lines(path):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).lower()
        slug = "".join(ch for ch in text if ch.isalnum() or ch in "-_ ").replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def anchored_links(path: Path) -> list[tuple[str, str]]:
    """Returns `(file, anchor)` for each link of a markdown file that names a heading (file "" = the same file)."""
    return [tuple(target.split("#", 1)) for target in link_targets(path) if "#" in target]


def test_readme_is_at_most_250_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move reference material to docs/"


@pytest.mark.parametrize("name", ["README.md", "benchmarks/README.md",
                                  *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))])
def test_relative_links_point_to_existing_files(name):
    path = ROOT / name
    missing = [t for t in relative_links(path) if not (path.parent / t).exists()]
    assert not missing, f"{name} links to missing files: {missing}"


@pytest.mark.parametrize("name", ["README.md", "benchmarks/README.md",
                                  *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))])
def test_links_to_headings_name_existing_headings(name):
    path = ROOT / name
    broken = []
    for file, anchor in anchored_links(path):
        target = (path.parent / file) if file else path
        if target.suffix == ".md" and target.exists() and anchor not in heading_anchors(target):
            broken.append(f"{file}#{anchor}")
    assert not broken, f"{name} links to headings that do not exist: {broken}"


def test_heading_anchors_follow_github(tmp_path):
    sample = tmp_path / "sample.md"
    sample.write_text("# Leave-one-out ×4, two updates (3 seeds)\n```\n# not a heading\n```\n"
                      "## `mask_truncated`: off\n## [Linked](x.md) part\n## Repeat\n## Repeat\n"
                      "[a](#repeat-1) [b](y.md#part) [c](https://e.org/#x)\n", encoding="utf-8")
    assert heading_anchors(sample) == {"leave-one-out-4-two-updates-3-seeds", "mask_truncated-off", "linked-part",
                                       "repeat", "repeat-1"}
    assert anchored_links(sample) == [("", "repeat-1"), ("y.md", "part")]


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


RESULTS_FILE = re.compile(r"benchmarks/results/[\w.\-]+\.(?:json|md)|(?<![\w/])results/[\w.\-]+\.(?:json|md)")
DOC_FILES = ["README.md", "benchmarks/README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]


def cited_results() -> dict[str, list[str]]:
    """Returns each results file the docs name (`benchmarks/results/...`), with the docs that name it."""
    cited: dict[str, list[str]] = {}
    for name in DOC_FILES:
        for match in RESULTS_FILE.findall((ROOT / name).read_text(encoding="utf-8")):
            path = match if match.startswith("benchmarks/") else f"benchmarks/{match}"
            cited.setdefault(path, []).append(name)
    return cited


def test_every_results_file_the_docs_cite_exists_and_records_its_command():
    import json

    cited = cited_results()
    assert len(cited) > 20
    problems = []
    for path, docs in sorted(cited.items()):
        if path.endswith("gpu_check.json") or path.endswith("gpu_check.md"):
            continue  # written by a GPU run only
        if not (ROOT / path).is_file():
            problems.append(f"{path} (cited in {docs[0]}) does not exist")
        elif path.endswith(".json"):
            data = json.loads((ROOT / path).read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not str(data.get("command", "")).startswith("python benchmarks/"):
                problems.append(f"{path} records no command")
    assert not problems, "\n".join(problems)


def test_every_results_file_records_its_command_and_quality_accepts_its_settings():
    import json
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from quality_lib.settings import Settings

    problems = []
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        command = data.get("command", "") if isinstance(data, dict) else ""
        if not command.startswith("python benchmarks/"):
            problems.append(f"{path.name}: no command")
            continue
        for part in command.split(" && "):
            words = part.split()
            if words[1] not in ("benchmarks/quality.py", "benchmarks/exposure.py", "benchmarks/neural_rewards.py"):
                continue
            if "--set" in words:
                for item in words[words.index("--set") + 1:]:
                    if item.startswith("--"):
                        break
                    if item.partition("=")[0] not in Settings.__dataclass_fields__:
                        problems.append(f"{path.name}: --set {item} is no setting of quality.py")
    assert not problems, "\n".join(problems)


# A path in prose: a folder of this repository, then a file name with an extension.
REPO_PATH = re.compile(r"(?<![\w./-])((?:hf_seqrl|tests|benchmarks|docs|recipes|model_cards)/[\w./-]*\.(?:py|md|json|yaml|cfg))")


def test_every_file_path_named_in_docstrings_docs_and_setup_cfg_exists():
    import ast

    texts = [(name, (ROOT / name).read_text(encoding="utf-8")) for name in [*DOC_FILES, "setup.cfg"]]
    for path in sorted((ROOT / "hf_seqrl").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    texts.append((path.relative_to(ROOT).as_posix(), doc))
    missing = set()
    for name, text in texts:
        for target in REPO_PATH.findall(text):
            target = target.rstrip(".")
            if "*" in target or "<" in target or "gpu_check." in target:  # gpu_check's files: a GPU run writes them
                continue
            if not (ROOT / target).exists() and not (ROOT / name).parent.joinpath(target).exists():
                missing.add(f"{name}: {target}")
    assert not missing, "paths that do not exist:\n" + "\n".join(sorted(missing))
