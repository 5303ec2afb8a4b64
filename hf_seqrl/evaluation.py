"""Corpus scores of a seq2seq model on a data file (`hf-seqrl evaluate`): greedy or beam search, every reference.

    hf-seqrl evaluate --model DIR --data test.jsonl --metrics bleu chrf --num_beams 4 --output scores.json
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .metrics import corpus_scores
from .rewards import BUILTIN_REWARDS


def generate_texts(model, tokenizer, sources: Sequence[str], *, num_beams: int = 1, batch_size: int = 32,
                   max_new_tokens: int | None = None, max_source_length: int | None = None,
                   progress: bool = True, desc: str = "generate") -> list[str]:
    """Returns the model's decoded output for each source, in order (greedy when `num_beams` is 1).

    Sources are batched by length (less padding); the model's own generation config applies otherwise (its
    `max_new_tokens` when not given), except that decoding always uses the KV cache (see
    `rollout.rollout_generation_config`). The model is left in its original train/eval mode.
    """
    from tqdm.auto import tqdm

    from .families import family_for

    family = family_for(model)
    if num_beams < 1 or batch_size < 1:
        raise ValueError(f"num_beams and batch_size must be >= 1, got {num_beams} and {batch_size}.")
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs = [""] * len(sources)
    kwargs = {"num_beams": num_beams, "do_sample": False, "use_cache": True}
    if max_new_tokens is not None:
        kwargs["max_new_tokens"] = max_new_tokens
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in tqdm(range(0, len(order), batch_size), desc=desc, leave=False, disable=not progress):
                rows = order[start:start + batch_size]
                batch = family.tokenize_sources(tokenizer, [sources[i] for i in rows], max_source_length)
                ids = family.generate(model, {k: v.to(model.device) for k, v in batch.items()}, **kwargs)
                for i, text in zip(rows, tokenizer.batch_decode(ids, skip_special_tokens=True)):
                    outputs[i] = text.strip()
    finally:
        model.train(was_training)
    return outputs


def evaluate_model(model, tokenizer, sources: Sequence[str], references: Sequence[Sequence[str]],
                   metrics: Sequence[str] = ("bleu", "chrf"), **generate_kwargs) -> tuple[dict[str, float], list[str]]:
    """Returns `(scores, predictions)`: corpus scores in [0, 100] against every reference of each source
    (`metrics.corpus_scores`), and the decoded outputs. `generate_kwargs` go to `generate_texts`."""
    unknown = [m for m in metrics if m not in BUILTIN_REWARDS]
    if unknown:
        raise ValueError(f"Unknown metric(s) {', '.join(unknown)}; choose from {', '.join(BUILTIN_REWARDS)}.")
    if len(sources) != len(references):
        raise ValueError(f"Got {len(sources)} sources but {len(references)} reference rows: give one row per source.")
    predictions = generate_texts(model, tokenizer, sources, **generate_kwargs)
    return corpus_scores(predictions, [list(r) for r in references], metrics), predictions


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

    from .data import load_pairs
    from .families import load_pretrained

    sources, references = load_pairs(args.data, args.source_column, args.target_column, args.max_examples)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_pretrained(args.model, trust_remote_code=False).to(device)
    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=False)
    return model, tokenizer, sources, references


def evaluate_main(argv: list[str] | None = None) -> int:
    """Returns the exit status of `hf-seqrl evaluate` run with `argv` (default: sys.argv[1:])."""
    from .cli import parse_command

    return evaluate_from_args(parse_command("evaluate", EvaluateArguments, argv))


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


def build_compute_metrics(tokenizer, metrics: Sequence = ("bleu", "chrf"), references: Sequence | None = None):
    """Returns a `compute_metrics` for `Seq2SeqTrainer`-style evaluation with `predict_with_generate=True`.

    Args:
        tokenizer: decodes the generated ids (and the labels when `references` is None).
        metrics (`list`): built-in names (`"bleu"`, `"chrf"`: sacrebleu corpus scores; ROUGE names: mean sentence F1;
            all in [0, 100], every reference of a source) and `evaluate.EvaluationModule`s, called once on the
            whole split; each numeric output of a module is reported as `<module name>_<output>` (just the name when
            the output carries it). A module whose `references` feature is not a sequence gets the first reference.
        references (`list[str | list[str]]`, *optional*): the split's references in dataset order (a `references`
            column keeps every reference); None scores against the decoded `labels`.

    The metrics also hold `gen_len`, the mean generated length in tokens.
    """
    from .rewards import _is_number, accepts_reference_lists, is_evaluation_module, normalize_references

    for metric in metrics:
        if not (is_evaluation_module(metric) or metric in BUILTIN_REWARDS):
            raise ValueError(f"compute_metrics: unknown metric {metric!r}; use one of {', '.join(BUILTIN_REWARDS)} or "
                             "an evaluate.EvaluationModule.")
    fixed = None if references is None else normalize_references(references)
    pad = tokenizer.pad_token_id

    def compute_metrics(prediction) -> dict[str, float]:
        ids = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        ids = np.where(ids < 0, pad, ids)
        texts = [t.strip() for t in tokenizer.batch_decode(ids, skip_special_tokens=True)]
        if fixed is None:
            labels = np.where(prediction.label_ids < 0, pad, prediction.label_ids)
            refs = [[t.strip()] for t in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        else:
            if len(texts) < len(fixed):
                raise ValueError(f"Got {len(texts)} predictions for {len(fixed)} references: evaluate the split "
                                 "whose references this compute_metrics was built with.")
            # Across processes the gather keeps the copies of the first rows that pad the last batches: the real
            # rows come first, in dataset order.
            texts, ids, refs = texts[: len(fixed)], ids[: len(fixed)], fixed
        scores = {"gen_len": float(np.mean([(row != pad).sum() for row in ids]))}
        names = [m for m in metrics if isinstance(m, str)]
        scores.update(corpus_scores(texts, refs, names))
        for module in (m for m in metrics if not isinstance(m, str)):
            module_refs = refs if accepts_reference_lists(module) else [r[0] for r in refs]
            for key, value in module.compute(predictions=texts, references=module_refs).items():
                if _is_number(value):
                    scores[module.name if key == module.name else f"{module.name}_{key}"] = float(value)
        return scores

    return compute_metrics
