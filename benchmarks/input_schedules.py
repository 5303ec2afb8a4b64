"""Cost of one training step of the input-schedule trainers, relative to teacher forcing.

Times the loss and its backward pass (no optimizer step) of each trainer's `compute_loss` on one batch, with the
models of `benchmarks/speed.py` built from configs (random weights, word-level tokenizer), all targets of the
same length. Arms run round-robin, so a load that drifts over the run hits every arm alike; times are medians.
`rows` is the number of decoder rows of the gradient pass per source.

    python benchmarks/input_schedules.py --quick          # t5-mini only, about a minute on 2 CPU cores
    python benchmarks/input_schedules.py                  # t5-mini and t5-small
    python benchmarks/input_schedules.py --device cuda

Writes benchmarks/results/input_schedules.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from speed_lib import models as speed_models  # noqa: E402  (the model builder of the speed benchmark)

# A model smaller than the speed benchmark's, for --quick; added to its shapes when this benchmark runs.
T5_MINI = dict(arch="t5", d_model=64, layers=2, heads=2, ffn=128, vocab=1000)

ARMS = {  # name: (trainer, config fields)
    "teacher forcing": ("ks", dict(rollout_steps=1)),
    "scheduled sampling ε=0.5": ("ss", dict(schedule="constant", min_teacher_forcing_ratio=0.5)),
    "prefix corruption σ=0.15, random": ("pc", dict(corruption_rate=0.15)),
    "prefix corruption σ=0.15, model": ("pc", dict(corruption_rate=0.15, replacement="model")),
    "noise-level forcing σ=0.3, random": ("pc", dict(corruption_rate=0.3, per_token_levels=True)),
    **{f"k-step exact k={k}": ("ks", dict(rollout_steps=k)) for k in (2, 4, 8)},
    **{f"k-step shared_row k={k}": ("ks", dict(rollout_steps=k, rollout_context="shared_row")) for k in (2, 4, 8)},
}


def build_trainer(kind: str, fields: dict, model, tokenizer, device: str):
    from hf_seqrl import (KStepRolloutConfig, KStepRolloutTrainer, PrefixCorruptionConfig, PrefixCorruptionTrainer,
                          ScheduledSamplingConfig, ScheduledSamplingTrainer)

    config_cls, trainer_cls = {"ks": (KStepRolloutConfig, KStepRolloutTrainer),
                               "pc": (PrefixCorruptionConfig, PrefixCorruptionTrainer),
                               "ss": (ScheduledSamplingConfig, ScheduledSamplingTrainer)}[kind]
    args = config_cls(output_dir=tempfile.mkdtemp(), report_to=[], use_cpu=not speed_models.on_accelerator(device), **fields)
    return trainer_cls(model=model, args=args, processing_class=tokenizer)


def time_step(trainer, model, batch, device: str) -> tuple[float, float]:
    """Returns (seconds of loss + backward, decoder rows per source) of one step."""
    model.zero_grad(set_to_none=True)
    speed_models.synchronize(device)
    start = time.perf_counter()
    trainer.compute_loss(model, dict(batch)).backward()
    speed_models.synchronize(device)
    seconds = time.perf_counter() - start
    rows = trainer._metrics["train"].get("ks/rows_per_source", [1.0])[-1]
    trainer._metrics["train"].clear()
    return seconds, rows


def run_shape(shape: str, batch_size: int, target_length: int, repeats: int, device: str) -> list[dict]:
    model, tokenizer = speed_models.build(shape, device)
    speed_models.TASKS["input_schedules"] = dict(src_len=32, tgt_len=target_length)
    src, attn, labels, _ = speed_models.batch_for("input_schedules", batch_size, speed_models.SHAPES[shape]["vocab"], device)
    batch = {"input_ids": src, "attention_mask": attn, "labels": labels}
    trainers = {name: build_trainer(kind, fields, model, tokenizer, device) for name, (kind, fields) in ARMS.items()}
    times = {name: [] for name in ARMS}
    rows = {}
    for repeat in range(repeats + 1):
        for name, trainer in trainers.items():
            torch.manual_seed(repeat)
            seconds, rows[name] = time_step(trainer, model, batch, device)
            if repeat:  # the first round warms up allocators and caches
                times[name].append(seconds)
    base = statistics.median(times["teacher forcing"])
    return [{"shape": shape, "arm": name, "batch": batch_size, "target_length": target_length,
             "step_s": statistics.median(times[name]), "vs_teacher_forcing": statistics.median(times[name]) / base,
             "rows_per_source": rows[name]} for name in ARMS]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu", help="a torch device: cpu, cuda, cuda:1, ...")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--target-length", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5, 3 with --quick)")
    parser.add_argument("--output", default=os.path.join(HERE, "results", "input_schedules.json"))
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    speed_models.SHAPES.setdefault("t5-mini", T5_MINI)
    shapes = ["t5-mini"] if options.quick else ["t5-mini", "t5-small"]
    repeats = options.repeats or (3 if options.quick else 5)
    results = [row for shape in shapes
               for row in run_shape(shape, options.batch, options.target_length, repeats, options.device)]
    command = " ".join(["python", "benchmarks/input_schedules.py", *sys.argv[1:]])
    meta = {"device": options.device, "threads": options.threads, "torch": torch.__version__, "repeats": repeats}
    os.makedirs(os.path.dirname(options.output), exist_ok=True)
    with open(options.output, "w") as f:
        json.dump({"command": command, "settings": meta, "results": results}, f, indent=1)
    print(f"batch {options.batch}, target length {options.target_length}, {options.device}, "
          f"{options.threads} thread(s), median of {repeats}")
    print("| shape | arm | step s | vs teacher forcing | rows |\n|---|---|---|---|---|")
    for row in results:
        print(f"| {row['shape']} | {row['arm']} | {row['step_s']:.4f} | {row['vs_teacher_forcing']:.2f}× "
              f"| {row['rows_per_source']:g} |")


if __name__ == "__main__":
    main()
