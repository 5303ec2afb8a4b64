"""`hf-seqrl distill-data`: a teacher's beam decodes of a data file's sources, as a text-column dataset (JSON lines):
the data of sequence-level knowledge distillation (cross-entropy on the teacher's outputs, `--target_column
teacher_target`, validated on the gold `--eval_target_column target`) and of `DistillationConfig.seq_kd` without
decoding during training. The decode settings are recorded beside the file (`OUTPUT.settings.json`): a run continues a
file begun with the same settings and refuses one begun with others, naming them, unless `--overwrite`."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import UsageError, parse_command


@dataclass
class DistillDataArguments:
    """`hf-seqrl distill-data`: the teacher, the data and where the decodes go."""

    teacher: str = field(metadata={"help": "Local directory (or Hub id) of the teacher and its tokenizer."})
    data: str = field(metadata={"help": "A .json, .jsonl, .csv, .tsv or .txt file with a source column."})
    output: str = field(metadata={
        "help": "The JSON lines file written (continued where a run stopped, if with the same decode settings: they "
                "are recorded in OUTPUT.settings.json)."})
    source_column: str = field(default="source", metadata={"help": "Column of the sources."})
    output_column: str = field(default="teacher_target", metadata={
        "help": "Column of the teacher's decode in the output; every column of the data is kept beside it."})
    num_beams: int = field(default=4, metadata={"help": "Beam width (Kim & Rush: the beam's best)."})
    batch_size: int = field(default=32, metadata={"help": "Sources per generate call."})
    max_new_tokens: int | None = field(default=None, metadata={"help": "Decode budget (default: the teacher's)."})
    max_source_length: int | None = field(default=None, metadata={"help": "Truncate sources to this many tokens."})
    max_examples: int | None = field(default=None, metadata={"help": "Use only the first rows of the file."})
    src_lang: str | None = field(default=None, metadata={
        "help": "Multilingual teachers (NLLB deu_Latn, mBART de_DE, M2M100 de): the sources' language code."})
    tgt_lang: str | None = field(default=None, metadata={
        "help": "The language code the decodes start with (the generation config's forced_bos_token_id)."})
    device: str | None = field(default=None, metadata={"help": "Default: cuda if available, else cpu."})
    overwrite: bool = field(default=False, metadata={
        "help": "Discard what --output holds and decode every row again (needed to change the teacher or the decode "
                "settings of a file already begun)."})

    def __post_init__(self):
        for name in ("num_beams", "batch_size", "max_new_tokens", "max_source_length", "max_examples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (or left unset where optional), got {value}.")


def distill_data(args: DistillDataArguments) -> int:
    """Returns 0 after writing the teacher's decodes of the data's sources to `args.output`."""
    from transformers import AutoTokenizer

    from ..data.files import load_text_files
    from ..evaluation import TEACHER_SETTINGS_SUFFIX, write_teacher_outputs
    from ..models import load_pretrained
    from ..models.languages import set_language_codes

    dataset = load_text_files({"data": args.data}, args.source_column)["data"]
    if args.source_column not in dataset.column_names:
        raise UsageError(f"{args.data}: no column {args.source_column!r}; available columns: "
                         f"{', '.join(dataset.column_names)}. Set --source_column to one of them.")
    if args.max_examples is not None:
        dataset = dataset.select(range(min(args.max_examples, len(dataset))))
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_pretrained(args.teacher, trust_remote_code=False).to(device)
    tokenizer = AutoTokenizer.from_pretrained(args.teacher, trust_remote_code=False)
    try:
        set_language_codes(model, tokenizer, args.src_lang, args.tgt_lang, "DistillDataArguments")
    except ValueError as error:
        raise UsageError(str(error)) from error
    try:
        written = write_teacher_outputs(model, tokenizer, list(dataset), args.source_column, args.output,
                                        output_column=args.output_column, num_beams=args.num_beams,
                                        batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                                        max_source_length=args.max_source_length, overwrite=args.overwrite)
    except ValueError as error:  # an output file from other data or settings, a source that tokenizes to nothing
        raise UsageError(str(error)) from error
    print(f"wrote {written} rows to {args.output} ({len(dataset)} in all; the teacher's decodes in "
          f"{args.output_column!r}, its settings in {args.output}{TEACHER_SETTINGS_SUFFIX}). Train on them, validating "
          f"on the gold references: hf-seqrl train ... --train_file {args.output} --target_column {args.output_column} "
          "--validation_file DEV_FILE --eval_target_column target")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Returns the exit status of `hf-seqrl distill-data` run with `argv` (default: sys.argv[1:])."""
    return distill_data(parse_command("distill-data", DistillDataArguments, argv))
