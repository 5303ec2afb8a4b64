"""Times the RL step's scoring pass, and its peak memory, with the vocabulary reductions made from the decoder's
hidden states a slice of the vocabulary at a time (hf-seqrl's pass) against the same math over the forward's whole
logits tensor (the path of a model whose output layer hf-seqrl does not know).

The pass is what the rewarded trainers run after a rollout: one teacher-forced forward over the samples and the gold
rows, the sampled tokens' log-probs and entropy, the policy-gradient loss mixed with the gold cross-entropy
(`rl_weight=0.7`), and the backward. Random-weight models at speed.py's shapes (t5-small, Marian-base, t5-small with
NLLB's 256k vocabulary), translation inputs (batch 8, 32 source / 32 target tokens). Each arm runs in its own process;
the arms alternate for `--rounds` rounds, each round timing `--steps` passes after one untimed pass. Peak: the
device allocator's peak (VmHWM on the CPU) above the memory in use before a pass, less the parameters' gradients
(the same in both arms), over one float32 logits tensor of the scored rows.

    python benchmarks/scoring_pass.py                 # prints a table, writes results/scoring_pass.json
    python benchmarks/scoring_pass.py --device cuda

`--scst-step` measures instead whole `SCSTTrainer` steps at a 131,072-token vocabulary (a T5 of d_model 64, 2 + 2
layers, 8 sources x 48 tokens, `rl_weight=0.7`, so 16 scored rows; one banned token): each step's peak above its
start (VmHWM on the CPU, the allocator's peak on a device; steps 2 and 3 of 3) over one float32 logits tensor of the
scored rows, chunked against whole logits, each arm in its own process. Writes results/scoring_pass_scst_step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
ARMS = ("chunked", "whole_logits")
CASES = (("t5-small", 1), ("t5-small", 4), ("marian-base", 4), ("t5-small-256k", 4))  # (shape, samples per source)


def time_passes(shape: str, samples: int, arm: str, steps: int, device: str) -> dict:
    """Returns the seconds of `steps` scoring passes (after one untimed pass) in this process, and their peak."""
    from speed_lib import models as speed_models
    from counting import reset_resident_peak, resident_peak_bytes

    from hf_seqrl import losses
    from hf_seqrl.models import heads
    from hf_seqrl.models import family_for

    model, _ = speed_models.build(shape, device)
    vocab = speed_models.SHAPES[shape]["vocab"]
    src, attn, labels, _ = speed_models.batch_for("translation", 8, vocab, device)
    gen = torch.Generator().manual_seed(2)
    sample_ids = torch.randint(3, vocab, (8 * samples, 32), generator=gen).to(device)
    mask = torch.ones_like(sample_ids, dtype=torch.bool)
    advantages = torch.randn(8 * samples, generator=gen).to(device)
    accelerator = speed_models.on_accelerator(device)
    module = torch.get_device_module(torch.device(device).type) if accelerator else None
    times, peaks = [], []
    for step in range(steps + 1):
        model.zero_grad(set_to_none=True)
        speed_models.synchronize(device)
        if accelerator:
            module.reset_peak_memory_stats()
            base = module.memory_allocated()
        else:
            base = reset_resident_peak()
        start = time.perf_counter()
        with heads.whole_logits(arm == "whole_logits"):  # the whole-logits arm, on purpose (no warning)
            scored = family_for(model).score(model, {"input_ids": src, "attention_mask": attn}, sample_ids, samples,
                                             labels, 1.0)
        pg = losses.policy_gradient_loss(scored.token_logprobs, mask, advantages)
        xe = losses.cross_entropy_from_logprobs(scored.gold_logprobs, labels)
        losses.mix_losses(pg, xe, 0.7).backward()
        speed_models.synchronize(device)
        seconds = time.perf_counter() - start
        peak = (module.max_memory_allocated() if accelerator else resident_peak_bytes()) - base
        if step:
            times.append(seconds)
            peaks.append(peak / 2**20)
    logits_mib = (8 * samples + 8) * 32 * vocab * 4 / 2**20
    grads_mib = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad) / 2**20
    return {"seconds": times, "peak_mib": max(peaks), "logits_mib": logits_mib, "gradients_mib": grads_mib}


def scst_step_peaks(arm: str, device: str) -> dict:
    """Returns the peaks (MiB) above their start of `SCSTTrainer` steps 2 and 3 at the `--scst-step` shape."""
    import random
    import tempfile

    from counting import reset_resident_peak, resident_peak_bytes
    from datasets import Dataset
    from transformers import T5Config, T5ForConditionalGeneration, TrainerCallback

    from speed_lib import models as speed_models
    from hf_seqrl import SCSTTrainer, SeqRLConfig
    from hf_seqrl.models import heads

    vocab, sources, length = 131072, 8, 48
    tokenizer = speed_models.word_tokenizer(vocab)
    config = T5Config(vocab_size=vocab, d_model=64, d_ff=128, num_layers=2, num_heads=2, d_kv=32,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, dropout_rate=0.0)
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(config)
    for key in ("decoder_start_token_id", "pad_token_id", "eos_token_id"):
        setattr(model.generation_config, key, getattr(config, key))
    model.generation_config.bad_words_ids = [[1]]  # no row ends: every sample is 48 tokens
    rng = random.Random(0)
    words = lambda n: " ".join(f"w{rng.randrange(3, vocab)}" for _ in range(n))  # noqa: E731
    data = Dataset.from_dict({"source": [words(length) for _ in range(4 * sources)],
                              "target": [words(length - 1) for _ in range(4 * sources)]})
    accelerator = speed_models.on_accelerator(device)
    module = torch.get_device_module(torch.device(device).type) if accelerator else None
    peaks = []

    class Peak(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step >= 1:
                speed_models.synchronize(device)
                if accelerator:
                    module.reset_peak_memory_stats()
                    self.base = module.memory_allocated()
                else:
                    self.base = reset_resident_peak()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= 2:
                speed_models.synchronize(device)
                peak = module.max_memory_allocated() if accelerator else resident_peak_bytes()
                peaks.append((peak - self.base) / 2**20)

    args = SeqRLConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=sources, max_steps=3,
                       report_to=[], max_new_tokens=length, max_source_length=length, max_target_length=length,
                       save_strategy="no", learning_rate=1e-4, disable_tqdm=True, logging_steps=100,
                       use_cpu=not accelerator, seed=0, rl_weight=0.7)
    with heads.whole_logits(arm == "whole_logits"):
        SCSTTrainer(model=model, args=args, reward_funcs="chrf", processing_class=tokenizer, train_dataset=data,
                    callbacks=[Peak()]).train()
    logits_mib = 2 * sources * length * vocab * 4 / 2**20
    return {"peaks_mib": peaks, "logits_mib": logits_mib}


def scst_step(args) -> None:
    started, runs = time.perf_counter(), {}
    for arm in ARMS:
        out = subprocess.run([sys.executable, __file__, "--device", args.device, "--threads", str(args.threads),
                              "--_scst_step", arm], capture_output=True, text=True, check=True).stdout
        runs[arm] = json.loads(out.strip().splitlines()[-1])
        runs[arm]["peak_over_logits"] = max(runs[arm]["peaks_mib"]) / runs[arm]["logits_mib"]
        print(f"{arm:13s} peak {max(runs[arm]['peaks_mib']):7.0f} MiB over a {runs[arm]['logits_mib']:.0f} MiB "
              f"logits tensor: {runs[arm]['peak_over_logits']:.2f}x", flush=True)
    output = args.output if "--output" in sys.argv else os.path.join(HERE, "results", "scoring_pass_scst_step.json")
    with open(output, "w") as f:
        json.dump({"torch": torch.__version__, "device": args.device, "threads": args.threads,
                   "command": " ".join(["python", "benchmarks/scoring_pass.py", *sys.argv[1:]]),
                   "wall_s": round(time.perf_counter() - started, 1), "arms": runs}, f, indent=1)
    print(f"wrote {output}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="a torch device: cpu, cuda, cuda:1, ...")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cases", nargs="+", default=None, metavar="SHAPE:SAMPLES",
                        help="the (shape, samples per source) cases, e.g. t5-small:1 (default: all four)")
    parser.add_argument("--output", default=os.path.join(HERE, "results", "scoring_pass.json"))
    parser.add_argument("--scst-step", action="store_true", help="peak memory of whole SCSTTrainer steps (above)")
    parser.add_argument("--_arm", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--_scst_step", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args._scst_step:
        print(json.dumps(scst_step_peaks(args._scst_step, args.device)))
        return
    if args.scst_step:
        scst_step(args)
        return
    if args._arm:
        shape, samples, arm, steps = args._arm
        print(json.dumps(time_passes(shape, int(samples), arm, int(steps), args.device)))
        return
    cases = CASES if args.cases is None else [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases]
    rows, started = [], time.perf_counter()
    print(f"{'shape':14s} {'samples':>7s} {'chunked s':>9s} {'whole s':>8s} {'time ratio':>10s} "
          f"{'chunked peak/logits':>19s} {'whole peak/logits':>17s}")
    for shape, samples in cases:
        runs = {arm: [] for arm in ARMS}
        for _ in range(args.rounds):
            for arm in ARMS:
                out = subprocess.run([sys.executable, __file__, "--device", args.device, "--threads",
                                      str(args.threads), "--_arm", shape, str(samples), arm, str(args.steps)],
                                     capture_output=True, text=True, check=True).stdout
                runs[arm].append(json.loads(out.strip().splitlines()[-1]))
        row = {"shape": shape, "samples": samples, "logits_mib": runs["chunked"][0]["logits_mib"],
               "gradients_mib": runs["chunked"][0]["gradients_mib"]}
        for arm in ARMS:
            row[f"{arm}_s"] = statistics.median(s for run in runs[arm] for s in run["seconds"])
            row[f"{arm}_peak_mib"] = max(run["peak_mib"] for run in runs[arm])
            row[f"{arm}_peak_over_logits"] = (row[f"{arm}_peak_mib"] - row["gradients_mib"]) / row["logits_mib"]
            row[f"{arm}_runs"] = runs[arm]
        row["time_ratio"] = row["chunked_s"] / row["whole_logits_s"]
        rows.append(row)
        print(f"{shape:14s} {samples:7d} {row['chunked_s']:9.3f} {row['whole_logits_s']:8.3f} "
              f"{row['time_ratio']:10.2f} {row['chunked_peak_over_logits']:19.2f} "
              f"{row['whole_logits_peak_over_logits']:17.2f}", flush=True)
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump({"torch": torch.__version__, "device": args.device, "threads": args.threads,
                   "rounds": args.rounds, "steps": args.steps,
                   "command": " ".join(["python", "benchmarks/scoring_pass.py", *sys.argv[1:]]),
                   "wall_s": round(time.perf_counter() - started, 1), "rows": rows}, f, indent=1)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
