"""How the speed benchmark runs its arms: one process per (shape, task) builds the model, every arm in a child
forked from it on CPU (its own peak memory) or in turn in one process on an accelerator, the arms stepping in turn;
and the rollout-batching arms, each in a fresh process."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from counting import reset_resident_peak, resident_peak_bytes

from .arms import ARMS, STEPS, Timer, reward_fn, seqrl_trainer
from .models import SHAPES, TASKS, batch_for, build, on_accelerator, synchronize

RESULT = "speed.py result: "  # the prefix of a group process's result lines


class Arm:
    """One arm on a built model: its inputs, and its step times, peak memory and host syncs as its steps run."""

    def __init__(self, arm, model, tok, shape, task, batch, device):
        self.arm, self.model, self.tok, self.task, self.device = arm, model, tok, task, device
        self.src, self.attn, self.labels, self.refs = batch_for(task, batch, SHAPES[shape]["vocab"], device)
        self.vocab = SHAPES[shape]["vocab"]
        # A random model almost never samples EOS (p ~ 1/vocab), so every arm decodes ~max_new_tokens tokens.
        self.fn, self.n = STEPS[arm]
        self.trainer = seqrl_trainer(model, tok, task, self.n, device) if arm.startswith("seqrl") else None
        if arm == "xe":
            # Same number of target sequences as the 4-sample RL step, for the memory comparison.
            self.src, self.attn, self.labels = (t.repeat_interleave(4, 0) for t in (self.src, self.attn, self.labels))
        self.totals, self.parts, self.losses, self.peak, self.widths = [], [], [], 0.0, []
        self.syncs = None
        if not on_accelerator(device):
            self.base = reset_resident_peak()
            if self.base is None:  # no clear_refs: the high-water mark of this (freshly forked) process
                self.base = resident_peak_bytes()

    def step(self, i: int) -> None:
        """Runs step `i`. Step 0 warms up allocators and caches and is not timed: it counts the host syncs."""
        accelerator = on_accelerator(self.device)
        if accelerator:
            module = torch.get_device_module(torch.device(self.device).type)
            module.empty_cache()
            module.reset_peak_memory_stats()
            base = module.memory_allocated()
        torch.manual_seed(i)
        timer = Timer(self.device)
        self.model.zero_grad(set_to_none=True)
        counter = None
        if i == 0:
            from counting import SyncCounter

            counter = SyncCounter()
        start = time.perf_counter()
        with counter if counter is not None else contextlib.nullcontext(), \
                counter.counting() if counter is not None else contextlib.nullcontext():
            loss, width = self.fn(self.model, self.tok, self.src, self.attn, self.labels, self.refs, self.task, self.n,
                                  timer, self.trainer)
        synchronize(self.device)
        total = time.perf_counter() - start
        self.losses.append(loss)
        self.widths.append(width)
        if counter is not None:
            self.syncs = counter.total / max(width, 1)
        self.model.zero_grad(set_to_none=True)
        if accelerator:
            self.peak = max(self.peak, (module.max_memory_allocated() - base) / 2**20)
        if i:
            self.totals.append(total)
            self.parts.append(dict(timer.parts, other=total - sum(timer.parts.values())))

    def result(self) -> dict:
        """Returns the arm's median step time and parts, peak memory (MiB above the memory in use at its start), its
        peak over one float32 logits tensor of the rows it scores, and its host syncs per decoded position."""
        peak = self.peak if on_accelerator(self.device) else (resident_peak_bytes() - self.base) / 2**20
        keys = sorted({k for p in self.parts for k in p})
        rows = self.src.shape[0] * (1 if self.arm == "xe" else self.n)
        logits_mib = rows * max(self.widths) * self.vocab * 4 / 2**20
        return {"step_s": statistics.median(self.totals),
                "parts_s": {k: statistics.median(p.get(k, 0.0) for p in self.parts) for k in keys},
                "steps_s": self.totals, "peak_mem_mib": peak, "losses": self.losses,
                "peak_over_logits": peak / logits_mib, "syncs_per_token": None if self.arm == "xe" else self.syncs}


def _arm_child(arm, model, tok, shape, task, batch, device, commands, replies):
    """The loop of an arm's child process: one step per line read, then its result as one JSON line."""
    runner = Arm(arm, model, tok, shape, task, batch, device)
    with os.fdopen(commands) as inp, os.fdopen(replies, "w") as out:
        for line in inp:
            if line.strip() == "result":
                break
            runner.step(int(line))
            out.write("ok\n")
            out.flush()
        json.dump(runner.result(), out)
        out.write("\n")


def run_group(shape, task, batch, repeats, device, threads, arms=ARMS):
    """Builds the model once and runs the arms' steps interleaved (step i of every arm, then step i + 1, ...);
    returns one result per arm.

    On CPU each arm lives in a child forked from this process (`os.fork`: the model's memory is shared, the arm's
    own allocations are its peak, and no arm sees another's allocator state); the children take turns, so load
    from elsewhere on the machine falls on every arm alike. On CUDA, where a fork cannot use the device, the arms
    take turns in this process, with the allocator's peak reset before each step.
    """
    torch.set_num_threads(threads)
    model, tok = build(shape, device)
    if on_accelerator(device) or not hasattr(os, "fork"):
        runners = [Arm(arm, model, tok, shape, task, batch, device) for arm in arms]
        for i in range(repeats + 1):
            for runner in runners:
                runner.step(i)
        return [runner.result() for runner in runners]
    children = []
    for arm in arms:
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(from_parent)
            os.close(to_parent)
            status = 1
            try:
                _arm_child(arm, model, tok, shape, task, batch, device, to_child, from_child)
                status = 0
            finally:
                os._exit(status)
        os.close(to_child)
        os.close(from_child)
        children.append((arm, pid, os.fdopen(from_parent, "w"), os.fdopen(to_parent)))
    try:
        for i in range(repeats + 1):
            for arm, pid, send, receive in children:
                send.write(f"{i}\n")
                send.flush()
                if receive.readline().strip() != "ok":
                    raise RuntimeError(f"arm {arm} ({shape}, {task}) failed at step {i} in its child process.")
        results = []
        for arm, pid, send, receive in children:
            send.write("result\n")
            send.flush()
            results.append(json.loads(receive.readline()))
    finally:
        for arm, pid, send, receive in children:
            send.close()
            receive.close()
            os.waitpid(pid, 0)
    return results


ROLLOUT_ARMS = {"per_micro_batch": 1, "batched": 4}  # arm: steps_per_generation, at gradient_accumulation_steps=4


def rollout_arm(steps_per_generation: int, shape: str, task: str, batch: int, repeats: int, device: str) -> dict:
    """Returns the per-step decode time, tokens decoded and step time of `repeats` timed optimizer steps of
    `SCSTTrainer` (after one untimed step) with `steps_per_generation` (one process per call: a fresh model)."""
    import tempfile

    from datasets import Dataset
    from transformers import TrainerCallback

    from hf_seqrl import SCSTTrainer, SeqRLConfig

    model, tok = build(shape, device)
    accumulation = 4
    src, attn, labels, refs = batch_for(task, batch * accumulation * (repeats + 1), SHAPES[shape]["vocab"], "cpu")
    data = Dataset.from_dict({"input_ids": src.tolist(), "attention_mask": attn.tolist(), "labels": labels.tolist(),
                              "references": refs})
    ends, decode_s, tokens = [], [0.0], [0]

    class StepEnds(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            ends.append((time.perf_counter(), 0.0, 0))

        def on_step_end(self, args, state, control, **kwargs):
            synchronize(device)
            ends.append((time.perf_counter(), decode_s[0], tokens[0]))

    with tempfile.TemporaryDirectory() as out:
        args = SeqRLConfig(output_dir=out, per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                           max_steps=repeats + 1, learning_rate=1e-7, max_new_tokens=TASKS[task]["tgt_len"],
                           steps_per_generation=steps_per_generation, report_to=[], save_strategy="no",
                           logging_steps=10**6, disable_tqdm=True, use_cpu=not on_accelerator(device),
                           dataloader_pin_memory=False, seed=0)
        trainer = SCSTTrainer(model=model, args=args, train_dataset=data, processing_class=tok,
                              reward_funcs=reward_fn(task), callbacks=[StepEnds()])
        sample = trainer.family.sample

        def timed_sample(*a, **k):
            timer = Timer(device)
            with timer("decode"):
                rollout = sample(*a, **k)
            decode_s[0] += timer.parts["decode"]
            # Tokens written, EOS included (the greedy row's too): the same in both arms, whatever the padding.
            tokens[0] += int(rollout.sample_mask.sum()) + (0 if rollout.greedy_mask is None
                                                            else int(rollout.greedy_mask.sum()))
            return rollout

        trainer.family.sample = timed_sample
        trainer.train()
    steps = [(t1 - t0, d1 - d0, n1 - n0) for (t0, d0, n0), (t1, d1, n1) in zip(ends, ends[1:])][1:]
    return {"step_s": [s for s, _, _ in steps], "decode_s": [d for _, d, _ in steps],
            "tokens": [n for _, _, n in steps]}


def run_groups(plan: list[tuple], device: str, threads: int, quick: bool, script: str, after_group) -> list[dict]:
    """Runs each `(shape, task, batch, repeats)` of `plan` in a process of its own (`script --_group`: imports and the
    model build are paid once per group, not per arm), and returns every arm's row; `after_group(results)` runs after
    each group (a long run keeps its part)."""
    results = []
    for shape, task, batch, repeats in plan:
        cmd = [sys.executable, script, "--device", device, "--threads", str(threads), "--_group",
               shape, task, str(batch), str(repeats)] + (["--quick"] if quick else [])
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
            lines = (line[len(RESULT):] for line in proc.stdout if line.startswith(RESULT))  # the trainer prints too
            for arm, line in zip(ARMS, lines):
                row = dict(shape=shape, task=task, batch=batch, arm=arm, **json.loads(line))
                results.append(row)
                print(f"  {shape:12s} {task:13s} {arm:15s} {row['step_s']:.3f} s", file=sys.stderr, flush=True)
        if proc.returncode:
            raise SystemExit(f"speed.py: the {shape} {task} group failed (exit {proc.returncode}).")
        after_group(results)
    return results


def run_rollout_batching(shape: str, task: str, batch: int, repeats: int, rounds: int, device: str, threads: int,
                         quick: bool, script: str) -> dict:
    """Returns each of the `ROLLOUT_ARMS`' medians (step, decode, ms per token) and its rounds: every arm runs in a
    fresh process (`script --_rollout_arm`), the arms in turn, `rounds` times."""
    runs = {arm: [] for arm in ROLLOUT_ARMS}
    for _ in range(rounds):
        for arm, steps in ROLLOUT_ARMS.items():
            cmd = [sys.executable, script, "--device", device, "--threads", str(threads),
                   "--_rollout_arm", str(steps), shape, task, str(batch), str(repeats)] + (["--quick"] * quick)
            done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
            runs[arm].append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = {}
    for arm, rounds_of_arm in runs.items():
        step_s = [s for r in rounds_of_arm for s in r["step_s"]]
        per_token = [d / n for r in rounds_of_arm for d, n in zip(r["decode_s"], r["tokens"])]
        rows[arm] = {"steps_per_generation": ROLLOUT_ARMS[arm], "step_s": statistics.median(step_s),
                     "decode_s": statistics.median(d for r in rounds_of_arm for d in r["decode_s"]),
                     "decode_ms_per_token": 1000 * statistics.median(per_token), "rounds": rounds_of_arm}
    return rows
