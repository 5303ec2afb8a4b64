"""Command line: `hf-seqrl demo`."""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(args.output_dir, seed=args.seed, quick=args.quick)
    return 0


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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
