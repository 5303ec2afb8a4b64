"""The seam between `RolloutTrainer` and the objectives (docs/architecture.md, "One RL step"): the step calls the
objective's stages once each, in order, in one function; every exported trainer sits at most two hf-seqrl classes
below `Seq2SeqTrainer`; no class holds a function defined in another module; no attribute of a trainer carries data
between stages; each default of an algorithm is declared once, in its objective's record."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from pathlib import Path

from transformers import Seq2SeqTrainer

import hf_seqrl
import hf_seqrl.objectives as objectives
import hf_seqrl.trainers as trainers
from hf_seqrl.trainers.rollout import RolloutTrainer
from hf_seqrl.types import RolloutBatch

PACKAGE = Path(hf_seqrl.__file__).parent


def objective_calls() -> list[str]:
    """Returns the `objective.<stage>(...)` calls of `RolloutTrainer.rl_loss`, in source order."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(RolloutTrainer.rl_loss)))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and isinstance(node.func.value, ast.Name) and node.func.value.id == "objective"]
    return [call.func.attr for call in sorted(calls, key=lambda call: (call.lineno, call.col_offset))]


def test_the_step_calls_each_stage_of_the_objective_once_in_order():
    assert objective_calls() == ["on_policy", "rollout", "weigh", "score", "loss", "cross_entropy"]


def test_every_exported_trainer_is_at_most_two_hf_seqrl_classes_below_seq2seq_trainer():
    exported = [getattr(trainers, name) for name in trainers.__all__ if isinstance(getattr(trainers, name), type)]
    assert len(exported) >= 12
    for cls in exported:
        chain = cls.__mro__[1:cls.__mro__.index(Seq2SeqTrainer)]
        assert len(chain) <= 2, (cls.__name__, [c.__name__ for c in chain])


def package_classes():
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                yield path, node


def test_no_class_binds_a_function_of_another_module():
    # `name = module.function` or `name = function` (an imported one) in a class body: go-to-definition would land on
    # the assignment, and `self` would be untyped where the function is written.
    offenders = []
    for path, node in package_classes():
        defined = {item.name for item in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                   if isinstance(item, (ast.FunctionDef, ast.ClassDef))}
        for item in node.body:
            if isinstance(item, ast.Assign) and isinstance(item.value, ast.Attribute) and \
                    isinstance(item.value.value, ast.Name) and item.value.value.id[0].islower():
                offenders.append(f"{path.name}:{node.name}.{ast.unparse(item.targets[0])}")
            if isinstance(item, ast.Assign) and isinstance(item.value, ast.Name) and item.value.id[0].islower() \
                    and item.value.id not in defined and item.value.id not in ("None", "True", "False"):
                offenders.append(f"{path.name}:{node.name}.{ast.unparse(item.targets[0])}")
    assert not offenders, offenders


def test_the_rollout_batch_has_no_untyped_side_channel():
    assert "extra" not in {f.name for f in dataclasses.fields(RolloutBatch)}


def test_no_trainer_attribute_carries_data_between_stages():
    # What one stage hands the next goes through `StepContext` or the objective's typed batch.
    source = "".join(path.read_text(encoding="utf-8") for path in (PACKAGE / "trainers").rglob("*.py"))
    for attribute in (r"self\.slot\b", r"self\._policy_rng\b", r"\.extra\["):
        assert not re.search(attribute, source), attribute


def test_each_default_of_an_algorithm_is_declared_once():
    # The trainers read their defaults from the objective's record; only the base trainer (cross-entropy and the
    # input schedules) declares what `disable_dropout=None` means for itself.
    for path in (PACKAGE / "trainers").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for name in ("default_disable_dropout =", "default_baseline =", "needs_rewards ="):
            lines = [line for line in text.splitlines() if line.strip().startswith(name)]
            allowed = {"base.py": {"default_disable_dropout ="}, "rollout.py": {"default_baseline =",
                                                                                "needs_rewards ="}}
            assert not lines or name in allowed.get(path.name, set()), (path.name, lines)
    for objective in objectives.OBJECTIVES.values():
        assert "defaults" in vars(objective), objective.__name__
    # What the docs say of dropout is what the records say.
    docs = (PACKAGE.parent / "docs" / "configuration.md").read_text(encoding="utf-8")
    for trainer in trainers.TRAINER_CLASSES:
        if issubclass(trainer, RolloutTrainer):
            assert trainer.default_disable_dropout == trainer.defaults.disable_dropout
    dropout_on = sorted(t.__name__ for t in trainers.TRAINER_CLASSES if t.default_disable_dropout)
    assert dropout_on == ["DistillationTrainer", "MRTTrainer"]
    assert "`True` for minimum risk training and distillation, `False` for every other trainer" in docs


def test_the_trainers_pick_the_objectives_the_registry_holds():
    picked = {t.objective_class for t in trainers.TRAINER_CLASSES if issubclass(t, RolloutTrainer)}
    assert picked == set(objectives.OBJECTIVES.values())
    assert {t.algorithm_id for t in trainers.TRAINER_CLASSES} >= {"scst", "reinforce", "mrt", "mixer", "distill",
                                                                  "best_of_n"}
