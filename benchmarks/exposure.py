#!/usr/bin/env python
"""Every remedy for exposure bias, side by side: from one plateaued cross-entropy checkpoint C, at one budget of
decoder token positions.

    python benchmarks/exposure.py --task demo             # the demo's three-dialect task (minutes)
    python benchmarks/exposure.py --task demo --quick     # smoke run (a test runs it)
    python benchmarks/exposure.py --task translation      # Multi30k de->en, the quality benchmark's C

It runs `benchmarks/quality.py` with every remedy as an arm (same protocol: C trained until the dev metric
plateaus and cached, each arm from C for the same budget of decoder positions — generated plus teacher-forced,
padding included — each arm x seed in its own process, test BLEU greedy and beam 4 against every reference, the
exposure-bias diagnostics of each run), then reads the per-step cost of each arm against teacher forcing
(seconds per optimizer step, median over seeds, divided by the cross-entropy arm's) and writes
`benchmarks/results/exposure_<task>.json` with the table. The runs are cached with the quality benchmark's, so the
arms both benchmarks share are trained once. `--set FIELD=VALUE` overrides settings as in quality.py; choose
settings on dev (`--dev-only`), never on test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import quality_lib as quality  # noqa: E402  (the protocol this benchmark runs)

# The remedies, with the per-step cost the background table gives them (teacher forcing = 1).
ARMS = {
    "xe": ("more teacher forcing (cross-entropy)", "1×"),
    "ss": ("scheduled sampling", "≈1× (two passes)"),
    "pc": ("prefix corruption (random tokens, σ 0.15)", "≈1×"),
    "noise": ("noise-level forcing (σ_t ~ U(0, 0.3))", "≈1×"),
    "kstep2": ("k-step rollout, k = 2", "k× = 2×"),
    "kstep4": ("k-step rollout, k = 4", "k× = 4×"),
    "mixer": ("MIXER", "> 1× (decode of the sampled suffix)"),
    "pf": ("professor forcing", "> 1× (decode + discriminator)"),
    "scst": ("SCST (greedy baseline)", "> 1× (decode)"),
}
DIAGNOSTICS = ("horizon_gap", "jacobian_growth", "recovery_rate")


def _cell(spread: dict | None, digits: int = 2) -> str:
    if not spread:
        return "–"
    if spread["min"] == spread["max"]:
        return f"{spread['mean']:.{digits}f}"
    return f"{spread['mean']:.{digits}f} ({spread['min']:.{digits}f}–{spread['max']:.{digits}f})"


def exposure_table(results: dict, metric: str) -> dict:
    """Returns the comparison: per arm its step cost relative to teacher forcing, test scores and diagnostics."""
    arms = results["arms"]
    cost = {arm: statistics.median(row["seconds_per_step"]["values"]) for arm, row in arms.items()}
    xe_cost = cost.get("xe") or None
    rows = []
    for arm, row in arms.items():
        rows.append({
            "arm": arm, "title": ARMS.get(arm, (arm, ""))[0], "background_cost": ARMS.get(arm, ("", "–"))[1],
            "seeds": row["seeds"], "steps": row["steps"]["mean"], "seconds_per_step": cost[arm],
            "cost_vs_teacher_forcing": round(cost[arm] / xe_cost, 2) if xe_cost else None,
            "greedy": row["greedy"][metric], "beam4": row.get("beam4", {}).get(metric),
            "dev": row.get("dev", {}).get(metric), **{key: row["diagnostics"].get(key) for key in DIAGNOSTICS}})
    c = results["C"]
    c_row = {"greedy": c["greedy"][metric], "beam4": c.get("beam4", {}).get(metric),
             "dev": c.get("dev", {}).get(metric), **{key: c["diagnostics"].get(key) for key in DIAGNOSTICS}}
    return {"metric": metric, "C": c_row, "rows": rows}


def format_markdown(table: dict) -> str:
    """Returns the table in markdown: cost per step vs teacher forcing, test metric (mean, min–max), diagnostics."""
    metric = table["metric"]
    head = ["remedy (from C)", "cost / step (measured)", "cost (background)", "steps", f"greedy {metric}",
            f"beam 4 {metric}", f"dev {metric}", "horizon gap", "Jacobian growth", "recovery rate"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    c = table["C"]
    lines.append("| C (cross-entropy to plateau) | – | – | – | " + " | ".join(
        [f"{c['greedy']:.2f}"] + ["–" if c.get(k) is None else f"{c[k]:.2f}" for k in ("beam4", "dev")]
        + ["–" if c[k] is None else f"{c[k]:.3f}" for k in DIAGNOSTICS]) + " |")
    for row in table["rows"]:
        cost = "–" if row["cost_vs_teacher_forcing"] is None else f"{row['cost_vs_teacher_forcing']:.2f}×"
        lines.append("| " + " | ".join([row["title"], cost, row["background_cost"], f"{row['steps']:.0f}",
                                        _cell(row["greedy"]), _cell(row["beam4"]), _cell(row.get("dev"))]
                                       + [_cell(row[k], 3) for k in DIAGNOSTICS]) + " |")
    return "\n".join(lines)


def cost_unit(task: str, quick: bool, arm: str, steps: int, warmup: int, assignments: list[str], work_dir: str,
              data_dir: str | None, device: str = "cpu") -> dict:
    """Times `steps` optimizer steps of one arm from the cached C (after `warmup` untimed ones), on the arm's own
    trainer and data order; returns the seconds of each timed step and the decoder positions per step."""
    import torch
    from transformers import TrainerCallback, set_seed

    torch.set_num_threads(1)
    settings, _ = quality.apply_overrides(replace(quality.SETTINGS[(task, quick)], device=device), assignments)
    splits, tokenizer, dataset = quality.task_data(settings, data_dir or quality.DEFAULT_DATA, work_dir)
    folder = quality.c_folder(settings, work_dir)
    if not os.path.isdir(folder):
        sys.exit(f"No checkpoint in {folder}: run `python benchmarks/exposure.py --task {task}` first.")
    set_seed(0)
    model = quality.load_model(settings, folder)
    lengths = [len(x) for x in dataset["labels"]]
    trainer = quality.arm_trainer(arm, model, tokenizer, dataset, settings, tempfile.mkdtemp(), 0,
                                  statistics.mean(lengths))
    trainer.args.max_steps = warmup + steps
    trainer.args.disable_tqdm = True
    counter = quality.DecoderPositions(model)
    seconds = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step > warmup:
                seconds.append(time.perf_counter() - self.start)

    trainer.add_callback(StepClock())
    trainer.train()
    return {"arm": arm, "step_seconds": seconds, "positions_per_step": counter.count / trainer.state.global_step}


def cost_main(args) -> dict:
    """Times every arm's optimizer step side by side: each arm in a fresh process, one at a time, the arms in turn
    for `--cost-rounds` rounds; the cost of an arm is its median step over teacher forcing's."""
    work_dir = args.work_dir or quality.default_work_dir(args.task, args.quick)
    per_arm = {arm: [] for arm in args.arms}
    positions = {}
    for round_index in range(args.cost_rounds):
        for arm in args.arms:
            command = [sys.executable, os.path.abspath(__file__), "--task", args.task, "--cost-unit", arm,
                       "--cost-steps", str(args.cost_steps), "--work-dir", work_dir, "--device", args.device]
            command += (["--quick"] if args.quick else []) + (["--set", *args.set] if args.set else [])
            command += ["--data-dir", args.data_dir] if args.data_dir else []
            lines = subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()
            unit = json.loads(lines[-1])
            per_arm[arm] += unit["step_seconds"]
            positions[arm] = unit["positions_per_step"]
            print(f"round {round_index + 1}: {arm} median step {statistics.median(unit['step_seconds']):.3f} s",
                  flush=True)
    median = {arm: statistics.median(values) for arm, values in per_arm.items()}
    xe_per_position = median["xe"] / positions["xe"]
    rows = [{"arm": arm, "title": ARMS[arm][0], "background_cost": ARMS[arm][1],
             "median_step_seconds": round(median[arm], 4), "positions_per_step": round(positions[arm]),
             "cost_vs_teacher_forcing": round(median[arm] / median["xe"], 2),
             "cost_per_position_vs_teacher_forcing": round(median[arm] / positions[arm] / xe_per_position, 2),
             "step_seconds": per_arm[arm]} for arm in args.arms]
    head = ["remedy", "median step s", "cost / step vs teacher forcing", "cost (background)",
            "decoder positions / step", "cost / position vs teacher forcing"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [f"| {r['title']} | {r['median_step_seconds']:.3f} | {r['cost_vs_teacher_forcing']:.2f}× | "
              f"{r['background_cost']} | {r['positions_per_step']} | "
              f"{r['cost_per_position_vs_teacher_forcing']:.2f}× |" for r in rows]
    markdown = "\n".join(lines)
    print(markdown)
    command = "python benchmarks/exposure.py " + " ".join(sys.argv[1:])
    out = {"task": args.task, "command": command, "rounds": args.cost_rounds, "timed_steps": args.cost_steps,
           "threads": 1, "overrides": args.set, "rows": rows, "markdown": markdown}
    output = args.output or (os.path.join(work_dir, "exposure_cost.json") if args.quick
                             else os.path.join(HERE, "results", f"exposure_cost_{args.task}.json"))
    return quality.write_json(out, output)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=("demo", "translation"), required=True)
    parser.add_argument("--quick", action="store_true", help="tiny smoke run")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--output", default=None, help="results JSON (default benchmarks/results/exposure_<task>.json;"
                                                         " --quick writes into the work dir)")
    parser.add_argument("--work-dir", default=None, help="cache of C and the runs (default: the quality "
                                                          "benchmark's, benchmarks/cache/quality_<task>[_quick])")
    parser.add_argument("--jobs", type=int, default=None, help="arm units at once, each in its own process "
                                                                "(default 2; --quick runs them in this process)")
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--device", default="cpu", help="cpu or cuda: where every phase runs (as quality.py's)")
    parser.add_argument("--cost", action="store_true", help="time every arm's optimizer step from the cached C, "
                        "each arm in a fresh process, the arms in turn (writes exposure_cost_<task>.json)")
    parser.add_argument("--cost-steps", type=int, default=10, help="timed steps per arm and round (after 2 more)")
    parser.add_argument("--cost-rounds", type=int, default=3)
    parser.add_argument("--cost-unit", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cost_unit:
        unit = cost_unit(args.task, args.quick, args.cost_unit, args.cost_steps, 2, args.set, args.work_dir,
                         args.data_dir, args.device)
        print(json.dumps(unit))
        return unit
    if "xe" not in args.arms:
        sys.exit("--arms must include xe: the cost of a step is measured against teacher forcing.")
    if args.cost:
        return cost_main(args)

    name = f"exposure_{args.task}" + ("_quick" if args.quick else "")
    work_dir = args.work_dir or quality.default_work_dir(args.task, args.quick)
    output = args.output or (os.path.join(work_dir, f"{name}.json") if args.quick
                             else os.path.join(HERE, "results", f"{name}.json"))
    quality_argv = ["--task", args.task, "--work-dir", work_dir, "--arms", *args.arms,
                    "--output", os.path.join(work_dir, f"{name}_quality.json"),
                    "--jobs", str(args.jobs if args.jobs is not None else (1 if args.quick else 2))]
    quality_argv += (["--quick"] if args.quick else []) + (["--seeds", *map(str, args.seeds)] if args.seeds else [])
    quality_argv += (["--set", *args.set] if args.set else []) + (["--data-dir", args.data_dir] if args.data_dir else [])
    quality_argv += ["--device", args.device]
    results = quality.main(quality_argv)
    table = exposure_table(results, results["settings"]["metrics"][0])
    markdown = format_markdown(table)
    command = "python benchmarks/exposure.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out = {"task": args.task, "quick": args.quick, "command": command, "settings": results["settings"],
           "budget": results["budget"], "checkpoint_c": results["checkpoint_c"], "table": table, "markdown": markdown,
           "runs": results["runs"], "wall_seconds": results["wall_seconds"]}
    print()
    print(markdown)
    return quality.write_json(out, output)


if __name__ == "__main__":
    main()
