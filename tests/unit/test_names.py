"""Every `hf_seqrl.…` dotted name that the package, the docs, the README or the benchmarks mention exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bhf_seqrl(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def mentioned_names() -> dict[str, str]:
    """Returns every dotted name found, with the first file that mentions it."""
    files = [*sorted((REPO / "hf_seqrl").rglob("*.py")), *sorted((REPO / "docs").glob("*.md")), REPO / "README.md",
             *sorted((REPO / "benchmarks").rglob("*.py")), *sorted((REPO / "benchmarks").glob("*.md"))]
    found: dict[str, str] = {}
    for path in files:
        for name in NAME.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, str(path.relative_to(REPO)))
    return found


def resolves(name: str) -> bool:
    """Returns whether `name` is a module, or an attribute chain of the longest importable module it starts with."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def test_the_scan_finds_names():
    names = mentioned_names()
    assert "hf_seqrl.losses" in names and len(names) > 20


@pytest.mark.parametrize("name,where", sorted(mentioned_names().items()))
def test_every_mentioned_name_exists(name, where):
    assert resolves(name), f"{where} names {name}, which does not exist"
