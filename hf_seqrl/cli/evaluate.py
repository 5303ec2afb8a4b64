"""`hf-seqrl evaluate`: corpus scores of a checkpoint on a data file; the checkpoint-and-data arguments it shares with
`hf-seqrl diagnose`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch

from ..evaluation import evaluate_model
from ..rewards import BUILTIN_REWARDS
from . import parse_command


@dataclass
class CheckpointDataArguments:
    """The checkpoint, the data file and the batching shared by `hf-seqrl evaluate` and `hf-seqrl diagnose`."""

    model: str = field(metadata={"help": "Local directory (or Hub id) of a seq2seq or causal model and its tokenizer "
                                         "(causal models read each source as their prompt)."})
    data: str = field(metadata={"help": "A .json, .jsonl, .csv, .tsv or .txt file of source/target pairs."})
    source_column: str = field(default="source", metadata={"help": "Column of the sources."})
    target_column: str = field(default="target", metadata={"help": "Column of the references: a string or a list "
                                                                   "of references per row."})
    max_examples: int | None = field(default=None, metadata={"help": "Use only the first rows of the file."})
    batch_size: int = field(default=32, metadata={"help": "Sources per generate / forward call."})
    max_new_tokens: int | None = field(default=None, metadata={
        "help": "Decode budget in new tokens (evaluate: the model's default; diagnose: twice the longest reference "
                "plus 10)."})
    max_source_length: int | None = field(default=None, metadata={"help": "Truncate sources to this many tokens."})
    device: str | None = field(default=None, metadata={"help": "Default: cuda if available, else cpu."})

    def __post_init__(self):
        for name in ("batch_size", "max_examples", "max_new_tokens", "max_source_length"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (or left unset where optional), got {value}.")


@dataclass
class EvaluateArguments(CheckpointDataArguments):
    """`hf-seqrl evaluate`: corpus scores of a checkpoint on a data file."""

    metrics: list[str] = field(default_factory=lambda: ["bleu", "chrf"],
                               metadata={"help": f"Corpus metrics, from: {', '.join(BUILTIN_REWARDS)}."})
    num_beams: int = field(default=1, metadata={"help": "1 = greedy; more = beam search."})
    output: str | None = field(default=None, metadata={"help": "Write the scores (and settings) to this JSON file."})
    predictions: str | None = field(default=None, metadata={"help": "Write one JSON line per source with its "
                                                                    "output."})

    def __post_init__(self):
        super().__post_init__()
        unknown = [m for m in self.metrics if m not in BUILTIN_REWARDS]
        if unknown or not self.metrics:
            raise ValueError(f"metrics: unknown or no metric {unknown}; choose from {', '.join(BUILTIN_REWARDS)}.")
        if self.num_beams < 1:
            raise ValueError(f"num_beams must be >= 1, got {self.num_beams}.")


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


def evaluate_from_args(args: EvaluateArguments) -> int:
    """Returns 0 after scoring the model named in `args` on its data file and printing (and writing) the scores."""
    model, tokenizer, sources, references = load_model_and_pairs(args)
    scores, predictions = evaluate_model(model, tokenizer, sources, references, args.metrics,
                                         num_beams=args.num_beams, batch_size=args.batch_size,
                                         max_new_tokens=args.max_new_tokens,
                                         max_source_length=args.max_source_length)
    decoding = "greedy" if args.num_beams == 1 else f"beam {args.num_beams}"
    for name, value in scores.items():
        print(f"{name:<10}{value:8.2f}")
    print(f"({len(sources)} sources, {decoding}, corpus scores against every reference)")
    if args.output:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w") as f:
            json.dump({"scores": scores, "num_examples": len(sources), "decoding": decoding, "model": args.model,
                       "data": args.data, "max_new_tokens": args.max_new_tokens}, f, indent=2)
    if args.predictions:
        with open(args.predictions, "w") as f:
            for source, prediction, refs in zip(sources, predictions, references):
                f.write(json.dumps({"source": source, "prediction": prediction, "references": refs}) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Returns the exit status of `hf-seqrl evaluate` run with `argv` (default: sys.argv[1:])."""
    return evaluate_from_args(parse_command("evaluate", EvaluateArguments, argv))
