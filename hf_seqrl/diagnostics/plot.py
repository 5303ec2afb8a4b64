"""The diagnostics plot: horizon curves, recovery per injected position, the empirical Jacobian and the gap, one PNG
(matplotlib)."""

from __future__ import annotations

import math


def plot_diagnostics(report: dict, path: str) -> str:
    """Returns `path` after writing a PNG: the horizon curves (accuracy, NLL), the recovery per position, the
    divergence of a perturbed input (the empirical Jacobian) and the gap in the title."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError("plot_diagnostics needs matplotlib: pip install 'matplotlib>=3.7'.") from err

    def series(rows, key):
        return [math.nan if row[key] is None else row[key] for row in rows]

    # A bare Figure on an Agg canvas leaves pyplot's global backend and figure list alone.
    fig = Figure(figsize=(21, 5.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 4)
    ks = [row["k"] for row in report["horizon"]]
    for ax, key, label in zip(axes, ("accuracy", "nll"), ("Next-token accuracy", "NLL of the gold token")):
        ax.plot(ks, series(report["horizon"], f"tf_{key}"), "o-", label="prefix = reference (teacher forcing)")
        ax.plot(ks, series(report["horizon"], f"free_{key}"), "s--", label="prefix = own greedy output")
        better = "higher" if key == "accuracy" else "lower"
        ax.set(xlabel="prefix length k (tokens)", ylabel=f"{label} ({better} is better)", title=f"{label} vs horizon")
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.02, 1.02)
    # One legend below both horizon panels, where it cannot hide a point.
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower left", ncol=2)
    rec, gap = report["recovery"], report["gap"]
    x = range(len(rec))
    # Both bars on one 0-100 axis: the recovery rate in percent beside the metric's drop (0-100 as well).
    axes[2].bar([i - 0.2 for i in x], [100 * v for v in series(rec, "recovery_rate")], 0.4, label="recovery rate (%)")
    drop_label = f"{gap['metric']} drop (clean − injected)"
    axes[2].bar([i + 0.2 for i in x], series(rec, "metric_drop"), 0.4, label=drop_label)
    axes[2].set_xticks(list(x), [f"{row['j']}\n(n={row['count']})" for row in rec])
    axes[2].axhline(0.0, color="black", linewidth=0.8)
    axes[2].set(xlabel="position j of the injected mistake", ylabel="% / metric (0–100)",
                title="Recovery from an injected mistake", ylim=(min([0.0, *series(rec, "metric_drop")]) - 5, 130))
    axes[2].grid(alpha=0.3, axis="y")
    axes[2].legend(loc="upper center", ncol=2)
    jacobian = report.get("jacobian") or {}
    curve = jacobian.get("curve") or []
    if curve:
        axes[3].semilogy([row["h"] for row in curve], [row["divergence"] for row in curve], "o-")
    growth = jacobian.get("growth_factor")
    axes[3].axhline(1.0, color="black", linewidth=0.8)
    axes[3].set(xlabel="offset h after the perturbed position k", ylabel="‖Δ hidden‖ / ‖ε‖ (log scale)",
                title="Empirical Jacobian: growth " + ("-" if growth is None else f"{growth:.3f}") + " per step"
                + ("" if growth is None else (" (amplifies)" if growth > 1 else " (contracts)")))
    axes[3].grid(alpha=0.3, which="both")
    fig.suptitle(
        f"Exposure-bias diagnostics ({gap['num_examples']} examples)\n"
        f"teacher forcing: NLL {gap['tf_nll'] or math.nan:.3f}/token, accuracy {gap['tf_accuracy'] or 0:.1%}   |   "
        f"free-running greedy: {gap['metric']} {gap['free_metric']:.2f}, length {gap['free_length']:.1f} vs "
        f"reference {gap['reference_length']:.1f} tokens, {gap['free_stopped_rate']:.0%} stopped with EOS")
    fig.savefig(path, dpi=110)
    return path
