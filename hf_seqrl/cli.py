"""Command line: `hf-seqrl demo | train | evaluate | diagnose`."""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace, rest: list[str]) -> int:
    from .demo import run_demo

    run_demo(args.output_dir, seed=args.seed, quick=args.quick)
    return 0


def _train(args: argparse.Namespace, rest: list[str]) -> int:
    from .pipeline import train_main

    # The same code path as recipes/translation.py and recipes/summarization.py.
    train_main(rest)
    return 0


def _evaluate(args: argparse.Namespace, rest: list[str]) -> int:
    from .evaluation import evaluate_from_args

    return evaluate_from_args(args)


def _diagnose(args: argparse.Namespace, rest: list[str]) -> int:
    from .diagnostics import diagnose_from_args

    return diagnose_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-seqrl", description="Sequence-level RL for Hugging Face seq2seq models.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="Offline demo: teacher forcing, then SCST vs more cross-entropy, on a "
                                       "generated task with a tiny model (no network, a few minutes on a CPU).")
    demo.add_argument("--output-dir", default="hf_seqrl_demo", help="Where the model, tokenizer, card and "
                                                                     "results go (default: ./hf_seqrl_demo).")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--quick", action="store_true", help="A much smaller run (under a minute), for smoke tests.")
    demo.set_defaults(func=_demo)

    train = sub.add_parser("train", add_help=False,
                           help="Train from a YAML config (recipes/configs/*.yaml) with CLI overrides: "
                                "hf-seqrl train --config FILE.yaml [--field value ...]")
    train.set_defaults(func=_train)

    from .evaluation import add_evaluate_arguments

    evaluate = sub.add_parser("evaluate", help="Corpus BLEU / chrF / ROUGE of a seq2seq checkpoint on a data file "
                                               "(greedy or beam search, against every reference).")
    add_evaluate_arguments(evaluate)
    evaluate.set_defaults(func=_evaluate)

    from .diagnostics import add_diagnose_arguments

    diagnose = sub.add_parser("diagnose", help="Exposure-bias diagnostics of a seq2seq checkpoint: writes "
                                               "diagnostics.json and diagnostics.png.")
    add_diagnose_arguments(diagnose)
    diagnose.set_defaults(func=_diagnose)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] == "train":
        # Everything after `train` belongs to the training parser (HfArgumentParser), including --help.
        args, rest = parser.parse_args(["train"]), argv[1:]
    else:
        args, rest = parser.parse_args(argv), []
    return args.func(args, rest)


if __name__ == "__main__":
    sys.exit(main())
