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
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)  # counting.py

SHAPES = {  # name: (config kwargs, batch, source length, target length / max new tokens)
    "t5-small": dict(arch="t5", d_model=512, layers=6, heads=8, ffn=2048, vocab=32128),
    "marian-base": dict(arch="marian", d_model=512, layers=6, heads=8, ffn=2048, vocab=58101),
    # NLLB's vocabulary (256,206 tokens) on a t5-small body: where the logits dominate a step's memory
    "t5-small-256k": dict(arch="t5", d_model=512, layers=6, heads=8, ffn=2048, vocab=256206),
}
TASKS = {"translation": dict(src_len=32, tgt_len=32), "summarization": dict(src_len=256, tgt_len=48)}
# --quick: the same sources, half the new tokens, so that the whole table takes under 2 minutes.
QUICK_TASKS = {"translation": dict(src_len=32, tgt_len=16), "summarization": dict(src_len=256, tgt_len=24)}
RESULT = "speed.py result: "  # the prefix of a group process's result lines
ARMS = ("xe", "seqrl_scst", "seqrl_loo4", "reference_scst", "reference_loo4")


def word_tokenizer(size: int):
    """Returns a word-level tokenizer of `size` tokens: `<pad>` 0, `</s>` 1, `<unk>` 2, then `w3`, `w4`, ..."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    vocab.update({f"w{i}": i for i in range(3, size)})
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def build(shape: str, device: str):
    """Returns (model, tokenizer) of the given shape, randomly initialized, with a word-level tokenizer."""
    from hf_seqrl.models.tiny import build_tiny_model

    spec = SHAPES[shape]
    tok = word_tokenizer(spec["vocab"])
    # The tables in benchmarks/results/speed*.json were measured with MarianConfig's default forced_eos_token_id
    # (0, <pad> here), which replaces the last token of every Marian sample cut at max_new_tokens.
    marian_default = {"forced_eos_token_id": 0} if spec["arch"] == "marian" else {}
    model = build_tiny_model(spec["arch"], tokenizer=tok, d_model=spec["d_model"], layers=spec["layers"],
                             heads=spec["heads"], ffn=spec["ffn"], max_positions=512, seed=0, **marian_default)
    return model.to(device).train(), tok


def batch_for(task: str, batch: int, vocab: int, device: str):
    gen = torch.Generator().manual_seed(1)
    spec = TASKS[task]
    src = torch.randint(3, vocab, (batch, spec["src_len"]), generator=gen)
    src[:, -1] = 1
    labels = torch.randint(3, vocab, (batch, spec["tgt_len"]), generator=gen)
    labels[:, -1] = 1
    refs = [[" ".join(f"w{int(t)}" for t in row[: spec["tgt_len"] // 2 + 5])] for row in labels]
    return src.to(device), torch.ones_like(src).to(device), labels.to(device), refs


def reward_fn(task: str):
    from hf_seqrl.rewards import get_reward

    return get_reward("rougeL" if task == "summarization" else "bleu")


def reference_reward(task: str, predictions, references):
    """Per-pair calls to the reference implementations, as most SCST code does."""
    if task == "summarization":
        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
        return [scorer.score_multi(r, p)["rougeL"].fmeasure for p, r in zip(predictions, references)]
    import sacrebleu

    return [sacrebleu.sentence_bleu(p, r).score / 100 for p, r in zip(predictions, references)]


def synchronize(device: str) -> None:
    """Waits for the work queued on `device` (nothing to wait for on the CPU)."""
    kind = torch.device(device).type
    if kind != "cpu":
        torch.get_device_module(kind).synchronize()


def on_accelerator(device: str) -> bool:
    return torch.device(device).type != "cpu"


class Timer:
    """Sums the wall time of named spans of a step (`with timer("decode"): ...`), synchronizing the device around
    them."""

    def __init__(self, device):
        self.device, self.parts = device, {}

    @contextlib.contextmanager
    def __call__(self, name):
        synchronize(self.device)
        start = time.perf_counter()
        yield
        synchronize(self.device)
        self.parts[name] = self.parts.get(name, 0.0) + time.perf_counter() - start


def step_xe(model, tok, src, attn, labels, refs, task, n, timer, trainer=None):
    with timer("forward_backward"):
        model(input_ids=src, attention_mask=attn, labels=labels).loss.backward()
    return None, labels.shape[1]


def seqrl_trainer(model, tok, task, n, device):
    """Returns the `SCSTTrainer` an hf-seqrl arm steps: greedy baseline at `n = 1`, leave-one-out over `n` samples
    otherwise, past its warm-up, its decode and reward calls timed (`trainer.timer`)."""
    import tempfile

    from datasets import Dataset

    from hf_seqrl import SCSTTrainer, SeqRLConfig

    fields = dict(baseline="greedy") if n == 1 else dict(baseline="mean", num_samples=n)
    args = SeqRLConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=1,
                       max_new_tokens=TASKS[task]["tgt_len"], report_to=[], save_strategy="no", logging_steps=10**6, disable_tqdm=True,
                       use_cpu=not on_accelerator(device), dataloader_pin_memory=False, seed=0, **fields)
    placeholder = Dataset.from_dict({"input_ids": [[3, 1]], "references": ["w3"]})
    trainer = SCSTTrainer(model=model, args=args, train_dataset=placeholder, processing_class=tok,
                          reward_funcs=reward_fn(task))
    trainer.create_optimizer_and_scheduler(num_training_steps=1)
    trainer.current_gradient_accumulation_steps = 1  # what `train()` sets before its first step
    trainer.timer = None
    sample, rewards = trainer.family.sample, trainer.reward_values

    def timed(name, call):
        def run(*a, **k):
            if trainer.timer is None:
                return call(*a, **k)
            with trainer.timer(name):
                return call(*a, **k)
        return run

    def sample_and_width(*a, **k):
        rollout = sample(*a, **k)
        trainer.decoded_width = rollout.sample_ids.shape[1]
        return rollout

    trainer.family.sample = timed("decode", sample_and_width)
    trainer.reward_values = timed("reward", rewards)
    trainer.family.score = timed("forward_backward", trainer.family.score)  # the scoring pass, then its backward
    trainer.accelerator.backward = timed("forward_backward", trainer.accelerator.backward)
    return trainer


def step_seqrl(model, tok, src, attn, labels, refs, task, n, timer, trainer=None):
    """One `SCSTTrainer.training_step` on the batch: what a user's step costs, every part of it."""
    trainer.timer = timer
    inputs = {"input_ids": src, "attention_mask": attn, "references": refs}
    try:
        loss = trainer.training_step(model, inputs)
    finally:
        trainer.timer = None
    return float(loss), trainer.decoded_width


def step_reference(model, tok, src, attn, labels, refs, task, n, timer, trainer=None):
    """A straightforward SCST step: separate decodes, encoder re-run per sample, full log-softmax, per-pair rewards."""
    from hf_seqrl.models.base import completion_mask

    max_new = TASKS[task]["tgt_len"]
    model.eval()
    with timer("decode"), torch.no_grad():
        samples = model.generate(input_ids=src, attention_mask=attn, do_sample=True, top_k=0, num_beams=1,
                                 num_return_sequences=n, max_new_tokens=max_new)[:, 1:]
        greedy = model.generate(input_ids=src, attention_mask=attn, do_sample=False, num_beams=1,
                                max_new_tokens=max_new)[:, 1:] if n == 1 else None
    model.train()
    with timer("reward"):
        rep = [r for r in refs for _ in range(n)]
        rewards = torch.tensor(reference_reward(task, tok.batch_decode(samples, skip_special_tokens=True), rep),
                               device=src.device)
        if greedy is not None:
            base = torch.tensor(reference_reward(task, tok.batch_decode(greedy, skip_special_tokens=True), refs),
                                device=src.device)
            base = base.repeat_interleave(n)
        else:
            base = (rewards.view(-1, n).sum(1, keepdim=True) - rewards.view(-1, n)).div(n - 1).flatten()
    with timer("forward_backward"):
        mask = completion_mask(samples, [1])
        dec_in = torch.cat([torch.zeros_like(samples[:, :1]), samples[:, :-1]], dim=1)
        logits = model(input_ids=src.repeat_interleave(n, 0), attention_mask=attn.repeat_interleave(n, 0),
                       decoder_input_ids=dec_in).logits
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, samples.unsqueeze(-1)).squeeze(-1)
        seq = (logp * mask).sum(1)
        loss = -((rewards - base) * seq).mean()
        loss.backward()
    return loss.item(), samples.shape[1]


STEPS = {"xe": (step_xe, 1), "seqrl_scst": (step_seqrl, 1), "seqrl_loo4": (step_seqrl, 4),
         "reference_scst": (step_reference, 1), "reference_loo4": (step_reference, 4)}


def _rss_kib(field: str) -> int | None:
    """Returns a `/proc/self/status` memory field (VmRSS, VmHWM) in KiB, or None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _peak_rss_kib() -> int:
    """Returns this process's peak RSS in KiB (VmHWM, else `ru_maxrss`)."""
    peak = _rss_kib("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _reset_peak_rss() -> int | None:
    """Resets this process's peak RSS to its current RSS (Linux `clear_refs`); returns that RSS in KiB, or None
    where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _rss_kib("VmRSS")


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
            self.base = _reset_peak_rss()
            if self.base is None:  # no clear_refs: the high-water mark of this (freshly forked) process
                self.base = _peak_rss_kib()

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
        peak = self.peak if on_accelerator(self.device) else (_peak_rss_kib() - self.base) / 1024
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


def run_rollout_batching(args) -> None:
    """Runs the `ROLLOUT_ARMS` in turn, each in a fresh process, `args.rounds` times; prints and writes the table."""
    shape, task, batch, repeats = ("t5-small", "translation", 2, 1) if args.quick else ("marian-base", "translation",
                                                                                         8, 3)
    runs, started = {arm: [] for arm in ROLLOUT_ARMS}, time.perf_counter()
    for _ in range(args.rounds):
        for arm, steps in ROLLOUT_ARMS.items():
            cmd = [sys.executable, __file__, "--device", args.device, "--threads", str(args.threads),
                   "--_rollout_arm", str(steps), shape, task, str(batch), str(repeats)] + (["--quick"] * args.quick)
            done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
            runs[arm].append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = {}
    for arm, rounds in runs.items():
        step_s = [s for r in rounds for s in r["step_s"]]
        per_token = [d / n for r in rounds for d, n in zip(r["decode_s"], r["tokens"])]
        rows[arm] = {"steps_per_generation": ROLLOUT_ARMS[arm], "step_s": statistics.median(step_s),
                     "decode_s": statistics.median(d for r in rounds for d in r["decode_s"]),
                     "decode_ms_per_token": 1000 * statistics.median(per_token), "rounds": rounds}
    base = rows["per_micro_batch"]
    print(f"{'arm':16s} {'steps/gen':>9s} {'rows/decode':>11s} {'decode s':>9s} {'ms/token':>9s} {'step s':>8s} "
          f"{'decode vs':>9s} {'step vs':>8s}")
    for arm, row in rows.items():
        row["decode_vs_per_micro_batch"] = row["decode_s"] / base["decode_s"]
        row["step_vs_per_micro_batch"] = row["step_s"] / base["step_s"]
        print(f"{arm:16s} {row['steps_per_generation']:9d} {batch * row['steps_per_generation']:11d} "
              f"{row['decode_s']:9.3f} {row['decode_ms_per_token']:9.3f} {row['step_s']:8.3f} "
              f"{row['decode_vs_per_micro_batch']:9.2f} {row['step_vs_per_micro_batch']:8.2f}")
    output = args.output if args.output_set else os.path.join(HERE, "results", "speed_rollout_batching.json")
    os.makedirs(os.path.dirname(output), exist_ok=True)
    with open(output, "w") as f:
        json.dump({"device": args.device, "quick": args.quick, "shape": shape, "task": task, "batch": batch,
                   "gradient_accumulation_steps": 4, "max_new_tokens": TASKS[task]["tgt_len"], "threads": args.threads,
                   "timed_steps_per_round": repeats, "rounds": args.rounds, "torch": torch.__version__,
                   "command": " ".join(["python", "benchmarks/speed.py", *sys.argv[1:]]),
                   "wall_s": round(time.perf_counter() - started, 1), "arms": rows}, f, indent=1)
    print(f"\nwrote {output}")


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
    args.output_set = "--output" in sys.argv
    if args.quick:
        TASKS.update(QUICK_TASKS)
    torch.set_num_threads(args.threads)
    if args._rollout_arm:
        steps, shape, task, batch, repeats = args._rollout_arm
        print(json.dumps(rollout_arm(int(steps), shape, task, int(batch), int(repeats), args.device)), flush=True)
        return
    if args.rollout_batching:
        run_rollout_batching(args)
        return
    if args._group:
        shape, task, batch, repeats = args._group
        for row in run_group(shape, task, int(batch), int(repeats), args.device, args.threads):
            print(RESULT + json.dumps(row), flush=True)
        return
    if args.quick:
        plan = [("t5-small", "translation", 2, 1), ("t5-small", "summarization", 1, 1)]
    else:
        plan = [(s, t, 8 if t == "translation" else 4, 5) for s in SHAPES for t in TASKS
                if not (s == "t5-small-256k" and t == "summarization")]
    override = {"translation": args.translation_batch, "summarization": args.summarization_batch}
    plan = [(shape, task, override[task] or batch, repeats) for shape, task, batch, repeats in plan
            if task in args.tasks and shape in args.shapes]
    results, started = [], time.perf_counter()
    for shape, task, batch, repeats in plan:
        # One process per (shape, task): imports and the model build are paid once, not per arm.
        cmd = [sys.executable, __file__, "--device", args.device, "--threads", str(args.threads), "--_group",
               shape, task, str(batch), str(repeats)] + (["--quick"] if args.quick else [])
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
            lines = (line[len(RESULT):] for line in proc.stdout if line.startswith(RESULT))  # the trainer prints too
            for arm, line in zip(ARMS, lines):
                row = dict(shape=shape, task=task, batch=batch, arm=arm, **json.loads(line))
                results.append(row)
                print(f"  {shape:12s} {task:13s} {arm:15s} {row['step_s']:.3f} s", file=sys.stderr, flush=True)
        if proc.returncode:
            raise SystemExit(f"speed.py: the {shape} {task} group failed (exit {proc.returncode}).")
        write_results(args, results, time.perf_counter() - started)  # after every group: a long run keeps its part
    print_table(results)
    print(f"\nwrote {args.output} ({time.perf_counter() - started:.0f} s)")


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


if __name__ == "__main__":
    main()
