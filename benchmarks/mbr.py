#!/usr/bin/env python
"""MBR benchmark on Multi30k de->en: how much do MBR and QE decoding add to checkpoint C, at what cost per source, and
does MBR self-training (offline or online) bring that gain into greedy decoding at an equal budget of decoder positions?

    python benchmarks/mbr.py                     # the table, on 2 CPU cores (--jobs 2 --threads 1)
    python benchmarks/mbr.py --quick             # smoke run on a slice (minutes; also a test)
    python benchmarks/mbr.py --device cuda       # the same protocol on a GPU

Protocol (the quality benchmark's machinery, `quality_lib`)
1. C: the quality benchmark's translation checkpoint C (d 128, ffn 512, 3+3 layers; cross-entropy to the dev plateau,
   then annealed), scored on test (greedy, beam 4) and dev with the exposure diagnostics.
2. C's decodings of test and dev (`quality_lib.decodes`): greedy, beam 4, MBR with the `mbr_utility` (chrF) over 16 and
   over 32 epsilon samples (`mbr_epsilon` 0.02), and QE reranking of the 16 samples by C's own length-normalized
   log-likelihood (`TeacherLikelihoodReward` with C as the teacher). Each with its BLEU and chrF and its cost per
   source: the seconds of the candidates and of the selection apart, and the decoder positions.
3. C's MBR picks (16 epsilon samples, chrF) of the first `mbr_train_sources` training sources, decoded once: the
   offline arm's targets. Their decoder positions count in that arm's budget.
4. From C, `ARMS` x seeds units with the same budget of decoder positions: more cross-entropy (`xe`), cross-entropy on
   the offline picks (`mbr_offline`), MBR fine-tuning on each batch's fresh samples (`mbr_online`: `BestOfNTrainer`,
   16 samples, the chrF pick), SCST on BLEU (`scst`). Each unit is scored on test (greedy, beam 4) and dev as the
   quality benchmark's are. The results file's `target` says whether MBR self-training (the better of the two by mean)
   gains 1.0 greedy test BLEU over more cross-entropy outside the seed spread and comes within 0.5 of C's MBR decoding;
   `target_chrf` the same in chrF, the utility MBR maximizes.

Every stage and unit is cached in the work directory (benchmarks/cache/mbr_translation[...]): rerunning the same
command resumes where a run stopped. Each stage's wall-clock (of the invocation that finished it) goes into the
results file, benchmarks/results/mbr_translation.json, with the command.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, replace
from types import SimpleNamespace

from quality_lib import (SETTINGS, checkpoint_c, evaluate, load_model, run_arm, task_data,
                         write_dev_results, write_json)
from quality_lib.decodes import MBR_CANDIDATES, decode_split, decodes_markdown, decodings
from quality_lib.pool import cached
from quality_lib.report import format_markdown, format_table
from quality_lib.settings import MBR_ARMS, run_tag
from quality_lib.stages import (Stages, arms_summary, benchmark_parser, prepare_run, run_units_stage,
                                work_dir_of)
from quality_lib.units import mbr_picks, mbr_picks_stem

ARMS = ("xe", "mbr_offline", "mbr_online", "scst")
# What every arm shares: the learning rates the quality benchmark chose on dev for C, the budget and the offline arm's
# sources sized to the 2-core time plan (benchmarks/README.md, "MBR benchmark").
ARM_SETTINGS = {"arm_lr": 5e-5, "rl_lr": 5e-5, "center_advantages": True, "budget_positions": 6_000_000,
                "mbr_train_sources": 5000, "seeds": (0, 1, 2)}
# --quick: the quality benchmark's quick C, smaller splits, 4 samples per source for the arms.
QUICK = {"dev_size": 40, "test_limit": 40, "budget_positions": 40_000, "mbr_samples": 4, "mbr_train_sources": 48,
         "seeds": (0,)}


def protocol_settings(quick: bool, device: str):
    """Returns the benchmark's settings: the quality benchmark's translation C with `ARM_SETTINGS` (`--quick`: its
    quick C with `QUICK`)."""
    base = replace(SETTINGS[("translation", quick)], device=device)
    return replace(base, **{**ARM_SETTINGS, **(QUICK if quick else {})})


def default_work_dir(quick: bool, device: str) -> str:
    return work_dir_of("mbr_translation", quick, device)


def build_parser():
    return benchmark_parser(__doc__.split("\n")[0], "mbr_translation", ARMS, "; C's decodings are skipped",
                            'where every phase runs',
                            'budget_positions=3000000 mbr_train_sources=3000')


def mbr_target(arms: dict, decodes: dict, metric: str = "bleu", decoding: str = "greedy") -> dict:
    """Returns the check of MBR self-training: the better MBR arm present (by mean `decoding` `metric` on test), its
    gain over more cross-entropy, whether that lies outside the seed spread (its worst seed above cross-entropy's
    best), its distance below C's MBR decoding over `MBR_CANDIDATES[0]` samples, and whether the goal (+1.0 outside
    the spread, within 0.5 of C's MBR decoding) is met; {} without cross-entropy or an MBR arm."""
    mine = [arm for arm in MBR_ARMS if arm in arms]
    if "xe" not in arms or not mine:
        return {}
    best = max(mine, key=lambda a: arms[a][decoding][metric]["mean"])
    row, xe = arms[best][decoding][metric], arms["xe"][decoding][metric]
    name = f"mbr{MBR_CANDIDATES[0]}"
    c_mbr = decodes["test"][name][metric]
    gain, distance = round(row["mean"] - xe["mean"], 2), round(c_mbr - row["mean"], 2)
    outside = row["min"] > xe["max"]
    return {"best_arm": best, "gain_over_xe": gain, "outside_xe_spread": outside, "c_decoding": name,
            f"c_decoding_{metric}": c_mbr, "distance_to_c_decoding": distance,
            "met": gain >= 1.0 and outside and distance <= 0.5}


def main(argv: list[str] | None = None) -> dict:
    """Runs the benchmark with `argv` (default sys.argv[1:]); returns its results (with `--runs-only`, the units)."""
    args = build_parser().parse_args(argv)

    import torch

    settings, overrides, work_dir, output, suffix = prepare_run(
        args, protocol_settings(args.quick, args.device), "mbr_translation", default_work_dir(args.quick, args.device))
    start, stages = time.time(), Stages(work_dir)
    # C's decodings are named by what decides them besides C: another epsilon or utility is decoded and timed apart.
    decode_tag = run_tag(None, {k: v for k, v in overrides.items()
                                if k in ("mbr_epsilon", "mbr_utility", "max_new_tokens", "eval_batch")})
    picks = mbr_picks_stem(settings)
    names = {"c": "C", "score": "score C", "decode": "decodings of C on test and dev" + decode_tag,
             "picks": f"MBR picks of the training sources ({picks})",
             "units": "units" + run_tag(None, overrides) + suffix}

    torch.set_num_threads(args.c_threads)
    splits, tokenizer, dataset = task_data(settings, args.data_dir, work_dir)
    annealed = "C" if settings.anneal_lr is None else "C_annealed"
    c_record, c_folder = stages.run(names["c"], os.path.exists(os.path.join(work_dir, annealed, "record.json")),
                                    lambda: checkpoint_c(settings, splits, tokenizer, dataset, work_dir))
    units = [(arm, seed, os.path.join(work_dir, "runs", f"{arm}_seed{seed}{run_tag(arm, overrides)}{suffix}.json"))
             for seed in settings.seeds for arm in args.arms]

    def unit(arm: str, seed: int) -> dict:
        clock = time.time()
        record = run_arm(arm, seed, settings, splits, tokenizer, dataset, work_dir, c_folder, args.dev_only)
        return {**record, "unit_seconds": round(time.time() - clock)}

    if args.runs_only:
        torch.set_num_threads(args.threads)
        runs = [cached(path, lambda: unit(arm, seed)) for arm, seed, path in units]
        return {"runs": runs}

    extra_tag = run_tag(None, {k: v for k, v in overrides.items() if k in ("beams",)})
    evaluated = os.path.join(work_dir, "runs", f"C{extra_tag}.json")
    c_eval = stages.run(names["score"], os.path.exists(evaluated), lambda: cached(
        evaluated, lambda: evaluate(load_model(settings, c_folder), tokenizer, splits, settings, "C")))
    decodes = {}
    if not args.dev_only:
        folder = os.path.join(work_dir, "decodes" + decode_tag)
        done = all(os.path.exists(os.path.join(folder, f"{split}_{d}.json")) for split in ("test", "dev")
                   for d in decodings())

        def decode_all():
            model = load_model(settings, c_folder).eval()
            return {split: decode_split(model, tokenizer, splits[split], settings, folder, split)
                    for split in ("test", "dev")}

        decodes = stages.run(names["decode"], done, decode_all)
    picks_record = None
    if "mbr_offline" in args.arms:  # the offline arm's targets, decoded once before the units that read them
        picks_record = stages.run(
            names["picks"], os.path.exists(os.path.join(work_dir, f"{picks}.json")),
            lambda: mbr_picks(settings, splits, tokenizer, load_model(settings, c_folder).eval(), work_dir)[1])

    torch.set_num_threads(args.threads)
    runs = run_units_stage("mbr.py", args, work_dir, units, unit, stages, names["units"], start)
    command = "python benchmarks/mbr.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.dev_only:
        return write_dev_results(SimpleNamespace(task="translation", arms=args.arms), settings, overrides, command,
                                 c_eval, runs, args.output or output.replace(".json", "_dev.json"))
    summary = arms_summary(settings, c_eval, runs, ARMS)
    target = mbr_target(summary["arms"], decodes)
    target_chrf = mbr_target(summary["arms"], decodes, metric="chrf")  # the utility MBR maximizes
    table = format_table(settings, summary)
    markdown = decodes_markdown(decodes) + "\n\n" + format_markdown(settings, summary)
    results = {"task": "translation", "quick": args.quick, "device": args.device, "overrides": overrides,
               "command": command, "data": {split: len(rows) for split, rows in splits.items()},
               "settings": asdict(settings),
               "budget": "decoder token positions (generated + teacher-forced, padding included) per arm; "
                         "mbr_offline's include the decode of its picks",
               "c": {"checkpoint": c_record, "scores": c_eval}, "decodes": decodes, "mbr_picks": picks_record,
               "stage_seconds": {k: stages.seconds[k] for k in names.values() if k in stages.seconds},
               **summary, "rl_target": summary["target"], "target": target,
               "target_chrf": target_chrf, "markdown": markdown, "runs": runs,
               "wall_seconds": round(time.time() - start)}
    print(table)
    print()
    print(markdown)
    print()
    print("stages (s): " + ", ".join(f"{k} {v}" for k, v in results["stage_seconds"].items()))
    for metric, check in (("BLEU", target), ("chrF", target_chrf)):
        if check:
            print(f"{check['best_arm']}: {check['gain_over_xe']:+.2f} greedy {metric} over cross-entropy (outside "
                  f"spread: {check['outside_xe_spread']}), {check['distance_to_c_decoding']:+.2f} below C's "
                  f"{check['c_decoding']}; goal met: {check['met']}")
    return write_json(results, output)


if __name__ == "__main__":
    main()
