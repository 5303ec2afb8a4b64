"""The package's import graph: no cycle, no library module importing the CLI, and cheap top-level imports.

Every `import` statement counts, at module level or inside a function (a lazy import is still an arrow).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hf_seqrl"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Returns the hf_seqrl modules that the module `name` (file `path`) imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    # A module's own packages are imported before it whatever it writes.
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from package import submodule` imports the submodule.
            submodules = {f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in known}
            found.update(submodules)
            # `from . import sibling` is an arrow to the sibling only; a name of the package itself, or any other
            # package, is an arrow to the package.
            if target not in ancestors or len(submodules) < len(node.names):
                found.add(target)
    return {module for module in found if module in known and module != name}


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """Returns one cycle of `graph` as a list of nodes (first = last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_cycle_finder_finds_a_cycle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_relative_imports_resolve_to_modules():
    graph = import_graph()
    assert "hf_seqrl.models.base" in graph["hf_seqrl.models.seq2seq"]
    assert "hf_seqrl.functional.advantages" in graph["hf_seqrl.losses"]
    assert "hf_seqrl.trainers.rewarded" in graph["hf_seqrl.trainers"]
    # `from .base import ...` is an arrow to the sibling module; the module's own package is loaded before it.
    assert "hf_seqrl.objectives.base" in graph["hf_seqrl.trainers.rollout"]
    assert "hf_seqrl.trainers" not in graph["hf_seqrl.trainers.rollout"]


def test_a_name_of_the_own_package_is_still_an_arrow_to_it(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text("from . import sibling, NAME_OF_THE_PACKAGE\n", encoding="utf-8")
    known = {"pkg", "pkg.sub", "pkg.sub.sibling", "pkg.sub.mod"}
    assert imports_of("pkg.sub.mod", path, known) == {"pkg.sub", "pkg.sub.sibling"}
    path.write_text("from . import sibling\n", encoding="utf-8")
    assert imports_of("pkg.sub.mod", path, known) == {"pkg.sub.sibling"}


def test_the_package_has_no_import_cycle():
    assert find_cycle(import_graph()) is None


def test_library_modules_never_import_the_cli():
    offenders = sorted(name for name, imported in import_graph().items()
                       if not name.startswith("hf_seqrl.cli") and any(m.startswith("hf_seqrl.cli") for m in imported))
    assert not offenders, offenders


def test_lower_layers_import_nothing_above_them():
    graph = import_graph()
    # The types passed between stages and the papers import no other module of the package; torch-only math, the
    # model-family layer and the rewards never reach the trainers, data or evaluation.
    below = {"hf_seqrl.types": ("hf_seqrl.",), "hf_seqrl.papers": ("hf_seqrl.",),
             # An objective is handed the trainer's services (`objectives.base.Runner`); it never imports a trainer,
             # nor the card renderer for its papers.
             "hf_seqrl.objectives": ("hf_seqrl.trainers", "hf_seqrl.hub", "hf_seqrl.evaluation"),
             "hf_seqrl.losses": ("hf_seqrl.models", "hf_seqrl.rewards", "hf_seqrl.data", "hf_seqrl.trainers"),
             "hf_seqrl.functional": ("hf_seqrl.models", "hf_seqrl.losses", "hf_seqrl.rewards", "hf_seqrl.trainers"),
             "hf_seqrl.models": ("hf_seqrl.rewards", "hf_seqrl.data", "hf_seqrl.trainers", "hf_seqrl.evaluation"),
             "hf_seqrl.rewards": ("hf_seqrl.data", "hf_seqrl.models", "hf_seqrl.trainers", "hf_seqrl.evaluation"),
             "hf_seqrl.data": ("hf_seqrl.rewards", "hf_seqrl.trainers", "hf_seqrl.evaluation")}
    bad = [(name, m) for name, imported in graph.items() for layer, above in below.items()
           if name == layer or name.startswith(layer + ".") for m in imported if m.startswith(above)]
    assert not bad, bad


def test_importing_the_package_and_the_losses_stays_light():
    code = ("import sys, hf_seqrl, hf_seqrl.losses, hf_seqrl.schedules\n"
            "print(sorted(m for m in ('transformers', 'datasets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
