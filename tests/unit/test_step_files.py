"""One RL step reads in one direction: `RolloutTrainer.rl_loss` calls its stages in order, and the function of each
stage that a trainer runs lives in a file the step has not left yet (docs/architecture.md, "One RL step")."""

from __future__ import annotations

import ast
import inspect
import os
import textwrap

import pytest

from hf_seqrl import DistillationTrainer, MRTTrainer, ReinforceTrainer, SCSTTrainer
from hf_seqrl.trainers.rollout import RolloutTrainer

STAGES = ("stored_batch", "rollout", "rollout_batch", "score_batch", "algorithm_loss", "cross_entropy_term",
          "finish_loss")


def stage_calls() -> list[str]:
    """Returns the `self.<stage>(...)` calls of `RolloutTrainer.rl_loss`, in the order they appear."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(RolloutTrainer.rl_loss)))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"]
    return [call.func.attr for call in sorted(calls, key=lambda call: (call.lineno, call.col_offset))]


def stage_files(trainer: type) -> list[str]:
    """Returns the file of the function each stage of `trainer` runs, in the order of the stages."""
    return [os.path.basename(inspect.getsourcefile(getattr(trainer, stage))) for stage in STAGES]


def left_and_entered_again(files: list[str]) -> list[str]:
    """Returns the files of `files` that the sequence enters again after it left them."""
    left, again = set(), []
    for before, file in zip(files, files[1:]):
        if file != before:
            left.add(before)
            if file in left:
                again.append(file)
    return again


def test_rl_loss_calls_the_stages_in_order():
    assert [name for name in stage_calls() if name in STAGES] == list(STAGES)


def test_a_file_entered_again_is_found():
    assert left_and_entered_again(["a.py", "a.py", "b.py", "c.py"]) == []
    assert left_and_entered_again(["a.py", "b.py", "a.py"]) == ["a.py"]


@pytest.mark.parametrize("trainer, files", [
    (SCSTTrainer, ["rollout.py"] * 4 + ["policy_gradient.py"] + ["loss_tail.py"] * 2),
    (ReinforceTrainer, ["rollout.py"] * 4 + ["policy_gradient.py"] + ["loss_tail.py"] * 2),
    (MRTTrainer, ["rollout.py"] + ["mrt.py"] * 5 + ["loss_tail.py"]),
    (DistillationTrainer, ["rollout.py"] + ["distillation.py"] * 5 + ["loss_tail.py"]),
])
def test_each_stage_of_a_step_is_read_in_a_file_the_step_has_not_left(trainer, files):
    # SCST, leave-one-out (SCSTTrainer with baseline="mean") and clipped reuse (num_iterations > 1) share one class:
    # reuse is the head's (`stored_batch` and `score_batch` in rollout.py), not an override.
    assert stage_files(trainer) == files
    assert left_and_entered_again(files) == []
