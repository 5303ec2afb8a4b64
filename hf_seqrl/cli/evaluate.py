"""`hf-seqrl evaluate`: corpus scores of a checkpoint on a data file; the checkpoint-and-data arguments it shares with
`hf-seqrl diagnose`.

A folder saved by an hf-seqrl trainer holds `seqrl_run.json` (`hf_seqrl.evaluation.write_run_settings`): how the run
cut its sources and how its own evaluation generated. Both subcommands read it, so that scoring the folder
reproduces the trainer's `eval_*` metrics; a flag given on the command line wins over the file, and
`--no_run_settings` ignores it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch

from ..evaluation import RUN_SETTINGS_FILE, evaluate_model, prepare_sources, read_run_settings, run_generation_settings
from ..rewards import BUILTIN_REWARDS
from . import parse_command
from .selection import SelectionArguments


@dataclass
class CheckpointDataArguments:
    """The checkpoint, the data file and the batching shared by `hf-seqrl evaluate` and `hf-seqrl diagnose`."""

    model: str = field(metadata={"help": "Local directory (or Hub id) of an encoder-decoder or decoder-only model and "
                                         "its tokenizer (decoder-only models read each source as their prompt)."})
    data: str = field(metadata={"help": "A .json, .jsonl, .csv, .tsv or .txt file of source/target pairs."})
    source_column: str = field(default="source", metadata={"help": "Column of the sources."})
    target_column: str = field(default="target", metadata={"help": "Column of the references: a string or a list "
                                                                   "of references per row."})
    max_examples: int | None = field(default=None, metadata={"help": "Use only the first rows of the file."})
    batch_size: int = field(default=32, metadata={"help": "Sources per generate / forward call."})
    max_new_tokens: int | None = field(default=None, metadata={
        "help": "Decode budget in new tokens (evaluate: the run's generation_max_length, else the model's default; "
                "diagnose: per batch, max_new_tokens_ratio times its longest reference plus 10)."})
    max_source_length: int | None = field(default=None, metadata={
        "help": "Truncate sources (prompts: keep their last tokens) to this many tokens (default: as the run did, "
                f"from {RUN_SETTINGS_FILE}; without it, no truncation)."})
    source_prefix: str | None = field(default=None, metadata={
        "help": "Prepended to every source (a T5 task prefix; default: the run's)."})
    prompt_template: str | None = field(default=None, metadata={
        "help": "Decoder-only models: the prompt, with a {prompt} field that receives the source (default: the "
                "run's)."})
    use_chat_template: bool | None = field(default=None, metadata={
        "help": "Decoder-only models: send the prompt as a user message through the tokenizer's chat template "
                "(default: as the run did)."})
    run_settings: bool = field(default=True, metadata={
        "help": f"Read the truncation and generation settings the trainer saved with the model ({RUN_SETTINGS_FILE}); "
                "the flags given here win over them. --no_run_settings ignores the file."})
    device: str | None = field(default=None, metadata={"help": "Default: cuda if available, else cpu."})

    def __post_init__(self):
        for name in ("batch_size", "max_examples", "max_new_tokens", "max_source_length"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (or left unset where optional), got {value}.")
        if self.prompt_template is not None and "{prompt}" not in self.prompt_template:
            raise ValueError(f"prompt_template={self.prompt_template!r} has no {{prompt}} field for the source.")


@dataclass
class EvaluateArguments(SelectionArguments, CheckpointDataArguments):
    """`hf-seqrl evaluate`: corpus scores of a checkpoint on a data file."""

    metrics: list[str] | None = field(default=None, metadata={
        "help": f"Corpus metrics (0-100), from: {', '.join(BUILTIN_REWARDS)} (default: those the run's task reports, "
                "rouge1 rouge2 rougeL for summarization, else bleu chrf)."})
    num_beams: int | None = field(default=None, metadata={
        "help": "1 = greedy; more = beam search (default: the run's generation_num_beams, else 1)."})
    output: str | None = field(default=None, metadata={"help": "Write the scores (and settings) to this JSON file."})
    predictions: str | None = field(default=None, metadata={"help": "Write one JSON line per source with its "
                                                                    "output."})

    def __post_init__(self):
        super().__post_init__()
        if self.metrics is not None:
            unknown = [m for m in self.metrics if m not in BUILTIN_REWARDS]
            if unknown or not self.metrics:
                raise ValueError(f"metrics: unknown or no metric {unknown}; choose from {', '.join(BUILTIN_REWARDS)}.")
        if self.num_beams is not None and self.num_beams < 1:
            raise ValueError(f"num_beams must be >= 1, got {self.num_beams}.")
        if self.decode not in (None, "beam") and (self.num_beams or 1) > 1:
            raise ValueError(f"--decode {self.decode} decodes its candidates by --candidates (the beam's n-best: "
                             f"--num_candidates wide): drop --num_beams {self.num_beams}.")


def load_model_and_pairs(args: CheckpointDataArguments):
    """Returns `(model, tokenizer, sources, references)` named by `args`, the model on `args.device`."""
    from transformers import AutoTokenizer

    from ..data.files import load_pairs
    from ..models import load_pretrained

    sources, references = load_pairs(args.data, args.source_column, args.target_column, args.max_examples)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_pretrained(args.model, trust_remote_code=False).to(device)
    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=False)
    return model, tokenizer, sources, references


def resolve_settings(args: CheckpointDataArguments, family_name: str) -> tuple[dict, list[str]]:
    """Returns `(settings, from_run)`: the source and generation settings to use (the flags of `args` where given,
    else the run's `seqrl_run.json` unless `--no_run_settings`) and the names taken from the run's file. The run's
    MBR / QE decoding (`selection`) applies when neither `--decode` nor `--num_beams` is given."""
    run = run_generation_settings(read_run_settings(args.model), family_name) if args.run_settings else {}
    settings, from_run = {}, []
    for name in ("max_source_length", "max_length", "num_beams", "task", "source_prefix", "prompt_template",
                 "use_chat_template"):
        given = getattr(args, name, None)
        if given is not None:
            settings[name] = given
        elif name in run:
            settings[name] = run[name]
            from_run.append(name)
    if run.get("selection") and getattr(args, "decode", "beam") is None and getattr(args, "num_beams", 1) is None:
        settings["selection"] = run["selection"]
        from_run.append("selection")
    if args.max_new_tokens is not None and "max_length" in settings:  # a budget in new tokens replaces it
        del settings["max_length"]
        from_run.remove("max_length")
    return settings, from_run


def shape_sources(args: CheckpointDataArguments, model, sources: list[str]) -> tuple[list, dict, list[str]]:
    """Returns `(inputs, settings, from_run)`: the sources as the run fed them to the model (`prepare_sources`), and
    `resolve_settings(args, family)`."""
    from ..models import family_for

    family_name = family_for(model).name
    settings, from_run = resolve_settings(args, family_name)
    inputs = prepare_sources(sources, family_name, settings.get("source_prefix"), settings.get("prompt_template"),
                             bool(settings.get("use_chat_template")))
    return inputs, settings, from_run


def task_metrics(task: str | None) -> list[str]:
    """Returns the corpus metrics `hf-seqrl train` reports for `task` (`hf_seqrl.cli.train.task_metrics`)."""
    from .train import task_metrics as reported

    return list(reported(task or "translation"))


def evaluate_from_args(args: EvaluateArguments) -> int:
    """Returns 0 after scoring the model named in `args` on its data file and printing (and writing) the scores."""
    model, tokenizer, sources, references = load_model_and_pairs(args)
    inputs, settings, from_run = shape_sources(args, model, sources)
    metrics = args.metrics or task_metrics(settings.get("task"))
    selection = args.selection() or settings.get("selection") or {}
    num_beams = 1 if selection else settings.get("num_beams") or 1
    scores, predictions = evaluate_model(model, tokenizer, inputs, references, metrics, num_beams=num_beams,
                                         batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                                         max_length=settings.get("max_length"),
                                         max_source_length=settings.get("max_source_length"), **selection)
    decoding = "greedy" if num_beams == 1 else f"beam {num_beams}"
    record = None
    if selection:
        from ..candidates import SelectionDecoding

        chosen = SelectionDecoding(**selection)
        decoding, record = chosen.describe(), chosen.record()
    for name, value in scores.items():
        print(f"{name:<10}{value:8.2f}")
    cut = settings.get("max_source_length")
    budget = (f"{args.max_new_tokens} new tokens" if args.max_new_tokens else
              f"max_length {settings['max_length']}" if settings.get("max_length") else "the model's length limit")
    print(f"({len(sources)} sources, {decoding}, " + (f"sources cut to {cut} tokens" if cut else "sources not cut")
          + f", {budget}; corpus scores 0-100 against every reference)")
    if from_run:
        print(f"from {RUN_SETTINGS_FILE}: " + ", ".join(f"{name}={settings[name]!r}" for name in from_run))
    if args.output:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w") as f:
            json.dump({"scores": scores, "num_examples": len(sources), "decoding": decoding, "model": args.model,
                       "data": args.data, "max_new_tokens": args.max_new_tokens, "settings": settings,
                       "from_run_settings": from_run, "selection": record}, f, indent=2)
    if args.predictions:
        with open(args.predictions, "w") as f:
            for source, prediction, refs in zip(sources, predictions, references):
                f.write(json.dumps({"source": source, "prediction": prediction, "references": refs}) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Returns the exit status of `hf-seqrl evaluate` run with `argv` (default: sys.argv[1:])."""
    return evaluate_from_args(parse_command("evaluate", EvaluateArguments, argv))
