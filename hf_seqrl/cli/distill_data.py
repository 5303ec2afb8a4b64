"""`hf-seqrl distill-data`: a teacher's beam decodes of a data file's sources, as a text-column dataset (JSON lines):
the data of sequence-level knowledge distillation (cross-entropy on the teacher's outputs, `--target_column
teacher_target`, validated on the gold `--eval_target_column target`) and of `DistillationConfig.seq_kd` without
decoding during training. `--decode mbr|qe` writes the teacher's (or the model's own) MBR or QE pick among sampled
candidates instead: MBR / QE fine-tuning's data (docs/mbr.md). The decode settings are recorded beside the file
(`OUTPUT.settings.json`): a run continues a file begun with the same settings and refuses one begun with others,
naming them, unless `--overwrite`.

Under `accelerate launch` (several processes, on one machine or several) each process decodes its block of rows into
a part file of its own (`process_part`), and the job's first process writes the output from every part (the parts'
lines travel over the process group, so the machines need no shared disk)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

import torch

from . import UsageError, parse_command
from .selection import SelectionArguments


@dataclass
class DistillDataArguments(SelectionArguments):
    """`hf-seqrl distill-data`: the teacher, the data and where the decodes go."""

    teacher: str = field(metadata={"help": "Local directory (or Hub id) of the teacher and its tokenizer."})
    data: str = field(metadata={"help": "A .json, .jsonl, .csv, .tsv or .txt file with a source column."})
    output: str = field(metadata={
        "help": "The JSON lines file written (continued where a run stopped, if with the same decode settings: they "
                "are recorded in OUTPUT.settings.json)."})
    source_column: str = field(default="source", metadata={"help": "Column of the sources."})
    output_column: str = field(default="teacher_target", metadata={
        "help": "Column of the teacher's decode in the output; every column of the data is kept beside it."})
    num_beams: int = field(default=4, metadata={"help": "Beam width (Kim & Rush: the beam's best) of --decode beam."})
    batch_size: int = field(default=32, metadata={"help": "Sources per generate call."})
    max_new_tokens: int | None = field(default=None, metadata={"help": "Decode budget (default: the teacher's)."})
    max_source_length: int | None = field(default=None, metadata={"help": "Truncate sources to this many tokens."})
    max_examples: int | None = field(default=None, metadata={"help": "Use only the first rows of the file."})
    src_lang: str | None = field(default=None, metadata={
        "help": "Multilingual teachers (NLLB deu_Latn, mBART de_DE, M2M100 de): the sources' language code."})
    tgt_lang: str | None = field(default=None, metadata={
        "help": "The language code the decodes start with (the generation config's forced_bos_token_id)."})
    device: str | None = field(default=None, metadata={
        "help": "Default: cuda if available, else cpu (under accelerate launch: each process's own device)."})
    overwrite: bool = field(default=False, metadata={
        "help": "Discard what --output holds and decode every row again (needed to change the teacher or the decode "
                "settings of a file already begun)."})

    def __post_init__(self):
        super().__post_init__()
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
    rows, output, state = list(dataset), args.output, several_processes()
    selection = args.selection()
    if state is not None:  # this process's block, into its own part file
        block = process_rows(len(rows), state.process_index, state.num_processes)
        rows = rows[block]
        output = process_part(args.output, state.process_index, state.num_processes)
        if selection:  # each block's candidates drawn from its own seeds, as one process draws its rows'
            selection["seed"] += block.start
    device = args.device or (str(state.device) if state is not None else "cuda" if torch.cuda.is_available() else "cpu")
    model = load_pretrained(args.teacher, trust_remote_code=False).to(device)
    tokenizer = AutoTokenizer.from_pretrained(args.teacher, trust_remote_code=False)
    try:
        set_language_codes(model, tokenizer, args.src_lang, args.tgt_lang, "DistillDataArguments")
    except ValueError as error:
        raise UsageError(str(error)) from error
    try:
        written = write_teacher_outputs(model, tokenizer, rows, args.source_column, output,
                                        output_column=args.output_column,
                                        num_beams=args.num_beams if args.decode in (None, "beam") else 1,
                                        batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                                        max_source_length=args.max_source_length, overwrite=args.overwrite,
                                        **selection)
    except ValueError as error:  # an output file from other data or settings, a source that tokenizes to nothing
        raise UsageError(str(error)) from error
    if state is not None:
        written = join_parts(state, output, args.output, written)
        if not state.is_main_process:
            return 0
    decodes = "decodes" if args.decode in (None, "beam") else f"{args.decode.upper()} picks"
    print(f"wrote {written} rows to {args.output} ({len(dataset)} in all; the teacher's {decodes} in "
          f"{args.output_column!r}, its settings in {args.output}{TEACHER_SETTINGS_SUFFIX}). Train on them, validating "
          f"on the gold references: hf-seqrl train ... --train_file {args.output} --target_column {args.output_column} "
          "--validation_file DEV_FILE --eval_target_column target")
    return 0


def several_processes():
    """Returns the job's `accelerate.PartialState` when a launcher started several processes, else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    from accelerate import PartialState

    from .processes import no_accelerator

    return PartialState(cpu=no_accelerator())  # without an accelerator, the processes join over gloo


def process_rows(num_rows: int, process_index: int, num_processes: int) -> slice:
    """Returns the rows process `process_index` of `num_processes` decodes: contiguous blocks in process order, one
    row more for each of the first `num_rows % num_processes` processes (7 rows on 2: rows 0-3, then 4-6)."""
    size, extra = divmod(num_rows, num_processes)
    start = process_index * size + min(process_index, extra)
    return slice(start, start + size + (process_index < extra))


def process_part(output: str, process_index: int, num_processes: int) -> str:
    """Returns the part file of one process beside `output` (`out.jsonl` -> `out.process-0-of-2.jsonl`), with the
    decode settings of its own beside it: a rerun on as many processes continues each part where it stopped."""
    root, extension = os.path.splitext(output)
    return f"{root}.process-{process_index}-of-{num_processes}{extension}"


def join_parts(state, part: str, output: str, written: int) -> int:
    """Writes `output` on the job's first process: the lines of every process's part in process order (the data's
    order), and a copy of its own part's settings record; returns the rows that all processes decoded, `written` on
    this one (a collective: every process calls it)."""
    from accelerate.utils import gather_object

    from ..evaluation import TEACHER_SETTINGS_SUFFIX

    with open(part, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    parts = sorted(gather_object([(state.process_index, written, lines)]))
    if state.is_main_process:
        with open(output + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(line for _, _, part_lines in parts for line in part_lines)
        os.replace(output + ".tmp", output)
        shutil.copyfile(part + TEACHER_SETTINGS_SUFFIX, output + TEACHER_SETTINGS_SUFFIX)
    return sum(count for _, count, _ in parts)


def main(argv: list[str] | None = None) -> int:
    """Returns the exit status of `hf-seqrl distill-data` run with `argv` (default: sys.argv[1:])."""
    return distill_data(parse_command("distill-data", DistillDataArguments, argv))
