"""Speed and memory of one RL step: hf-seqrl vs a straightforward SCST implementation, beside cross-entropy.

Models are built locally from configs of realistic shape (t5-small-sized, Marian-base-sized) with a synthetic
word-level tokenizer, so decoded samples are real strings of 20-60 words and rewards cost what they cost in
practice. One process per (shape, task) builds the model; on CPU every arm runs in a child forked from it
(peak memory: the child's high-water RSS above its RSS at the start), on GPU the arms run in turn
(`torch.cuda.max_memory_allocated` above the memory in use at the start). Times are medians over repeats; compare
ratios within one run.

    python benchmarks/speed.py --quick              # < 3 minutes on 2 CPU cores
    python benchmarks/speed.py                      # full table
    python benchmarks/speed.py --device cuda        # on a GPU

Writes benchmarks/results/speed.json and prints a table.
"""

from __future__ import annotations

import argparse
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

SHAPES = {  # name: (config kwargs, batch, source length, target length / max new tokens)
    "t5-small": dict(arch="t5", d_model=512, layers=6, heads=8, ffn=2048, vocab=32128),
    "marian-base": dict(arch="marian", d_model=512, layers=6, heads=8, ffn=2048, vocab=58101),
}
TASKS = {"translation": dict(src_len=32, tgt_len=32), "summarization": dict(src_len=256, tgt_len=48)}
# --quick: the same sources, half the new tokens, so that the whole table takes under 3 minutes.
QUICK_TASKS = {"translation": dict(src_len=32, tgt_len=16), "summarization": dict(src_len=256, tgt_len=24)}
ARMS = ("xe", "seqrl_scst", "seqrl_loo4", "reference_scst", "reference_loo4")


def build(shape: str, device: str):
    """Returns (model, tokenizer) of the given shape, randomly initialized, with a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from hf_seqrl.tiny_models import build_tiny_model

    spec = SHAPES[shape]
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    vocab.update({f"w{i}": i for i in range(3, spec["vocab"])})
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
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


class Timer:
    def __init__(self, device):
        self.device, self.parts = device, {}

    def __call__(self, name):
        timer = self

        class _Span:
            def __enter__(self):
                if timer.device == "cuda":
                    torch.cuda.synchronize()
                self.t = time.perf_counter()

            def __exit__(self, *exc):
                if timer.device == "cuda":
                    torch.cuda.synchronize()
                timer.parts[name] = timer.parts.get(name, 0.0) + time.perf_counter() - self.t

        return _Span()


def step_xe(model, tok, src, attn, labels, refs, task, n, timer):
    with timer("forward_backward"):
        model(input_ids=src, attention_mask=attn, labels=labels).loss.backward()
    return None


def step_seqrl(model, tok, src, attn, labels, refs, task, n, timer):
    from hf_seqrl import losses
    from hf_seqrl.rollout import decoder_start_id, pad_id, rollout_generation_config, sample_rollout, score_rollout

    greedy = n == 1
    with timer("decode"):
        config = rollout_generation_config(model, max_new_tokens=TASKS[task]["tgt_len"])
        ro = sample_rollout(model, src, attn, config, n, with_greedy=greedy)
    with timer("reward"):
        fn = reward_fn(task)
        rep = [r for r in refs for _ in range(n)]
        rewards = torch.tensor(fn(tok.batch_decode(ro.sample_ids, skip_special_tokens=True), rep))
        if greedy:
            base = torch.tensor(fn(tok.batch_decode(ro.greedy_ids, skip_special_tokens=True), refs))
            base = base.repeat_interleave(n)
        else:
            base = losses.leave_one_out_baseline(rewards, n)
    with timer("forward_backward"):
        scored = score_rollout(model, src, attn, ro.sample_ids, n, decoder_start_id(model), pad_id(model))
        loss = losses.policy_gradient_loss(scored.token_logprobs, ro.sample_mask, losses.advantages(rewards, base))
        loss.backward()
    return loss.item(), (scored.token_logprobs.detach() * ro.sample_mask).sum().item()


def step_reference(model, tok, src, attn, labels, refs, task, n, timer):
    """A straightforward SCST step: separate decodes, encoder re-run per sample, full log-softmax, per-pair rewards."""
    from hf_seqrl.rollout import completion_mask

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
        rewards = torch.tensor(reference_reward(task, tok.batch_decode(samples, skip_special_tokens=True), rep))
        if greedy is not None:
            base = torch.tensor(reference_reward(task, tok.batch_decode(greedy, skip_special_tokens=True), refs))
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
        loss = -((rewards - base).to(seq.device) * seq).mean()
        loss.backward()
    return loss.item(), seq.detach().sum().item()


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


def run_arm(arm, model, tok, shape, task, batch, repeats, device):
    """Runs one arm on `model` in this process; returns its timings (medians) and peak memory (MiB above the
    memory in use when the arm starts)."""
    src, attn, labels, refs = batch_for(task, batch, SHAPES[shape]["vocab"], device)
    # A random model almost never samples EOS (p ~ 1/vocab), so every arm decodes ~max_new_tokens tokens.
    fn, n = STEPS[arm]
    if arm == "xe":
        # Same number of target sequences as the 4-sample RL step, for the memory comparison.
        src, attn, labels = (t.repeat_interleave(4, 0) for t in (src, attn, labels))
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _reset_peak_rss()
        if base is None:  # no clear_refs: the high-water mark of this (freshly forked) process
            base = _peak_rss_kib()
    totals, parts, step_losses = [], [], []
    for i in range(repeats + 1):
        torch.manual_seed(i)
        timer = Timer(device)
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        step_losses.append(fn(model, tok, src, attn, labels, refs, task, n, timer))
        if device == "cuda":
            torch.cuda.synchronize()
        total = time.perf_counter() - start
        if i:  # the first step warms up allocators and caches
            totals.append(total)
            parts.append(dict(timer.parts, other=total - sum(timer.parts.values())))
    model.zero_grad(set_to_none=True)
    if device == "cuda":
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        peak = (_peak_rss_kib() - base) / 1024
    keys = sorted({k for p in parts for k in p})
    return {"step_s": statistics.median(totals),
            "parts_s": {k: statistics.median(p.get(k, 0.0) for p in parts) for k in keys},
            "peak_mem_mib": peak, "losses": step_losses}


def run_group(shape, task, batch, repeats, device, threads, arms=ARMS):
    """Builds the model once and runs every arm on it; yields one result per arm.

    On CPU each arm runs in a child forked from this process (`os.fork`: the model's memory is shared, the
    arm's own allocations are its peak, and no arm sees another's allocator state). On CUDA, where a fork
    cannot use the device, the arms run one after another here with the allocator's peak reset between them.
    """
    torch.set_num_threads(threads)
    model, tok = build(shape, device)
    for arm in arms:
        if device == "cuda" or not hasattr(os, "fork"):
            yield run_arm(arm, model, tok, shape, task, batch, repeats, device)
            continue
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(read)
            status = 1
            try:
                with os.fdopen(write, "w") as out:
                    json.dump(run_arm(arm, model, tok, shape, task, batch, repeats, device), out)
                status = 0
            finally:
                os._exit(status)
        os.close(write)
        with os.fdopen(read) as inp:
            text = inp.read()
        _, status = os.waitpid(pid, 0)
        if status != 0 or not text:
            raise RuntimeError(f"arm {arm} ({shape}, {task}) failed in its child process (status {status}).")
        yield json.loads(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--output", default=os.path.join(HERE, "results", "speed.json"))
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch intra-op threads (use 1 on a machine shared with other jobs)")
    parser.add_argument("--translation-batch", type=int, default=None, help="override the plan's batch size")
    parser.add_argument("--summarization-batch", type=int, default=None, help="override the plan's batch size")
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--_group", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        TASKS.update(QUICK_TASKS)
    if args._group:
        shape, task, batch, repeats = args._group
        for row in run_group(shape, task, int(batch), int(repeats), args.device, args.threads):
            print(json.dumps(row), flush=True)
        return
    if args.quick:
        plan = [("t5-small", "translation", 2, 1), ("t5-small", "summarization", 1, 1)]
    else:
        plan = [(s, t, 8 if t == "translation" else 4, 5) for s in SHAPES for t in TASKS]
    override = {"translation": args.translation_batch, "summarization": args.summarization_batch}
    plan = [(shape, task, override[task] or batch, repeats) for shape, task, batch, repeats in plan
            if task in args.tasks]
    results = []
    for shape, task, batch, repeats in plan:
        # One process per (shape, task): imports and the model build are paid once, not per arm.
        cmd = [sys.executable, __file__, "--device", args.device, "--threads", str(args.threads), "--_group",
               shape, task, str(batch), str(repeats)] + (["--quick"] if args.quick else [])
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
            for arm, line in zip(ARMS, proc.stdout):
                row = dict(shape=shape, task=task, batch=batch, arm=arm, **json.loads(line))
                results.append(row)
                print(f"  {shape:12s} {task:13s} {arm:15s} {row['step_s']:.3f} s", file=sys.stderr, flush=True)
        if proc.returncode:
            raise SystemExit(f"speed.py: the {shape} {task} group failed (exit {proc.returncode}).")
    print_table(results)
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump({"device": args.device, "quick": args.quick, "tasks": TASKS, "torch": torch.__version__,
                   "threads": args.threads, "results": results}, f, indent=1)
    print(f"\nwrote {args.output}")


def print_table(results):
    header = (f"{'shape':12s} {'task':13s} {'arm':15s} {'step s':>8s} {'decode':>7s} {'reward':>7s} "
              f"{'fwd/bwd':>7s} {'other':>7s} {'peak MiB':>9s} {'vs ref':>7s} {'vs XE mem':>9s} {'rel diff':>9s}")
    print(header)
    print("-" * len(header))
    for row in results:
        same = {r["arm"]: r for r in results if r["shape"] == row["shape"] and r["task"] == row["task"]}
        ref = same.get(row["arm"].replace("seqrl", "reference"))
        ratio = row["step_s"] / ref["step_s"] if ref and row["arm"].startswith("seqrl") else float("nan")
        mem = row["peak_mem_mib"] / max(same["xe"]["peak_mem_mib"], 1e-9) if row["arm"] == "seqrl_loo4" else float(
            "nan")
        # Same seeds, same samples: the loss and the samples' total log-prob of every step must equal the
        # reference implementation's (relative difference; float rounding differs with batch shapes).
        diff = (max(abs(a - b) / max(abs(b), 1.0) for mine, theirs in zip(row["losses"], ref["losses"])
                    for a, b in zip(mine, theirs))
                if ref and row["arm"].startswith("seqrl") else float("nan"))
        p = row["parts_s"]
        print(f"{row['shape']:12s} {row['task']:13s} {row['arm']:15s} {row['step_s']:8.3f} {p.get('decode', 0):7.3f} "
              f"{p.get('reward', 0):7.3f} {p.get('forward_backward', 0):7.3f} {p.get('other', 0):7.3f} "
              f"{row['peak_mem_mib']:9.0f} {ratio:7.2f} {mem:9.2f} {diff:9.1e}")


if __name__ == "__main__":
    main()
