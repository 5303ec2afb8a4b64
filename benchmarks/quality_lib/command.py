"""Quality benchmark on real data: does sequence-level training beat more cross-entropy at equal compute?

The command line of `benchmarks/quality.py`: train (or load) checkpoint C, run the arm units (in `--jobs` worker
processes while this one scores C), then summarize them into the results file.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, replace

from .checkpoint import checkpoint_c, teacher_checkpoint
from .metrics import evaluate, flagged_changes, score
from .pool import cached, run_units
from .report import format_markdown, format_table, summarize, write_dev_results, write_json
from .settings import (ANNEAL_FIELDS, ARMS, C_FIELDS, DEFAULT_DATA, HERE, SETTINGS, TEACHER_ARMS, TEACHER_FIELDS,
                       apply_overrides, default_work_dir, run_tag)
from .task import load_model, task_data
from .units import ARM_TRAINERS, run_arm

# The entry script: worker processes run it with `--runs-only`.
SCRIPT = os.path.join(HERE, "quality.py")


def build_parser() -> argparse.ArgumentParser:
    """Returns the parser of `benchmarks/quality.py`'s arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=("translation", "summarization", "demo"), required=True)
    parser.add_argument("--quick", action="store_true", help="tiny smoke run on a slice of the data")
    parser.add_argument("--data-dir", default=DEFAULT_DATA)
    parser.add_argument("--work-dir", default=None, help="cache of C and finished runs "
                        "(default benchmarks/cache/quality_<task>[_quick])")
    parser.add_argument("--output", default=None, help="results JSON (default benchmarks/results/quality_<task>.json; "
                        "--quick writes into the work dir)")
    parser.add_argument("--arms", nargs="+", choices=list(ARM_TRAINERS), default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--runs-only", action="store_true",
                        help="train (or load) C and run the selected arm units only: no evaluation of C, no "
                        "results file. For a second process running other seeds in parallel; a final run "
                        "without it reads every cached unit and writes the results.")
    parser.add_argument("--dev-only", action="store_true",
                        help="score the arm units on dev only (greedy), to choose a variant on dev before spending "
                        "test decoding on it; runs are named *_dev, results go to quality_<task>_dev.json")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="arm units run in this many processes at once (each with --threads threads), beside "
                        "the evaluation of C in this one; default: 2 (the benchmark's 2-core budget)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the arms (1 leaves a core to the "
                        "other unit)")
    parser.add_argument("--c-threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads while C trains (alone); default: every core")
    parser.add_argument("--device", default="cpu", help="cpu (the benchmark's budget: 2 cores) or cuda; the arms' "
                        "budget is counted in decoder positions, so a run elsewhere follows the same protocol")
    parser.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE",
                        help="override settings, e.g. --set rl_weight=0.9 arm_lr=1e-4; cached runs get a suffix "
                        "naming the overrides, and overrides of C's fields (e.g. patience=6) a work directory of their "
                        "own. The results file records them (name it with --output). Compare variants on dev, not "
                        "test.")
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Runs the benchmark with `argv` (default: sys.argv[1:]) and returns its results (with `--runs-only`, the runs)."""
    args = build_parser().parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    settings = SETTINGS[(args.task, args.quick)]
    if args.seeds:
        settings = replace(settings, seeds=tuple(args.seeds))
    settings, overrides = apply_overrides(replace(settings, device=args.device), args.set)
    # Overrides of C's fields define another C: it gets its own work directory.
    c_tag = run_tag(None, {k: v for k, v in overrides.items() if k in C_FIELDS + ANNEAL_FIELDS})
    folder = {"translation": "multi30k", "summarization": "scitldr", "demo": None}[args.task]
    if folder is not None and not os.path.isdir(os.path.join(args.data_dir, folder)):
        sys.exit(f"No {folder} data in {args.data_dir}: pass --data-dir (see ../shared/data/README.md).")
    name = f"quality_{args.task}" + ("_quick" if args.quick else "")
    work_dir = args.work_dir or default_work_dir(args.task, args.quick) + c_tag
    # The results file is named by the task alone (or --output); the overrides are recorded inside it.
    output = args.output or (os.path.join(work_dir, f"{name}.json") if args.quick
                             else os.path.join(HERE, "results", f"{name}.json"))
    os.makedirs(work_dir, exist_ok=True)

    start = time.time()
    splits, tokenizer, dataset = task_data(settings, args.data_dir, work_dir)
    torch.set_num_threads(args.c_threads)
    c_record, c_folder = checkpoint_c(settings, splits, tokenizer, dataset, work_dir)
    # The distillation arms' teacher: trained here (alone, as C) before the units that read it start.
    teacher = teacher_checkpoint(settings, splits, tokenizer, dataset, work_dir) \
        if any(arm in TEACHER_ARMS for arm in args.arms) else None
    torch.set_num_threads(args.threads)
    suffix = "_dev" if args.dev_only else ""
    # C's scores are cached per set of extra metrics and of beam widths (they define what is scored).
    extra_tag = run_tag(None, {k: v for k, v in overrides.items()
                               if k in ("extra_metrics", "beams", "record_predictions")})
    units = [(arm, seed, os.path.join(work_dir, "runs", f"{arm}_seed{seed}{run_tag(arm, overrides)}{suffix}.json"))
             for seed in settings.seeds for arm in args.arms]
    pool = None
    if args.jobs > 1 and not args.runs_only:
        # Each unfinished arm unit in its own `--runs-only` process, `--jobs` at a time, while this one scores C.
        child = [sys.executable, SCRIPT, "--task", args.task, "--data-dir", args.data_dir,
                 "--work-dir", work_dir, "--threads", str(args.threads), "--device", args.device, "--runs-only"]
        child += (["--quick"] if args.quick else []) + (["--dev-only"] if args.dev_only else [])
        child += ["--set", *args.set] if args.set else []
        todo = [(arm, seed) for arm, seed, path in units if not os.path.exists(path)]
        pool = run_units(child, todo, args.jobs)
    if args.dev_only and not args.runs_only:
        c_eval = cached(os.path.join(work_dir, "runs", f"C{extra_tag}_dev.json"), lambda: {
            "dev": score(load_model(settings, c_folder), tokenizer, splits["dev"], settings, 1, "C: dev")})
    elif not args.runs_only:
        c_eval = cached(os.path.join(work_dir, "runs", f"C{extra_tag}.json"),
                        lambda: evaluate(load_model(settings, c_folder), tokenizer, splits, settings, "C"))
    if teacher is not None and not args.runs_only:
        teacher_tag = run_tag(None, {k: v for k, v in overrides.items() if k in TEACHER_FIELDS})
        teacher_eval = cached(os.path.join(work_dir, "runs", f"teacher{teacher_tag}{extra_tag}.json"),
                              lambda: evaluate(load_model(settings, teacher[1]), tokenizer, splits, settings,
                                               "teacher"))
    if pool is not None:
        pool.result()
    runs = []
    for arm, seed, path in units:
        runs.append(cached(path, lambda: run_arm(arm, seed, settings, splits, tokenizer, dataset, work_dir,
                                                 c_folder, args.dev_only)))
        print(f"done: {arm} seed {seed} ({time.time() - start:.0f} s)", flush=True)
    if args.runs_only:
        print("--runs-only: rerun without it for the evaluation of C and the results.")
        return {"runs": runs}
    command = "python benchmarks/quality.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.dev_only:
        return write_dev_results(args, settings, overrides, command, c_eval, runs, args.output or os.path.join(
            os.path.dirname(output), f"{name}_dev.json"))
    summary = summarize(settings, c_eval, runs)
    results = {"task": args.task, "quick": args.quick, "overrides": overrides, "command": command,
               "data": {split: len(rows) for split, rows in splits.items()}, "settings": asdict(settings),
               "budget": "decoder token positions (generated + teacher-forced, padding included) per arm",
               "checkpoint_c": c_record, **summary, "markdown": format_markdown(settings, summary), "runs": runs,
               "wall_seconds": round(time.time() - start)}
    if teacher is not None:
        results["teacher"] = {"checkpoint": teacher[0], "scores": teacher_eval}
    if settings.record_predictions:
        # Where the outputs moved, per run, against C's: the words token_match penalizes in C's output and the rest.
        references = [r["references"] for r in splits["test"]]
        results["flagged_changes"] = [
            {"arm": run["arm"], "seed": run["seed"],
             **flagged_changes(c_eval["greedy_predictions"], run["greedy_predictions"], references)} for run in runs]
    print(format_table(settings, summary))
    print()
    print(format_markdown(settings, summary))
    return write_json(results, output)
