"""The report as files (`diagnostics.json`, `diagnostics.png`) and as a plain-text table."""

from __future__ import annotations

import json
import os

from .plot import plot_diagnostics

SUMMARY_KEYS = ("tf_nll", "tf_accuracy", "free_metric", "length_ratio", "never_stopped_rate", "horizon_gap",
                "horizon_accuracy_gap", "recovery_rate", "recovery_delay", "metric_drop", "source_nll_gap",
                "distinct_rate", "jacobian_growth")


def write_report(report: dict, output_dir: str) -> dict[str, str]:
    """Returns the paths `{"json": ..., "png": ...}` of `diagnostics.json` and `diagnostics.png` in `output_dir`."""
    os.makedirs(output_dir, exist_ok=True)
    paths = {"json": os.path.join(output_dir, "diagnostics.json"), "png": os.path.join(output_dir, "diagnostics.png")}
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, allow_nan=False)
    plot_diagnostics(report, paths["png"])
    return paths


def format_summary(report: dict) -> str:
    """Returns a plain-text table of the headline numbers (metrics 0-100), how many greedy outputs never stopped, the
    gold rule, the horizon curves and the recovery per position."""
    def row(values, widths=(5, 7, 10, 10, 10, 10, 10)):
        cells = ["-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v) for v in values]
        return "".join(f"{cell:>{width}}" for cell, width in zip(cells, widths))

    lines = [f"{key:<22}{row([report['summary'].get(key)], (10,))}" for key in SUMMARY_KEYS]
    gap, config = report["gap"], report.get("config", {})
    if "never_stopped" in gap:
        budgets = sorted(set(config.get("decode_budgets") or []))
        span = "" if len(budgets) < 2 else f"-{budgets[-1]}"
        budget = f" within {budgets[0]}{span} new tokens" if budgets else ""
        lines += ["", f"{gap['metric']} (free_metric, clean / injected / drop below) on 0-100; "
                      f"{gap['never_stopped']} of {gap['num_examples']} greedy outputs never stopped (no EOS{budget})"]
    if "gold" in config:
        lines += ["", f"gold target: {config['gold']}; not the first reference in "
                      f"{gap['gold_not_first']} of {gap['num_examples']} rows"]
    lines += ["", row(["k", "count", "tf_acc", "free_acc", "tf_nll", "free_nll"])]
    lines += [row([r[key] for key in ("k", "count", "tf_accuracy", "free_accuracy", "tf_nll", "free_nll")])
              for r in report["horizon"]]
    lines += ["", row(["j", "count", "recovery", "delay", "clean", "injected", "drop"])]
    lines += [row([r[key] for key in ("j", "count", "recovery_rate", "mean_tokens_to_rejoin", "clean_metric",
                                      "injected_metric", "metric_drop")]) for r in report["recovery"]]
    return "\n".join(lines)
