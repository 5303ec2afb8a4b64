"""The demo's protocol: cross-entropy warm-up until the dev BLEU plateaus -> checkpoint C; from C, the same number
of steps of (a) SCST, (b) cross-entropy (plain `Seq2SeqTrainer`) and (c) scheduled sampling, with the same data
order and learning rate; greedy corpus BLEU and chrF on a held-out test split, against all references.
"""

from __future__ import annotations

import copy
import tempfile
import time
from dataclasses import asdict

from .task import DemoSettings, build_model, build_tokenizer, make_task, to_dataset

ARMS = ("warmup", "scst", "xe", "ss")
ARM_TITLES = {"warmup": "C: cross-entropy warm-up", "scst": "C + SCST", "xe": "C + cross-entropy",
              "ss": "C + scheduled sampling"}


def greedy_scores(model, tokenizer, rows: list[dict], desc: str) -> dict[str, float]:
    """Returns greedy corpus BLEU and chrF of `model` on `rows`, against all references of each source."""
    from ..evaluation import evaluate_model

    scores, _ = evaluate_model(model, tokenizer, [r["source"] for r in rows], [r["references"] for r in rows],
                               ("bleu", "chrf"), batch_size=100, desc=desc)
    return scores


# ---- training --------------------------------------------------------------------------------------


def _training_args(config_class, work_dir: str, seed: int, steps: int, lr: float, settings: DemoSettings, **extra):
    """Returns trainer arguments shared by every phase: constant LR, fixed data order, nothing saved.

    The CPU is used even where an accelerator is present: kernel launches cost a model this small more
    than they save, and the table stays comparable from one machine to the next.
    """
    return config_class(output_dir=work_dir, max_steps=steps, per_device_train_batch_size=settings.batch_size,
                        learning_rate=lr, lr_scheduler_type="constant", seed=seed, data_seed=seed,
                        logging_steps=max(steps // 5, 1), save_strategy="no", report_to=[], use_cpu=True,
                        dataloader_pin_memory=False, **extra)


def xe_trainer(model, tokenizer, dataset, args):
    """Returns a plain cross-entropy `Seq2SeqTrainer` (its collator pads `labels` with -100)."""
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer

    return Seq2SeqTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                          data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))


def warm_up(model, tokenizer, dataset, dev_rows, settings: DemoSettings, work_dir: str, seed: int) -> dict:
    """Trains `model` with cross-entropy until dev BLEU plateaus and loads the best weights (checkpoint C).

    Returns the warm-up record: steps run, the step of C, and the dev BLEU history.
    """
    from transformers import Seq2SeqTrainingArguments

    from ..callbacks import PlateauStopper

    args = _training_args(Seq2SeqTrainingArguments, work_dir, seed, settings.max_warmup_steps, settings.warmup_lr,
                          settings)
    trainer = xe_trainer(model, tokenizer, dataset, args)
    stopper = PlateauStopper(lambda m: greedy_scores(m, tokenizer, dev_rows, "dev BLEU")["bleu"],
                             settings.eval_every, settings.patience)
    trainer.add_callback(stopper)
    trainer.train()
    stopper.restore_best(model)
    return {"steps_run": trainer.state.global_step, "steps": stopper.best_step or trainer.state.global_step,
            "dev_bleu_history": [(step, round(bleu, 2)) for step, bleu in stopper.history],
            "criterion": f"dev greedy BLEU every {settings.eval_every} steps; stop after {settings.patience} "
                         f"evaluations without a new best (cap {settings.max_warmup_steps} steps); C = best"}


def train_scst(model, tokenizer, dataset, settings: DemoSettings, work_dir: str, seed: int, max_new_tokens: int):
    """Trains `model` with SCST for `settings.compare_steps` steps; returns the trainer's log history."""
    from ..configs import SeqRLConfig
    from ..trainers import SCSTTrainer

    args = _training_args(SeqRLConfig, work_dir, seed, settings.compare_steps, settings.lr, settings,
                          baseline=settings.baseline, num_samples=settings.num_samples,
                          rl_weight=settings.rl_weight, max_new_tokens=max_new_tokens)
    trainer = SCSTTrainer(model=model, args=args, reward_funcs="bleu", train_dataset=dataset,
                          processing_class=tokenizer)
    trainer.train()
    return trainer.state.log_history


def train_scheduled_sampling(model, tokenizer, dataset, settings: DemoSettings, work_dir: str, seed: int):
    """Trains `model` with scheduled sampling for `settings.compare_steps` steps; returns the log history.

    ε decays linearly from 1 to 0.5 over the first half of the steps, then stays at 0.5.
    """
    from ..configs import ScheduledSamplingConfig
    from ..trainers import ScheduledSamplingTrainer

    args = _training_args(ScheduledSamplingConfig, work_dir, seed, settings.compare_steps, settings.lr, settings,
                          schedule="linear", schedule_k=settings.compare_steps, min_teacher_forcing_ratio=0.5)
    trainer = ScheduledSamplingTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    return trainer.state.log_history


def train_xe(model, tokenizer, dataset, settings: DemoSettings, work_dir: str, seed: int):
    """Trains `model` with cross-entropy for `settings.compare_steps` steps; returns the log history."""
    from transformers import Seq2SeqTrainingArguments

    args = _training_args(Seq2SeqTrainingArguments, work_dir, seed, settings.compare_steps, settings.lr, settings)
    trainer = xe_trainer(model, tokenizer, dataset, args)
    trainer.train()
    return trainer.state.log_history


def _rl_rewards(log_history: list[dict]) -> list[float]:
    """Returns the logged mean SCST sample rewards (`rl/reward`, sentence BLEU / 100) in step order."""
    return [round(entry["rl/reward"], 4) for entry in log_history if "rl/reward" in entry]


def compare(seed: int, settings: DemoSettings):
    """Returns `(results, SCST model, tokenizer, held-out test rows)`: warm-up to C, then the arms from C."""
    from transformers import set_seed

    from ..evaluation import generate_texts

    start = time.time()
    task = make_task(seed, settings)
    tokenizer = build_tokenizer(task["words"])
    max_new_tokens = settings.max_new_tokens
    set_seed(seed)
    model = build_model(tokenizer, settings, max_new_tokens)
    dataset = to_dataset(task["train"], tokenizer)
    example = task["test"][0]
    results = {"seed": seed, "settings": asdict(settings), "arms": {},
               "task": {"dialects": settings.dialects, "train": len(task["train"]), "dev": len(task["dev"]),
                        "test": len(task["test"]), "example": example},
               "model": {"type": "MarianMTModel", "parameters": sum(p.numel() for p in model.parameters())}}

    def record(arm: str, trained, steps: int, clock: float, **extra) -> None:
        scores = greedy_scores(trained, tokenizer, task["test"], f"test: {ARM_TITLES[arm]}")
        results["arms"][arm] = {"steps": steps, "seconds": time.time() - clock, **scores,
                                "example_output": generate_texts(trained, tokenizer, [example["source"]],
                                                                 desc="example")[0],
                                **extra}

    with tempfile.TemporaryDirectory() as work_dir:
        clock = time.time()
        results["warmup"] = warm_up(model, tokenizer, dataset, task["dev"], settings, work_dir, seed)
        record("warmup", model, results["warmup"]["steps"], clock)
        xe_model = copy.deepcopy(model)  # checkpoint C, for the cross-entropy arm
        ss_model = copy.deepcopy(model)  # and for the scheduled-sampling arm

        clock = time.time()
        scst_log = train_scst(model, tokenizer, dataset, settings, work_dir, seed, max_new_tokens)
        record("scst", model, settings.compare_steps, clock, train_rewards=_rl_rewards(scst_log))

        clock = time.time()
        train_xe(xe_model, tokenizer, dataset, settings, work_dir, seed)
        record("xe", xe_model, settings.compare_steps, clock)

        clock = time.time()
        train_scheduled_sampling(ss_model, tokenizer, dataset, settings, work_dir, seed)
        record("ss", ss_model, settings.compare_steps, clock)

    results["wall_seconds"] = time.time() - start
    return results, model, tokenizer, task["test"]
