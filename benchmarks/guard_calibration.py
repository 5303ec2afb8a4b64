#!/usr/bin/env python
"""Calibrates the MT guards (`hf_seqrl.rewards.guards`) on Multi30k de->en, text only:

1. `source_copy`'s threshold: the distribution of sentence chrF between each training reference and its source
   (names, numbers and cognates carry over, so translations overlap their sources a little); the threshold is the
   99th percentile, so that 1% of real translations are penalized at all.
2. What each guard says of real translations and of gamed outputs on test_2016: the references (should pass), the
   sources copied as outputs (`source_copy` and `target_language` should catch them), and the references repeated
   three times (`repetition` should catch them). For each: the share of rows whose guard value is below 1, and the
   mean value.

    python benchmarks/guard_calibration.py --output benchmarks/results/guard_calibration.json

Reads `../shared/data/multi30k` (exits with a message without it). No model and no tensor: it runs on the CPU
whatever the machine. Prints a table and writes JSON with the command.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
DEFAULT_DATA = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "data"))


def read(data_dir: str, stem: str, lang: str) -> list[str]:
    path = os.path.join(data_dir, "multi30k", f"{stem}.{lang}.gz")
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: the calibration reads Multi30k from ../shared/data (see its README).")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f]


def percentile(sorted_values: list[float], q: float) -> float:
    """Returns the `q`-quantile of `sorted_values` (nearest rank)."""
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=DEFAULT_DATA)
    parser.add_argument("--output", default=os.path.join(HERE, "results", "guard_calibration.json"))
    args = parser.parse_args(argv)
    import sacrebleu

    from hf_seqrl.rewards.guards import repetition_reward, source_copy_reward, target_language_reward

    started = time.time()
    sources, references = read(args.data_dir, "train", "de"), read(args.data_dir, "train", "en")
    overlap = sorted(sacrebleu.sentence_chrf(ref, [src]).score / 100 for src, ref in zip(sources, references))
    quantiles = {f"p{int(q * 100)}": round(percentile(overlap, q), 4) for q in (0.5, 0.9, 0.95, 0.99)}
    threshold = quantiles["p99"]
    print(f"chrF(reference, source) over {len(overlap)} training pairs: " +
          ", ".join(f"{k} {v:.3f}" for k, v in quantiles.items()) + f", max {overlap[-1]:.3f}")

    test_sources, test_references = read(args.data_dir, "test_2016_flickr", "de"), \
        read(args.data_dir, "test_2016_flickr", "en")
    guards = {"source_copy": source_copy_reward(threshold), "target_language": target_language_reward("en"),
              "repetition": repetition_reward()}
    outputs = {"references": test_references, "copied sources": test_sources,
               "references x3": [" ".join([ref] * 3) for ref in test_references]}
    table = {}
    for name, predictions in outputs.items():
        table[name] = {}
        for guard_name, guard in guards.items():
            values = guard(predictions, [[ref] for ref in test_references], test_sources)
            table[name][guard_name] = {"penalized": round(sum(v < 1 for v in values) / len(values), 4),
                                       "mean": round(statistics.fmean(values), 4)}
    lines = ["| outputs | " + " | ".join(f"{g} penalized | {g} mean" for g in guards) + " |",
             "|---|" + "---|---|" * len(guards)]
    for name, row in table.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[g]['penalized']:.1%} | {row[g]['mean']:.3f}" for g in guards)
                     + " |")
    markdown = "\n".join(lines)
    print(markdown)
    result = {"command": "python benchmarks/guard_calibration.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "train_pairs": len(overlap), "test_rows": len(test_sources), "reference_source_chrf": quantiles,
              "source_copy_threshold": threshold, "table": table, "markdown": markdown,
              "seconds": round(time.time() - started, 1)}
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    main()
