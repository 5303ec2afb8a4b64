#!/usr/bin/env python
"""Distillation benchmark on Multi30k de->en: does a small student taught on its own samples beat word- and
sequence-level KD, and more cross-entropy, at an equal budget of student decoder positions?

    python benchmarks/distillation.py                     # the table, on 2 CPU cores (--jobs 2 --threads 1)
    python benchmarks/distillation.py --quick             # smoke run on a slice (minutes; also a test)
    python benchmarks/distillation.py --device cuda       # C as the student, the quality benchmark's teacher, on a GPU

Protocol (the quality benchmark's machinery, `quality_lib`, at a teacher:student ratio two cores finish)
1. Teacher: a C of the quality benchmark's sizes (d 128, ffn 512, 3+3 layers), trained by C's protocol (cross-entropy
   to the dev plateau, then annealed). Student C: a smaller C (`STUDENT`) trained by the same protocol on the same
   tokenizer. Both are scored on test (greedy, beam 4) with the exposure diagnostics; the results file says whether the
   teacher is `TEACHER_GAP` test BLEU above the student C.
2. The teacher's beam-4 decodes of every training source (sequence-level KD's targets), decoded once.
3. From the student C, `ARMS` x seeds units, each with the same budget of student decoder positions: more
   cross-entropy, word-level KD on gold prefixes, sequence-level KD on the teacher's decodes, on-policy reverse KL
   (lambda 1, beta 1), GKD (lambda 0.5, JSD beta 0.5), SCST on BLEU, on-policy distillation plus BLEU. Each unit is
   scored on dev and test (greedy, beam 4) with the diagnostics (horizon gap) of its student on test sources; the
   teacher's decoder positions are counted apart.

Every stage and unit is cached in the work directory (benchmarks/cache/distillation_translation[...]): rerunning the
same command resumes where a run stopped. Each stage's wall-clock (of the invocation that finished it) goes into the
results file, benchmarks/results/distillation_translation.json, with the command.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, replace
from types import SimpleNamespace

from quality_lib import (SETTINGS, checkpoint_c, evaluate, load_model, run_arm, task_data,
                         teacher_checkpoint, teacher_dir, teacher_outputs, write_dev_results, write_json)
from quality_lib.pool import cached
from quality_lib.report import format_markdown, format_table
from quality_lib.settings import TEACHER_FIELDS, run_tag
from quality_lib.stages import (Stages, arms_summary, benchmark_parser, prepare_run, run_units_stage,
                                work_dir_of)

ARMS = ("xe", "kd_word", "kd_seq", "distill", "gkd", "scst", "distill_bleu")
ON_POLICY_ARMS = ("distill", "gkd", "distill_bleu")
OFF_POLICY_KD_ARMS = ("kd_word", "kd_seq")
TEACHER_GAP = 2.0  # test BLEU (greedy) the teacher should hold over the student C
# CPU: the student a smaller C, the teacher a C of the quality benchmark's sizes.
STUDENT = {"d_model": 64, "ffn": 256, "layers": 2, "heads": 4}
TEACHER = {"teacher_d_model": 128, "teacher_ffn": 512, "teacher_layers": 3, "teacher_heads": 4}
# What every arm shares: the learning rates the quality benchmark chose on dev, the budget sized to the 2-core run
# (benchmarks/README.md, "Distillation benchmark").
ARM_SETTINGS = {"arm_lr": 5e-5, "rl_lr": 5e-5, "center_advantages": True, "budget_positions": 1_000_000,
                "seeds": (0, 1, 2)}
# --quick: the quick C's slice and steps, a student smaller again, a teacher of the quick C's sizes.
QUICK = {"d_model": 32, "ffn": 64, "layers": 1, "heads": 2, "teacher_d_model": 64, "teacher_ffn": 128,
         "teacher_layers": 1, "teacher_heads": 4, "c_max_steps": 80, "anneal_max_steps": 40, "eval_every": 20,
         "budget_positions": 4000, "seeds": (0,)}


def protocol_settings(quick: bool, device: str):
    """Returns the benchmark's settings: on CPU the `STUDENT` / `TEACHER` sizes; on cuda today's C as the student
    and the quality benchmark's default teacher, with the quality benchmark's budget."""
    base = replace(SETTINGS[("translation", quick)], device=device)
    if quick:
        return replace(base, **{**ARM_SETTINGS, **QUICK})
    if device == "cuda":
        return replace(base, **{**ARM_SETTINGS, "budget_positions": 3_000_000})
    return replace(base, **STUDENT, **TEACHER, **ARM_SETTINGS)


def default_work_dir(quick: bool, device: str) -> str:
    return work_dir_of("distillation_translation", quick, device)


def build_parser():
    return benchmark_parser(__doc__.split("\n")[0], "distillation_translation", ARMS, '',
                            "cpu: the student and teacher sizes above; cuda: today's C as the student and the quality benchmark's default teacher, the same protocol",
                            'budget_positions=500000 d_model=48')


def distillation_target(arms: dict, metric: str = "bleu", decoding: str = "greedy") -> dict:
    """Returns, per on-policy arm present, its gain in mean `decoding` `metric` over more cross-entropy and over the
    better (by mean) of word- and sequence-level KD, whether each gain lies outside the seed spread (its worst seed
    above their best), and whether the goal (+1.0 over cross-entropy, +0.5 over the better KD, both outside the
    spread) is met."""
    out = {}
    kd = [arm for arm in OFF_POLICY_KD_ARMS if arm in arms]
    if "xe" not in arms or not kd:
        return out
    best_kd = max(kd, key=lambda a: arms[a][decoding][metric]["mean"])
    xe, other = arms["xe"][decoding][metric], arms[best_kd][decoding][metric]
    for arm in ON_POLICY_ARMS:
        if arm not in arms:
            continue
        mine = arms[arm][decoding][metric]
        gain_xe, gain_kd = round(mine["mean"] - xe["mean"], 2), round(mine["mean"] - other["mean"], 2)
        out[arm] = {"gain_over_xe": gain_xe, "outside_xe_spread": mine["min"] > xe["max"], "better_kd": best_kd,
                    "gain_over_kd": gain_kd, "outside_kd_spread": mine["min"] > other["max"],
                    "met": gain_xe >= 1.0 and mine["min"] > xe["max"] and gain_kd >= 0.5 and mine["min"] > other["max"]}
    return out


def teacher_table(teacher: dict, student: dict, parameters: dict) -> str:
    """Returns the markdown rows of the teacher and the student C: test BLEU / chrF greedy and beam 4, dev BLEU,
    horizon gap, parameters."""
    head = ["model", "parameters", "greedy bleu", "greedy chrf", "beam4 bleu", "beam4 chrf", "dev bleu",
            "horizon_gap"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, scores in (("teacher", teacher), ("student C", student)):
        cells = [f"{parameters[name]:,}"] + [f"{scores[d][m]:.2f}" for d in ("greedy", "beam4") for m in ("bleu", "chrf")]
        cells += [f"{scores['dev']['bleu']:.2f}", f"{scores['diagnostics'].get('horizon_gap') or 0:.2f}"]
        lines.append("| " + " | ".join([name] + cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    """Runs the benchmark with `argv` (default sys.argv[1:]); returns its results (with `--runs-only`, the units)."""
    args = build_parser().parse_args(argv)

    import torch

    settings, overrides, work_dir, output, suffix = prepare_run(
        args, protocol_settings(args.quick, args.device), "distillation_translation", default_work_dir(args.quick, args.device))
    start, stages = time.time(), Stages(work_dir)
    # Stages named by the overrides that define them: another teacher, or other units, are timed apart.
    teacher_tag = run_tag(None, {k: v for k, v in overrides.items() if k in TEACHER_FIELDS})
    names = {"teacher": "teacher C" + teacher_tag, "student": "student C",
             "score": "score teacher and student C" + teacher_tag,
             "decode": "teacher beam-4 decode of the training sources" + teacher_tag,
             "units": "units" + run_tag(None, overrides) + suffix}

    torch.set_num_threads(args.c_threads)
    splits, tokenizer, dataset = task_data(settings, args.data_dir, work_dir)
    folder = teacher_dir(settings, work_dir)
    annealed = "C" if settings.anneal_lr is None else "C_annealed"
    teacher_record, teacher_folder = stages.run(
        names["teacher"], os.path.exists(os.path.join(folder, annealed, "record.json")),
        lambda: teacher_checkpoint(settings, splits, tokenizer, dataset, work_dir))
    c_record, c_folder = stages.run(
        names["student"], os.path.exists(os.path.join(work_dir, annealed, "record.json")),
        lambda: checkpoint_c(settings, splits, tokenizer, dataset, work_dir))
    units = [(arm, seed, os.path.join(work_dir, "runs", f"{arm}_seed{seed}{run_tag(arm, overrides)}{suffix}.json"))
             for seed in settings.seeds for arm in args.arms]

    def unit(arm: str, seed: int) -> dict:
        clock = time.time()
        record = run_arm(arm, seed, settings, splits, tokenizer, dataset, work_dir, c_folder, args.dev_only)
        return {**record, "unit_seconds": round(time.time() - clock)}

    if args.runs_only:
        torch.set_num_threads(args.threads)
        runs = [cached(path, lambda: unit(arm, seed)) for arm, seed, path in units]
        return {"runs": runs}

    # The teacher and the student C scored on test (cached with their stage's settings, as quality.py's C is).
    extra_tag = run_tag(None, {k: v for k, v in overrides.items() if k in ("beams",)})
    evaluated = [os.path.join(work_dir, "runs", f"teacher{teacher_tag}{extra_tag}.json"),
                 os.path.join(work_dir, "runs", f"C{extra_tag}.json")]
    teacher_eval, c_eval = stages.run(names["score"], all(map(os.path.exists, evaluated)), lambda: (
        cached(evaluated[0], lambda: evaluate(load_model(settings, teacher_folder), tokenizer, splits, settings,
                                              "teacher")),
        cached(evaluated[1], lambda: evaluate(load_model(settings, c_folder), tokenizer, splits, settings,
                                              "student C"))))
    gap = round(teacher_eval["greedy"]["bleu"] - c_eval["greedy"]["bleu"], 2)
    print(f"teacher {teacher_eval['greedy']['bleu']:.2f} vs student C {c_eval['greedy']['bleu']:.2f} test BLEU "
          f"(greedy): {gap:+.2f}", flush=True)
    if gap < TEACHER_GAP:
        print(f"warning: the teacher is less than {TEACHER_GAP} test BLEU above the student C: a smaller student "
              f"(--set d_model=... ffn=... layers=...) widens the gap.", flush=True)
    if "kd_seq" in args.arms:  # sequence-level KD's targets, decoded once before the units that read them
        decode_record = os.path.join(folder, "beam4_train.json")
        stages.run(names["decode"], os.path.exists(decode_record), lambda: teacher_outputs(
            settings, splits, tokenizer, load_model(settings, teacher_folder).eval(), folder))

    torch.set_num_threads(args.threads)
    runs = run_units_stage("distillation.py", args, work_dir, units, unit, stages, names["units"], start)
    command = "python benchmarks/distillation.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.dev_only:
        return write_dev_results(SimpleNamespace(task="translation", arms=args.arms), settings, overrides, command,
                                 c_eval, runs, args.output or output.replace(".json", "_dev.json"))
    summary = arms_summary(settings, c_eval, runs, ARMS)
    parameters = {"teacher": teacher_record["parameters"], "student C": c_record["parameters"]}
    target = distillation_target(summary["arms"])
    markdown = teacher_table(teacher_eval, c_eval, parameters) + "\n\n" + format_markdown(settings, summary)
    results = {"task": "translation", "quick": args.quick, "device": args.device, "overrides": overrides,
               "command": command, "data": {split: len(rows) for split, rows in splits.items()},
               "settings": asdict(settings),
               "budget": "student decoder token positions (generated + teacher-forced, padding included) per arm",
               "teacher": {"checkpoint": teacher_record, "scores": teacher_eval},
               "student_c": {"checkpoint": c_record, "scores": c_eval},
               "teacher_gap": {"greedy_bleu": gap, "met": gap >= TEACHER_GAP},
               "stage_seconds": {k: stages.seconds[k] for k in names.values() if k in stages.seconds}, **summary, "distillation_target": target,
               "horizon_gap": {arm: row["diagnostics"].get("horizon_gap", {}).get("mean")
                               for arm, row in summary["arms"].items()},
               "markdown": markdown, "runs": runs, "wall_seconds": round(time.time() - start)}
    print(format_table(settings, summary))
    print()
    print(markdown)
    print()
    print("stages (s): " + ", ".join(f"{k} {v}" for k, v in results["stage_seconds"].items()))
    for arm, check in target.items():
        print(f"{arm}: {check['gain_over_xe']:+.2f} greedy BLEU over cross-entropy (outside spread: "
              f"{check['outside_xe_spread']}), {check['gain_over_kd']:+.2f} over {check['better_kd']} (outside "
              f"spread: {check['outside_kd_spread']}); goal met: {check['met']}")
    return write_json(results, output)


if __name__ == "__main__":
    main()
