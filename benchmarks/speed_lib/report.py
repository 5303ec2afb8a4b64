"""The speed benchmark's results: the JSON with the settings and command that produced it, the ratios of each
hf-seqrl arm to its reference and to cross-entropy, and the printed tables."""

from __future__ import annotations

import json
import os
import sys

import torch

from .models import TASKS

def write_results(args, results: list[dict], seconds: float) -> None:
    """Writes the results so far, with the settings that produced them, to `args.output`."""
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump({"device": args.device, "quick": args.quick, "tasks": TASKS, "torch": torch.__version__,
                   "threads": args.threads, "command": " ".join(["python", "benchmarks/speed.py", *sys.argv[1:]]),
                   "wall_s": round(seconds, 1), "results": results}, f, indent=1)


def ratios(row: dict, results: list[dict]) -> dict[str, float]:
    """Returns an hf-seqrl arm's step time and decode time over the reference arm's with the same samples per
    source (the reference decodes with `generate`), and its peak memory over the cross-entropy step's."""
    nan = float("nan")
    same = {r["arm"]: r for r in results if r["shape"] == row["shape"] and r["task"] == row["task"]}
    ref = same.get(row["arm"].replace("seqrl", "reference"))
    if not row["arm"].startswith("seqrl") or ref is None:
        return {"step": nan, "decode": nan, "memory": nan}
    xe_peak = same["xe"]["peak_mem_mib"] if "xe" in same else nan
    return {"step": row["step_s"] / ref["step_s"],
            "decode": row["parts_s"]["decode"] / ref["parts_s"]["decode"],
            "memory": row["peak_mem_mib"] / max(xe_peak, 1e-9)}


def print_table(results):
    header = (f"{'shape':13s} {'task':13s} {'arm':15s} {'step s':>8s} {'decode':>7s} {'reward':>7s} "
              f"{'fwd/bwd':>7s} {'other':>7s} {'peak MiB':>9s} {'vs ref':>7s} {'decode vs':>9s} {'mem vs XE':>9s} "
              f"{'mem/logits':>10s} {'syncs/tok':>9s}")
    print(header)
    print("-" * len(header))
    for row in results:
        ratio = ratios(row, results)
        p = row["parts_s"]
        syncs = row.get("syncs_per_token")
        print(f"{row['shape']:13s} {row['task']:13s} {row['arm']:15s} {row['step_s']:8.3f} {p.get('decode', 0):7.3f} "
              f"{p.get('reward', 0):7.3f} {p.get('forward_backward', 0):7.3f} {p.get('other', 0):7.3f} "
              f"{row['peak_mem_mib']:9.0f} {ratio['step']:7.2f} {ratio['decode']:9.2f} {ratio['memory']:9.2f} "
              f"{row['peak_over_logits']:10.2f} {'' if syncs is None else f'{syncs:.2f}':>9s}")


def write_rollout_batching(args, rows: dict, shape: str, task: str, batch: int, repeats: int, seconds: float,
                           output: str) -> None:
    """Prints the rollout-batching table (each arm against decoding per micro-batch) and writes its JSON to `output`."""
    base = rows["per_micro_batch"]
    print(f"{'arm':16s} {'steps/gen':>9s} {'rows/decode':>11s} {'decode s':>9s} {'ms/token':>9s} {'step s':>8s} "
          f"{'decode vs':>9s} {'step vs':>8s}")
    for arm, row in rows.items():
        row["decode_vs_per_micro_batch"] = row["decode_s"] / base["decode_s"]
        row["step_vs_per_micro_batch"] = row["step_s"] / base["step_s"]
        print(f"{arm:16s} {row['steps_per_generation']:9d} {batch * row['steps_per_generation']:11d} "
              f"{row['decode_s']:9.3f} {row['decode_ms_per_token']:9.3f} {row['step_s']:8.3f} "
              f"{row['decode_vs_per_micro_batch']:9.2f} {row['step_vs_per_micro_batch']:8.2f}")
    os.makedirs(os.path.dirname(output), exist_ok=True)
    with open(output, "w") as f:
        json.dump({"device": args.device, "quick": args.quick, "shape": shape, "task": task, "batch": batch,
                   "gradient_accumulation_steps": 4, "max_new_tokens": TASKS[task]["tgt_len"], "threads": args.threads,
                   "timed_steps_per_round": repeats, "rounds": args.rounds, "torch": torch.__version__,
                   "command": " ".join(["python", "benchmarks/speed.py", *sys.argv[1:]]),
                   "wall_s": round(seconds, 1), "arms": rows}, f, indent=1)
    print(f"\nwrote {output}")
