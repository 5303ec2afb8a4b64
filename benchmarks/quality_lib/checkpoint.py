"""Checkpoint C: cross-entropy until the dev metric plateaus (then, optionally, again at a lower learning rate),
cached in the work directory with the settings that define it."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import replace

from hf_seqrl.demo import xe_trainer

from .metrics import score
from .settings import Settings, stage_fields
from .task import build_model, load_model

def training_args(config_class, settings: Settings, output_dir: str, seed: int, lr: float, max_steps: int,
                  warmup_steps: int = 0, **extra):
    """Returns the arguments every phase shares: batch, data order, device, nothing reported (nor saved, unless
    `extra` says so)."""
    return config_class(**{"output_dir": output_dir, "max_steps": max_steps,
                           "per_device_train_batch_size": settings.batch_size, "learning_rate": lr,
                           "lr_scheduler_type": "constant_with_warmup", "warmup_steps": warmup_steps, "seed": seed,
                           "data_seed": seed, "logging_steps": 10, "save_strategy": "no", "report_to": [],
                           "use_cpu": settings.device == "cpu", "dataloader_pin_memory": False,
                           "disable_tqdm": False, **extra})


# The step caps a resumed stage may raise (a cap lowered, or any other field changed, is another run).
CAPS = ("c_max_steps", "anneal_max_steps")


def resume_point(settings: Settings, stage: str, partial: str) -> str | None:
    """Returns the last checkpoint of an interrupted training of `stage` in `partial` (None: start over), after
    checking it was trained with the same settings; records those settings when starting over. A raised step cap
    (`c_max_steps`, `anneal_max_steps`) continues the run: the learning rate is constant after the warm-up, so the
    steps before the old cap are those of a run with the new one."""
    from transformers.trainer_utils import get_last_checkpoint

    wanted = {name: getattr(settings, name) for name in stage_fields(stage)}
    path = os.path.join(partial, "settings.json")
    last = get_last_checkpoint(partial) if os.path.isdir(partial) else None
    if last is not None and os.path.exists(path):
        with open(path) as f:
            stored = json.load(f)
        changed = sorted(k for k in wanted if stored.get(k) != wanted[k])
        if any(k not in CAPS or stored.get(k) is None or stored[k] > wanted[k] for k in changed):
            sys.exit(f"{partial} holds an interrupted {stage} trained with other settings ({', '.join(changed)}): "
                     f"delete it to start over.")
        if changed:
            with open(path, "w") as f:
                json.dump(wanted, f)
        print(f"Resuming {stage} from {last}" + (f" with a raised cap ({', '.join(changed)})" if changed else "")
              + ".", flush=True)
        return last
    os.makedirs(partial, exist_ok=True)
    with open(path, "w") as f:
        json.dump(wanted, f)
    return None


def train_stage(settings: Settings, splits: dict, tokenizer, dataset, work_dir: str, stage: str) -> dict:
    """Trains a stage of C with cross-entropy until the dev metric plateaus, saves it in `work_dir/<stage>` and
    returns its record. Stage "C": from the initial model at `c_lr` (with warm-up). Stage "C_annealed": from
    "C" at `anneal_lr`: a model trained at a high LR still gains from a lower one, and the arms, which
    run at a lower LR, would otherwise all collect that gain, more cross-entropy most of all."""
    from transformers import Seq2SeqTrainingArguments, set_seed

    from hf_seqrl.callbacks import PlateauStopper

    set_seed(0)
    if stage == "C_annealed":
        model, lr, warmup, max_steps = load_model(settings, os.path.join(work_dir, "C")), settings.anneal_lr, 0, \
            settings.anneal_max_steps
    else:
        model, lr, warmup, max_steps = build_model(settings, tokenizer), settings.c_lr, settings.c_warmup_steps, \
            settings.c_max_steps
    metric = settings.metrics[0]

    def dev_score(m) -> float:
        value = score(m, tokenizer, splits["dev"], settings, 1, "dev")[metric]
        print(f"{stage} dev {metric}: {value:.2f}", flush=True)
        return value

    # Annealing starts from a good model: it is C_annealed only where it beats C on dev.
    # The stopping rule counts steps, never seconds: the same C on any device.
    stopper = PlateauStopper(dev_score, settings.eval_every, settings.patience, score_at_start=stage == "C_annealed")
    # A checkpoint at every score, the last one kept: a killed run resumes where it stopped (a teacher of several
    # times C's size trains for hours on CPU).
    partial = os.path.join(work_dir, f"{stage}.partial")
    resume = resume_point(settings, stage, partial)
    args = training_args(Seq2SeqTrainingArguments, settings, partial, 0, lr, max_steps, warmup,
                         save_strategy="steps", save_steps=settings.eval_every, save_total_limit=1)
    trainer = xe_trainer(model, tokenizer, dataset, args)
    trainer.add_callback(stopper)
    if resume is not None:
        stopper.load_state(resume)
    trainer.train(resume_from_checkpoint=resume)
    stopper.restore_best(model)
    record = {"steps_run": trainer.state.global_step, "best_step": stopper.best_step,
              f"best_dev_{metric}": stopper.best_score, "dev_history": [list(h) for h in stopper.history],
              "stop_reason": stopper.stop_reason or "max_steps", "train_seconds": round(stopper.seconds),
              "parameters": sum(p.numel() for p in model.parameters()), "learning_rate": lr,
              "criterion": f"greedy dev {metric} on {len(splits['dev'])} dev rows every {settings.eval_every} steps; "
                           f"stop after {settings.patience} evaluations without a new best, or at step "
                           f"{max_steps}; keep the best weights",
              "settings": {name: getattr(settings, name) for name in stage_fields(stage)}}
    folder = os.path.join(work_dir, stage)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with open(os.path.join(folder, "record.json"), "w") as f:
        json.dump(record, f, indent=2)
    shutil.rmtree(partial, ignore_errors=True)
    return record


def checkpoint(settings: Settings, splits: dict, tokenizer, dataset, work_dir: str, stage: str) -> dict:
    """Returns the record of a stage of C, training it unless the work directory holds one for these settings."""
    path = os.path.join(work_dir, stage, "record.json")
    if not os.path.exists(path):
        return train_stage(settings, splits, tokenizer, dataset, work_dir, stage)
    with open(path) as f:
        record = json.load(f)
    wanted = {name: getattr(settings, name) for name in stage_fields(stage)}
    # A field added after the record was written had its default's behaviour then.
    stored = {name: record["settings"].get(name, Settings.__dataclass_fields__[name].default) for name in wanted}
    if stored != wanted:
        changed = sorted(k for k in wanted if stored[k] != wanted[k])
        sys.exit(f"{os.path.dirname(path)} was trained with other settings ({', '.join(changed)}): "
                 f"pass another --work-dir or delete it to retrain C.")
    print(f"Using the cached {stage} in {os.path.dirname(path)} (step {record['best_step']}).")
    return record


def c_folder(settings: Settings, work_dir: str) -> str:
    """Returns the folder of checkpoint C, where the arms start: the annealed stage when there is one."""
    return os.path.join(work_dir, "C" if settings.anneal_lr is None else "C_annealed")


def checkpoint_c(settings: Settings, splits: dict, tokenizer, dataset, work_dir: str) -> tuple[dict, str]:
    """Returns the record of checkpoint C (the annealed one, with the first stage under "phase1") and its folder."""
    record = checkpoint(settings, splits, tokenizer, dataset, work_dir, "C")
    if settings.anneal_lr is not None:
        record = {**checkpoint(settings, splits, tokenizer, dataset, work_dir, "C_annealed"), "phase1": record}
    return record, c_folder(settings, work_dir)


def teacher_settings(settings: Settings) -> Settings:
    """Returns the settings of the distillation arms' teacher: C's, with the `teacher_*` sizes, first-stage cap,
    learning rate and dropout."""
    return replace(settings, d_model=settings.teacher_d_model, ffn=settings.teacher_ffn,
                   layers=settings.teacher_layers, heads=settings.teacher_heads,
                   c_max_steps=settings.teacher_max_steps or settings.c_max_steps,
                   c_lr=settings.teacher_lr or settings.c_lr,
                   dropout=settings.dropout if settings.teacher_dropout is None else settings.teacher_dropout)


def teacher_dir(settings: Settings, work_dir: str) -> str:
    """Returns the work directory of the teacher, inside C's (it shares C's tokenizer and data)."""
    cap = f"_s{settings.teacher_max_steps}" if settings.teacher_max_steps else ""
    lr = f"_lr{settings.teacher_lr:g}" if settings.teacher_lr else ""
    dropout = "" if settings.teacher_dropout is None else f"_p{settings.teacher_dropout:g}"
    return os.path.join(work_dir, f"teacher_d{settings.teacher_d_model}_f{settings.teacher_ffn}"
                                  f"_l{settings.teacher_layers}_h{settings.teacher_heads}{cap}{lr}{dropout}")


def teacher_checkpoint(settings: Settings, splits: dict, tokenizer, dataset, work_dir: str) -> tuple[dict, str]:
    """Returns the record and folder of the teacher: trained by C's protocol (both stages) at the teacher's sizes, on
    C's tokenizer, unless its work directory holds it."""
    return checkpoint_c(teacher_settings(settings), splits, tokenizer, dataset, teacher_dir(settings, work_dir))
