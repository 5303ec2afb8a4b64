"""`hf-seqrl demo --output_dir DIR`: the offline demo of `hf_seqrl.demo` (SCST against more cross-entropy on a
generated task), with its command-line arguments."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..demo import run_demo
from ..demo.run import HELDOUT_FILE, RESULTS_FILE


@dataclass
class DemoArguments:
    """`hf-seqrl demo`: where the results go, and how big the run is."""

    output_dir: str = field(default="hf_seqrl_demo", metadata={"help": "Where the model, tokenizer, card and "
                                                                       "results go."})
    seed: int = field(default=0, metadata={"help": "Seed of the generated task and of training."})
    quick: bool = field(default=False, metadata={"help": "A much smaller run (under a minute), for smoke tests."})


def main(argv: list[str] | None = None) -> int:
    """Returns the exit status of `hf-seqrl demo` run with `argv` (default: sys.argv[1:])."""
    from . import parse_command

    from . import closing_block

    args = parse_command("demo", DemoArguments, argv)
    run_demo(args.output_dir, seed=args.seed, quick=args.quick)
    out = args.output_dir
    print(closing_block("saved the SCST model", out, {"model": "model.safetensors", "card": "README.md",
                                                       "results": RESULTS_FILE, "held out": HELDOUT_FILE},
                        [f"hf-seqrl evaluate --model {out} --data {out}/{HELDOUT_FILE} --metrics bleu chrf",
                         f"hf-seqrl diagnose --model {out} --data {out}/{HELDOUT_FILE} --output_dir diag_out"]))
    return 0
