#!/usr/bin/env python
"""Rollout decode time with and without dropping ended rows from the forward, on a trained model and real sources.

    python benchmarks/compaction.py --task translation     # Multi30k de->en, the quality benchmark's C
    python benchmarks/compaction.py --task summarization   # SciTLDR-A, the quality benchmark's C

The random-weight models of `speed.py` never write EOS, so their rows all run to the length limit; trained models
end rows at very different steps (captions, TL;DRs). This decodes the quality benchmark's cached checkpoint C
(`python benchmarks/quality.py --task ...` trains it) on the dev sources in the quality benchmark's batches, as an
SCST step does (greedy row + 1 sample per source) and as leave-one-out does (4 samples), with
`hf_seqrl.models.seq2seq.decode` at `compact_below=0.5` (the default: ended rows leave the forward once at most half of
the rows in it still run) and at `compact_below=0` (every row stays until all have ended), and with `speed.py`'s
reference decode: `generate(do_sample=True, num_return_sequences=n)`, plus a greedy `generate` for SCST. The two
settings of `decode` use the same uniforms, so they decode the same tokens (checked); the three arms take turns
leading batch by batch, so outside load falls on all of them; times are medians over batches. Writes
benchmarks/results/compaction_<task>.json and prints a table.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import quality_lib as quality  # noqa: E402  (the quality benchmark's data, tokenizer and checkpoint C)
from speed_lib.models import synchronize  # noqa: E402
# The rollouts timed: name -> (rows per source, first row greedy).
ROLLOUTS = {"SCST (greedy + 1 sample)": (2, True), "leave-one-out (4 samples)": (4, False)}
ARMS = ("compacted", "all rows", "generate")


def generate_reference(model, ids, mask, max_new_tokens: int, group: int, greedy_first: bool):
    """The reference decode of `speed.py`: `generate(do_sample=True, num_return_sequences=n)` for the samples and,
    for SCST, a separate greedy `generate`."""
    samples = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, num_beams=1,
                             num_return_sequences=group - int(greedy_first), max_new_tokens=max_new_tokens)
    if greedy_first:
        model.generate(input_ids=ids, attention_mask=mask, do_sample=False, num_beams=1,
                       max_new_tokens=max_new_tokens)
    return samples


def time_rollout(model, batches, settings, group: int, greedy_first: bool) -> dict:
    """Returns the per-batch decode seconds with and without compaction and of `generate`, and the rows'
    lengths."""
    import torch

    from hf_seqrl.models.seq2seq import decode
    from hf_seqrl.models.tokens import completion_mask

    seconds = {name: [] for name in ARMS}
    lengths = []
    for index, (ids, mask) in enumerate(batches):
        samples = ids.shape[0] * (group - int(greedy_first))
        uniforms = torch.rand((settings.max_new_tokens, samples),
                              generator=torch.Generator().manual_seed(index)).to(ids.device)
        outputs = {}
        for name in ARMS[index % len(ARMS):] + ARMS[:index % len(ARMS)]:  # each arm first in turn
            synchronize(ids.device)
            start = time.perf_counter()
            with torch.no_grad():
                if name == "generate":
                    generate_reference(model, ids, mask, settings.max_new_tokens, group, greedy_first)
                else:
                    outputs[name] = decode(model, ids, mask, settings, group, greedy_first, uniforms,
                                           compact_below=0.5 if name == "compacted" else 0.0)
            synchronize(ids.device)
            seconds[name].append(time.perf_counter() - start)
        if not torch.equal(outputs["compacted"], outputs["all rows"]):
            raise AssertionError(f"batch {index}: the compacted decode wrote other tokens")
        lengths += completion_mask(outputs["all rows"], list(settings.eos_ids)).sum(1).tolist()
    median = {name: statistics.median(values) for name, values in seconds.items()}
    return {"seconds": seconds, **{f"median_{name.replace(' ', '_')}_s": round(value, 4)
                                   for name, value in median.items()},
            "compacted_vs_all_rows": round(median["compacted"] / median["all rows"], 3),
            "compacted_vs_generate": round(median["compacted"] / median["generate"], 3),
            "mean_tokens": round(statistics.mean(lengths), 2), "max_tokens": max(lengths),
            "max_new_tokens": settings.max_new_tokens}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=("translation", "summarization"), required=True)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--batches", type=int, default=20, help="dev batches decoded per rollout")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="a torch device: cpu, cuda, ...")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)

    import torch

    from hf_seqrl.models.base import DecodeSettings
    from hf_seqrl.models.seq2seq import rollout_generation_config

    torch.set_num_threads(args.threads)
    settings = replace(quality.SETTINGS[(args.task, False)], device=args.device)
    data_dir = args.data_dir or quality.DEFAULT_DATA
    work_dir = quality.default_work_dir(args.task)
    c_folder = quality.c_folder(settings, work_dir)
    if not os.path.isdir(c_folder):
        sys.exit(f"No checkpoint C in {c_folder}: run `python benchmarks/quality.py --task {args.task}` first.")
    splits = quality.load_task(settings, data_dir)
    tokenizer = quality.build_tokenizer(settings, splits["train"], os.path.join(work_dir, "tokenizer"))
    model = quality.load_model(settings, c_folder).eval()
    decode_settings = DecodeSettings.from_generation_config(
        rollout_generation_config(model, max_new_tokens=settings.max_new_tokens))
    rows = splits["dev"]
    batches = []
    for start in range(0, min(len(rows), args.batches * settings.batch_size), settings.batch_size):
        enc = tokenizer([r["source"] for r in rows[start:start + settings.batch_size]], truncation=True,
                        max_length=settings.max_source_tokens, padding=True, return_tensors="pt")
        batches.append((enc["input_ids"].to(args.device), enc["attention_mask"].to(args.device)))
    results = {name: time_rollout(model, batches, decode_settings, group, greedy_first)
               for name, (group, greedy_first) in ROLLOUTS.items()}
    print(f"| rollout ({args.task}, batch {settings.batch_size}) | tokens per row (mean / max / limit) | "
          "decode s, all rows | decode s, compacted | `generate` s | compacted / all rows | compacted / `generate` |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['mean_tokens']} / {r['max_tokens']} / {r['max_new_tokens']} | "
              f"{r['median_all_rows_s']:.3f} | {r['median_compacted_s']:.3f} | {r['median_generate_s']:.3f} | "
              f"{r['compacted_vs_all_rows']:.2f}× | {r['compacted_vs_generate']:.2f}× |")
    record = {"task": args.task, "command": "python benchmarks/compaction.py " + " ".join(argv or sys.argv[1:]),
              "checkpoint": os.path.relpath(c_folder, os.path.dirname(HERE)), "batch_size": settings.batch_size,
              "batches": len(batches), "device": args.device,
              "threads": args.threads, "torch": torch.__version__, "rollouts": results}
    output = args.output or os.path.join(HERE, "results", f"compaction_{args.task}.json")
    with open(output, "w") as f:
        json.dump(record, f, indent=2)
    return record


if __name__ == "__main__":
    main()
