"""Command line: `hf-seqrl demo | train | evaluate | diagnose | distill-data`, one module per subcommand.

Every subcommand parses its flags with `HfArgumentParser` from its own dataclasses (snake_case flags, as in
`Seq2SeqTrainingArguments`); `hf-seqrl COMMAND --help` lists them. Library modules never import this package.
"""

from __future__ import annotations

import argparse
import importlib
import sys

MODELS = "an encoder-decoder (Marian, T5, BART, ...) or decoder-only (Llama, Qwen2, ...) checkpoint"

# name -> (one-line help, "module:function" taking the remaining argv and returning an exit status)
COMMANDS = {
    "demo": ("Offline demo: teacher forcing, then SCST vs more cross-entropy, on a generated task with a tiny "
             "model (no network, a few minutes on a CPU).", "hf_seqrl.cli.demo:main"),
    "train": ("Train " + MODELS + " from a YAML config (recipes/configs/*.yaml) with CLI overrides: hf-seqrl train "
              "--config FILE.yaml [--field value ...]. Logs rl/* rewards on the rewards' scale ([0, 1] for the "
              "built-ins) and corpus metrics (eval_bleu, eval_rougeL, ...) on 0-100, as evaluate and diagnose report "
              "them; saves seqrl_run.json, the settings evaluate reuses.", "hf_seqrl.cli.train:main"),
    "evaluate": ("Corpus BLEU / chrF / ROUGE (0-100) of " + MODELS + " on a data file (greedy or beam search, "
                 "against every reference), cutting and generating as the run's seqrl_run.json says unless flags "
                 "say otherwise.", "hf_seqrl.cli.evaluate:main"),
    "diagnose": ("Exposure-bias diagnostics of " + MODELS + ": writes diagnostics.json and diagnostics.png "
                 "(metrics 0-100).", "hf_seqrl.cli.diagnose:main"),
    "distill-data": ("A teacher's beam decodes of a data file's sources as JSON lines (every column kept, the decode "
                     "in teacher_target): sequence-level knowledge distillation's data; resumable.",
                     "hf_seqrl.cli.distill_data:main"),
}


class UsageError(ValueError):
    """A command line or config file the CLI cannot take; `main` prints its message (no traceback) and exits 2."""


def suggest(name: str, names) -> str:
    """Returns " (did you mean 'x'?)" naming the accepted names closest to `name`, or "" when none is close."""
    import difflib

    close = difflib.get_close_matches(name, list(names), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def flag_name(token: str) -> str | None:
    """Returns the field name of a `--name` or `--name=value` token, None for a value."""
    return token[2:].split("=", 1)[0].replace("-", "_") if token.startswith("--") and len(token) > 2 else None


def parse_dataclasses(parser, argv: list[str], where: str = "the command line") -> tuple:
    """Returns `parser.parse_args_into_dataclasses(argv)`, raising a `UsageError` that names each flag no dataclass
    has, with the closest accepted names (abbreviations are refused: `allow_abbrev=False`), or the rule of a
    config's validation that the values break."""
    try:
        *parsed, rest = parser.parse_args_into_dataclasses(argv, return_remaining_strings=True)
    except UsageError:
        raise
    except ValueError as error:  # a rule of a config's __post_init__: its message names the field and the fix
        raise UsageError(str(error)) from error
    if rest:
        accepted = [action.dest for action in parser._actions if action.option_strings]
        unknown = [token for token in rest if flag_name(token)] or rest
        named = "; ".join(f"{token}{suggest(flag_name(token) or token, accepted)}" for token in unknown)
        raise UsageError(f"{where}: unknown flag(s) {named}. `{parser.prog} --help` lists the accepted flags, "
                         "spelled out in full.")
    return tuple(parsed)


def parse_command(command: str, arguments_class: type, argv: list[str] | None):
    """Returns `argv` parsed into `arguments_class` by `HfArgumentParser`, with `hf-seqrl COMMAND`'s help text."""
    from transformers import HfArgumentParser

    parser = HfArgumentParser(arguments_class, prog=f"hf-seqrl {command}", description=COMMANDS[command][0],
                              allow_abbrev=False)
    (args,) = parse_dataclasses(parser, list(sys.argv[1:] if argv is None else argv))
    return args


def build_parser() -> argparse.ArgumentParser:
    """Returns the top-level parser: it reads only the command; the command's own parser reads the rest."""
    parser = argparse.ArgumentParser(prog="hf-seqrl", description="Sequence-level RL for Hugging Face encoder-decoder "
                                     "and decoder-only models.",
                                     epilog="`hf-seqrl COMMAND --help` lists the flags of a command.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, _) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def closing_block(title: str, output_dir: str, files: dict[str, str], next_commands: list[str]) -> str:
    """Returns what a command prints when it is done: where its outputs went (`files`: what -> file name in
    `output_dir`, those that exist) and the commands to run next."""
    import os

    lines = ["", f"{title}: {os.path.abspath(output_dir)}"]
    lines += [f"  {what:<10}{os.path.join(output_dir, name)}" for what, name in files.items()
              if os.path.exists(os.path.join(output_dir, name))]
    if next_commands:
        lines += ["next:"] + [f"  {command}" for command in next_commands]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Returns the exit status of `hf-seqrl` run with `argv` (default: sys.argv[1:])."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = build_parser().parse_args(argv[:1]).command
    module, function = COMMANDS[command][1].split(":")
    # `train` shares its parser with the recipes, which name themselves after the script (argparse's default prog,
    # sys.argv[0]); run from here, it is `hf-seqrl train`.
    program = sys.argv[0] if sys.argv else ""
    sys.argv[:1] = [f"hf-seqrl {command}"]
    try:
        return getattr(importlib.import_module(module), function)(argv[1:])
    except UsageError as error:
        print(f"hf-seqrl {command}: error: {error}", file=sys.stderr)
        return 2
    finally:
        sys.argv[:1] = [program]


if __name__ == "__main__":
    sys.exit(main())
