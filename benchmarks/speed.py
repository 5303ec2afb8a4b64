"""Speed and memory of one RL step: hf-seqrl vs a straightforward SCST implementation, beside cross-entropy.

Models are built locally from configs of realistic shape (t5-small-sized, Marian-base-sized) with a synthetic
word-level tokenizer, so decoded samples are real strings of 20-60 words and rewards cost what they cost in
practice. One process per (shape, task) builds the model. The arms take turns step by step (step i of every arm,
then step i + 1), so that load from elsewhere on the machine falls on all of them alike. On CPU every arm lives in
its own child forked from the builder (peak memory: the child's high-water RSS above its RSS at the start); on GPU
the arms take turns in one process (`torch.cuda.max_memory_allocated` above the memory in use before a step).
Times are medians over repeats; compare ratios within one run.

The hf-seqrl arms time `SCSTTrainer.training_step` itself (rollout, rewards, advantages, scoring pass, backward and
the trainer's own bookkeeping; greedy baseline for `seqrl_scst`, leave-one-out over 4 samples for `seqrl_loo4`); the
reference arms are a plain loop.

Columns: `vs ref` is an hf-seqrl arm's step time over the reference arm's with as many samples per source;
`decode vs` its decode time over the reference's, whose decode is `generate(do_sample=True,
num_return_sequences=n)` (plus a greedy `generate` for SCST) on the same inputs; `mem vs XE` its peak memory over
that of the cross-entropy step on as many target sequences as the 4-sample step; `mem/logits` its peak over one
float32 logits tensor of the rows it scores (sources x samples x target length x vocabulary); `syncs/tok` the host
syncs of a whole step (`counting.SyncCounter`: `.item()`, `nonzero`, boolean indexing, ...) per decoded position.

    python benchmarks/speed.py --quick              # under 2 minutes on 2 CPU cores
    python benchmarks/speed.py                      # full table
    python benchmarks/speed.py --device cuda        # on a GPU (any torch device: cuda:1, mps, ...)

Writes benchmarks/results/speed.json and prints a table.

`--rollout-batching` times instead whole optimizer steps of `SCSTTrainer` at `gradient_accumulation_steps=4`, every
micro-batch decoding on its own (`steps_per_generation=1`) against one decode for all four
(`steps_per_generation=4`); each arm runs in a fresh process, the arms in turn (`--rounds`), and the table gives the
decode time per generated token and the optimizer step time (medians over the timed steps of every round).
Writes benchmarks/results/speed_rollout_batching.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)  # counting.py, speed_lib

from speed_lib.groups import RESULT, rollout_arm, run_group, run_groups, run_rollout_batching  # noqa: E402
from speed_lib.models import QUICK_TASKS, SHAPES, TASKS  # noqa: E402
from speed_lib.report import print_table, write_results, write_rollout_batching  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu", help="a torch device: cpu, cuda, cuda:1, mps, ...")
    parser.add_argument("--output", default=os.path.join(HERE, "results", "speed.json"))
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch intra-op threads (use 1 on a machine shared with other jobs)")
    parser.add_argument("--translation-batch", type=int, default=None, help="override the plan's batch size")
    parser.add_argument("--summarization-batch", type=int, default=None, help="override the plan's batch size")
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--rollout-batching", action="store_true",
                        help="time SCSTTrainer steps with steps_per_generation 1 and 4 (gradient accumulation 4)")
    parser.add_argument("--rounds", type=int, default=2, help="--rollout-batching: processes per arm, in turn")
    parser.add_argument("--_group", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--_rollout_arm", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        TASKS.update(QUICK_TASKS)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    if args._rollout_arm:  # one arm of --rollout-batching, in its own process
        steps, shape, task, batch, repeats = args._rollout_arm
        print(json.dumps(rollout_arm(int(steps), shape, task, int(batch), int(repeats), args.device)), flush=True)
        return
    if args._group:  # one (shape, task) group, in its own process
        shape, task, batch, repeats = args._group
        for row in run_group(shape, task, int(batch), int(repeats), args.device, args.threads):
            print(RESULT + json.dumps(row), flush=True)
        return
    if args.rollout_batching:
        shape, task, batch, repeats = ("t5-small", "translation", 2, 1) if args.quick else \
            ("marian-base", "translation", 8, 3)
        rows = run_rollout_batching(shape, task, batch, repeats, args.rounds, args.device, args.threads, args.quick,
                                    __file__)
        output = args.output if "--output" in sys.argv else os.path.join(HERE, "results", "speed_rollout_batching.json")
        write_rollout_batching(args, rows, shape, task, batch, repeats, time.perf_counter() - started, output)
        return
    if args.quick:
        plan = [("t5-small", "translation", 2, 1), ("t5-small", "summarization", 1, 1)]
    else:
        plan = [(s, t, 8 if t == "translation" else 4, 5) for s in SHAPES for t in TASKS
                if not (s == "t5-small-256k" and t == "summarization")]
    override = {"translation": args.translation_batch, "summarization": args.summarization_batch}
    plan = [(shape, task, override[task] or batch, repeats) for shape, task, batch, repeats in plan
            if task in args.tasks and shape in args.shapes]
    results = run_groups(plan, args.device, args.threads, args.quick, __file__,
                         lambda so_far: write_results(args, so_far, time.perf_counter() - started))
    print_table(results)
    print(f"\nwrote {args.output} ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
