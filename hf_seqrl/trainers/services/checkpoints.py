"""What a trainer adds to a `checkpoint-N` folder: the state file that marks it complete, written last and atomically,
with the record of what trained it; how a resumed run finds the newest complete checkpoint, and what it changes."""

from __future__ import annotations

import json
import os
import re

from accelerate.utils import gather_object
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ...evaluation import settings_changes
from ...rewards import RewardError

STATE_FILE = "seqrl_state.json"
# The state file's record of what trained the checkpoint (`SeqRLBaseTrainer.trainer_identity`).
TRAINED_BY = "trained_by"


def last_complete_checkpoint(folder: str) -> str | None:
    """Returns the newest `checkpoint-N` in `folder` whose writing finished, or None.

    A checkpoint counts once `seqrl_state.json` exists: hf-seqrl writes it atomically after everything else,
    so a process killed mid-save leaves a folder that is skipped here.
    """
    if not os.path.isdir(folder):
        return None
    steps = []
    for name in os.listdir(folder):
        match = re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)", name)
        if match and os.path.isfile(os.path.join(folder, name, STATE_FILE)):
            steps.append((int(match.group(1)), name))
    return os.path.join(folder, max(steps)[1]) if steps else None


def checkpoint_step(folder: str) -> int | str:
    """Returns the optimizer steps a checkpoint folder holds (its `trainer_state.json`), or "?" when it says none."""
    try:
        with open(os.path.join(folder, "trainer_state.json")) as f:
            return int(json.load(f)["global_step"])
    except (OSError, ValueError, KeyError):
        return "?"


def check_processes_agree(args, resume_from_checkpoint, latest: str | None) -> None:
    """Raises on every process alike, on a job of several processes, when they would not resume from the same
    checkpoint or when `save_on_each_node` spans machines (a collective: every process calls it).

    `resume_from_checkpoint` is the `train` argument and `latest` the newest complete checkpoint this process found
    when it is True. Each process reads the checkpoint from its own machine's disk; one that found none would fail
    alone and leave the others waiting in their first collective."""
    resuming = resume_from_checkpoint is True or isinstance(resume_from_checkpoint, str)
    if args.world_size == 1 or not (resuming or args.save_on_each_node):
        return
    if isinstance(resume_from_checkpoint, str):
        latest = resume_from_checkpoint if os.path.isdir(resume_from_checkpoint) else None
    name = None if latest is None else os.path.basename(os.path.normpath(latest))
    seen = gather_object([(args.process_index == args.local_process_index, name)])
    if args.save_on_each_node:
        check_save_on_each_node([first_machine for first_machine, _ in seen])
    if resuming:
        check_same_checkpoint([found for _, found in seen], args.output_dir)


def check_save_on_each_node(on_first_machine: list[bool]) -> None:
    """Raises when `save_on_each_node=True` on a job whose processes do not all run on its first machine
    (`on_first_machine[i]`: process i does): transformers' `save_pretrained` writes the weights on the job's first
    process only, so the other machines' checkpoints would hold everything but the model and could not be resumed."""
    if not all(on_first_machine):
        raise ValueError("save_on_each_node=True on a job of several machines: transformers writes the model's weights "
                         "on the job's first process only, so the other machines' checkpoints would hold no weights "
                         "and could not be resumed from. Leave save_on_each_node off and put output_dir on storage "
                         "every machine shares.")


def check_same_checkpoint(found: list[str | None], output_dir: str) -> None:
    """Raises unless every process found the same checkpoint folder to resume from (`found[i]`: the name of the one
    process i found, None for none)."""
    if len(set(found)) <= 1:
        return
    where = "; ".join(f"{name or 'none'} on process(es) {[i for i, f in enumerate(found) if f == name]}"
                      for name in dict.fromkeys(found))
    raise ValueError(f"resume_from_checkpoint: the processes did not find the same checkpoint ({where}): the "
                     f"machines do not share {output_dir}. Put output_dir on storage every machine shares (the "
                     "checkpoints are written once, by the job's first process), or copy the checkpoint folder to the "
                     "same path on every machine.")


def write_state(folder: str, state: dict) -> None:
    """Writes `state` (a trainer's `extra_state`) as the folder's state file, atomically: its presence marks the
    checkpoint as complete, so it is written after everything else."""
    tmp = os.path.join(folder, STATE_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, os.path.join(folder, STATE_FILE))


def read_state(folder: str) -> dict | None:
    """Returns the state file of a checkpoint folder, or None when it has none (a checkpoint of another trainer)."""
    path = os.path.join(folder, STATE_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def training_changes(folder: str, current: dict) -> list[str]:
    """Returns `"name: old → new"` for each entry of `current` (the resuming trainer's `trainer_identity`: algorithm,
    method, objective, baseline) that differs from what trained the checkpoint `folder` (its state file's
    `TRAINED_BY`; the trainer class is not compared, it names what trains); empty when the checkpoint records
    nothing (one of another trainer)."""
    recorded = (read_state(folder) or {}).get(TRAINED_BY)
    if not isinstance(recorded, dict):
        return []
    return settings_changes(recorded, current, ignore=("trainer",))


def checkpoint_on_error(error: RewardError, args, done: int, training: bool, save) -> RewardError:
    """Returns `error` with what `save_on_error` did: during training (`training`) on one process, `save()` first
    writes a checkpoint of the `done` optimizer steps, and the message says how to resume from it."""
    if not (args.save_on_error and training):
        return error
    if args.world_size > 1:
        return RewardError(f"{error} (save_on_error writes no checkpoint on {args.world_size} processes: the "
                           "others wait in a collective; resume from the last scheduled checkpoint.)")
    if done == 0:
        return RewardError(f"{error} (no step was done yet, so there is no checkpoint to write.)")
    save()
    folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{done}")
    return RewardError(f"{error}. The {done} steps done are saved in {folder} (save_on_error): fix the reward, "
                       f"then resume with resume_from_checkpoint={folder!r} (hf-seqrl train ... "
                       f"--resume_from_checkpoint {folder}).")
