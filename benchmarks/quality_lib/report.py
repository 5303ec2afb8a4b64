"""The quality benchmark's report: mean and spread over seeds per arm, the target check, the text and markdown
tables, and the results files."""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict

from .metrics import scored_metrics
from .settings import SEQUENCE_ARMS, TITLES, Settings
from .units import ARM_TRAINERS

def _spread(values: list[float]) -> dict:
    return {"mean": round(statistics.mean(values), 4), "min": min(values), "max": max(values), "values": values}


# Logged during training (means over an arm's logging steps): how many samples were cut, how far the ratios strayed.
TRAINING_KEYS = ("rl/frac_truncated", "rl/length_ratio", "rl/clip_fraction", "rl/ratio_min", "rl/ratio_max")


def training_means(runs: list[dict]) -> dict:
    """Returns per `TRAINING_KEYS` entry that every run logged the spread over runs of its mean over the run."""
    out = {}
    for key in TRAINING_KEYS:
        values = [[entry[key] for entry in r.get("curve", []) if key in entry] for r in runs]
        if all(values):
            out[key] = _spread([round(statistics.mean(v), 4) for v in values])
    return out


def summarize(settings: Settings, c_eval: dict, runs: list[dict]) -> dict:
    """Returns per arm the mean and spread of every metric, and the target check (best RL arm vs cross-entropy)."""
    decodings = ["dev"] + ["greedy" if b == 1 else f"beam{b}" for b in settings.beams]
    arms = {}
    for arm in ARM_TRAINERS:
        mine = [r for r in runs if r["arm"] == arm]
        if not mine:
            continue
        arms[arm] = {"seeds": [r["seed"] for r in mine], "steps": _spread([r["steps"] for r in mine]),
                     "train_seconds": _spread([r["train_seconds"] for r in mine]),
                     "seconds_per_step": _spread([round(r["train_seconds_exact"] / max(r["steps"], 1), 4)
                                                  for r in mine if "train_seconds_exact" in r] or [0.0])}
        for decoding in decodings:
            # (the output length too: how much of a metric change is a length change)
            arms[arm][decoding] = {m: _spread([r[decoding][m] for r in mine])
                                   for m in (*scored_metrics(settings), "length_ratio")}
        arms[arm]["training"] = training_means(mine)
        arms[arm]["positions"] = _spread([r["positions"] for r in mine])
        if all("teacher_positions" in r for r in mine):  # the distillation arms: the teacher's decoder positions
            arms[arm]["teacher_positions"] = _spread([r["teacher_positions"] for r in mine])
        arms[arm]["diagnostics"] = {key: _spread([r["diagnostics"][key] for r in mine])
                                    for key in ("free_metric", "horizon_gap", "recovery_rate", "metric_drop",
                                                "jacobian_growth")
                                    if all(r["diagnostics"].get(key) is not None for r in mine)}
    target = {}
    metric = settings.metrics[0]
    rl = [arm for arm in SEQUENCE_ARMS if arm in arms]
    if "xe" in arms and rl:
        for decoding in decodings[1:]:
            best = max(rl, key=lambda a: arms[a][decoding][metric]["mean"])
            mine, xe = arms[best][decoding][metric], arms["xe"][decoding][metric]
            gain = round(mine["mean"] - xe["mean"], 2)
            target[decoding] = {"best_rl_arm": best, "gain": gain, "outside_spread": mine["min"] > xe["max"],
                                "met": gain >= 1.0 and mine["min"] > xe["max"]}
    return {"C": c_eval, "arms": arms, "target": target}


def format_table(settings: Settings, summary: dict) -> str:
    """Returns the results table: test metrics (mean and min..max over seeds) per arm and decoding."""
    decodings = ["greedy" if b == 1 else f"beam{b}" for b in settings.beams]
    head = f"{'arm':<32}{'seeds':>6}{'steps':>7}" + "".join(f"{d + ' ' + m:>22}" for d in decodings
                                                          for m in scored_metrics(settings))
    lines = [head + f"{'dev ' + settings.metrics[0]:>14}{'recovery':>10}"]
    c = summary["C"]
    lines.append(f"{TITLES['C']:<32}{'-':>6}{'-':>7}" + "".join(f"{c[d][m]:>22.2f}" for d in decodings
                                                              for m in scored_metrics(settings))
                 + f"{c['dev'][settings.metrics[0]]:>14.2f}{c['diagnostics'].get('recovery_rate') or 0:>10.2f}")
    for arm, row in summary["arms"].items():
        cells = "".join(f"{row[d][m]['mean']:>9.2f} ({row[d][m]['min']:.1f}..{row[d][m]['max']:.1f})"
                        for d in decodings for m in scored_metrics(settings))
        recovery = row["diagnostics"].get("recovery_rate", {}).get("mean", 0.0)
        lines.append(f"{TITLES[arm]:<32}{len(row['seeds']):>6}{row['steps']['mean']:>7.0f}{cells}"
                     f"{row['dev'][settings.metrics[0]]['mean']:>14.2f}{recovery:>10.2f}")
    for decoding, check in summary["target"].items():
        lines.append(f"target ({decoding}): best RL arm {check['best_rl_arm']} {check['gain']:+.2f} "
                     f"{settings.metrics[0]} vs cross-entropy, outside seed spread: {check['outside_spread']}, "
                     f"met (>= +1.0 and outside spread): {check['met']}")
    return "\n".join(lines)


def format_markdown(settings: Settings, summary: dict) -> str:
    """Returns the README table: test scores as mean (min-max over seeds), dev score and diagnostics per arm."""
    decodings = ["greedy" if b == 1 else f"beam{b}" for b in settings.beams]
    diag = ("horizon_gap", "recovery_rate", "metric_drop")
    # With a teacher: its decoder positions and each arm's training minutes (the cost distillation adds).
    costs = any("teacher_positions" in row for row in summary["arms"].values())
    head = (["arm", "seeds", "steps"] + [f"{d} {m}" for d in decodings for m in scored_metrics(settings)]
            + [f"dev {settings.metrics[0]}"] + list(diag) + (["teacher positions", "train min"] if costs else []))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(x):
        if isinstance(x, dict):
            return f"{x['mean']:.2f}" if x["min"] == x["max"] else f"{x['mean']:.2f} ({x['min']:.2f}–{x['max']:.2f})"
        return "–" if x is None else f"{x:.2f}" if isinstance(x, float) else str(x)

    c = summary["C"]
    lines.append("| " + " | ".join([TITLES["C"], "–", "–"]
                                   + [cell(c[d][m]) for d in decodings for m in scored_metrics(settings)]
                                   + [cell(c["dev"][settings.metrics[0]])]
                                   + [cell(c["diagnostics"].get(k)) for k in diag] + ["–", "–"] * costs) + " |")
    for arm, row in summary["arms"].items():
        diagnostics = [cell(row["diagnostics"].get(k)) for k in diag]
        cost = [f"{row['teacher_positions']['mean']:,.0f}" if "teacher_positions" in row else "0",
                f"{row['train_seconds']['mean'] / 60:.1f}"] if costs else []
        lines.append("| " + " | ".join([TITLES[arm], str(len(row["seeds"])), f"{row['steps']['mean']:.0f}"]
                                       + [cell(row[d][m]) for d in decodings for m in scored_metrics(settings)]
                                       + [cell(row["dev"][settings.metrics[0]])] + diagnostics + cost) + " |")
    return "\n".join(lines)


def write_dev_results(args, settings: Settings, overrides: dict, command: str, c_eval: dict, runs: list[dict],
                      output: str) -> dict:
    """Prints and writes the dev scores of C and of each arm (mean and min..max over seeds) of a --dev-only run."""
    metric = settings.metrics[0]
    arms = {}
    for arm in args.arms:
        mine = [r for r in runs if r["arm"] == arm]
        arms[arm] = {"seeds": [r["seed"] for r in mine], "steps": _spread([r["steps"] for r in mine]),
                     "dev": {m: _spread([r["dev"][m] for r in mine]) for m in (*scored_metrics(settings), "length_ratio")},
                     "training": training_means(mine)}
    print(f"{'arm':<32}{'seeds':>6}{'steps':>7}{'dev ' + metric:>24}")
    print(f"{TITLES['C']:<32}{'-':>6}{'-':>7}{c_eval['dev'][metric]:>24.2f}")
    for arm, row in arms.items():
        cell = row["dev"][metric]
        print(f"{TITLES[arm]:<32}{len(row['seeds']):>6}{row['steps']['mean']:>7.0f}"
              f"{cell['mean']:>12.2f} ({cell['min']:.2f}..{cell['max']:.2f})")
    results = {"task": args.task, "dev_only": True, "overrides": overrides, "command": command,
               "settings": asdict(settings), "C": c_eval, "arms": arms, "runs": runs}
    return write_json(results, output)


def write_json(results: dict, output: str) -> dict:
    """Writes `results` to the JSON file `output` (its folder made), says so, and returns them."""
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {output}")
    return results
