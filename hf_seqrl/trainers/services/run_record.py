"""What trained a model, said once for the model card, `seqrl_run.json` and the checkpoints: a trainer's identity (its
algorithm, method, objective and baseline), plain cross-entropy's when a run never reached the trainer's own loss, and
the warnings when a run is cross-entropy only or a resume changes what trains. Pure functions of plain values."""

from __future__ import annotations

from ...papers import Method

# Plain cross-entropy (the `Seq2SeqTrainer` loss): every trainer's warm-up, `CrossEntropyTrainer`'s whole loss, and what
# a run whose steps never reached a trainer's own loss trained with.
CROSS_ENTROPY_ID = "xe"
CROSS_ENTROPY = Method("Cross-entropy", "cross-entropy", "maximum likelihood with teacher forcing")


def cross_entropy_reason(algorithm_id: str, warmup_xe_steps: int, steps: int, own_loss_off: str | None) -> str | None:
    """Returns why a run of `steps` optimizer steps of the trainer `algorithm_id` is plain cross-entropy fine-tuning
    though the trainer has a loss of its own: its warm-up covers every step (`0 < steps <= warmup_xe_steps`), or
    `own_loss_off` (the settings leave nothing of that loss); None when the loss runs, or when the trainer is plain
    cross-entropy itself (`CROSS_ENTROPY_ID`)."""
    if algorithm_id == CROSS_ENTROPY_ID:
        return None
    if 0 < steps <= warmup_xe_steps:
        return f"warmup_xe_steps={warmup_xe_steps} covers all {steps} optimizer steps of the run"
    return own_loss_off


def trainer_identity(trainer: str, algorithm_id: str, method: Method, baseline: str | None) -> dict:
    """Returns what a trainer is set to train with, as its checkpoints record it: `trainer` (the class name),
    `algorithm` (its `algorithm_id`), `method` and `objective` (its `Method`'s name and description) and `baseline`
    (the baseline of its reward; None without one)."""
    return {"trainer": trainer, "algorithm": algorithm_id, "method": method.name, "objective": method.description,
            "baseline": baseline}


def training_record(identity: dict, reason: str | None, reward: str | None, teacher: str | None, steps: int,
                    warmup_xe_steps: int) -> dict:
    """Returns what trained a model, as `seqrl_run.json` says it (its `training` entry): the trainer's `identity`, or
    with a `reason` (`cross_entropy_reason`) plain cross-entropy's, `cross_entropy_only` saying why; the `reward` and
    `teacher` (None where none applied), the optimizer `steps` and `warmup_xe_steps`."""
    if reason is not None:
        identity = {**trainer_identity(identity["trainer"], CROSS_ENTROPY_ID, CROSS_ENTROPY, None),
                    "cross_entropy_only": reason}
        reward = teacher = None
    return {**identity, "reward": reward, "teacher": teacher, "steps": steps, "warmup_xe_steps": warmup_xe_steps}


def cross_entropy_warning(trainer: str, method: str, reason: str) -> str:
    """Returns the warning of a run that never reaches the trainer's (`trainer`, running `method`) own loss."""
    return (f"{trainer}: {reason}, so every step is plain cross-entropy and {method} never runs; the model card and "
            f"seqrl_run.json will say cross-entropy fine-tuning. Lower warmup_xe_steps below the run's steps for "
            f"{method} steps, or train with CrossEntropyTrainer (hf-seqrl train --algorithm xe) for cross-entropy "
            "alone.")


def changed_training_warning(trainer: str, method: str, checkpoint: str, recorded: dict, changes: list[str]) -> str:
    """Returns the warning of a resume whose trainer (`trainer`, running `method`) trains otherwise than the one that
    wrote `checkpoint` (its `recorded` identity; `changes`: `"name: old → new"`)."""
    return (f"{trainer}: {checkpoint} was trained by {recorded.get('trainer')} ({recorded.get('method')}), and this "
            f"run trains with {method}: {'; '.join(changes)}. Resuming continues that run's optimizer state, schedule "
            "and step count with the new settings; to train these weights with them from a fresh start, load the "
            "checkpoint as the model and train without resume_from_checkpoint.")
