"""`hf-seqrl diagnose`: the diagnostics of a checkpoint on a data file, written as a JSON report and a PNG plot.

Sources are cut and shaped as the run did (`seqrl_run.json`, see `hf_seqrl.cli.evaluate`); the greedy decodes of a
batch stop at `max_new_tokens`, or by default at `max_new_tokens_ratio` times the batch's longest reference plus 10, at
most that ratio times its longest source plus 10.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..diagnostics import METRICS, format_summary, run_diagnostics, write_report
from . import parse_command
from .evaluate import CheckpointDataArguments, load_model_and_pairs, shape_sources


@dataclass
class DiagnoseArguments(CheckpointDataArguments):
    """`hf-seqrl diagnose`: where the report goes and what the measurements use."""

    output_dir: str = field(default="hf_seqrl_diagnostics", metadata={"help": "Where diagnostics.json/.png go."})
    metric: str = field(default="bleu", metadata={"help": f"Free-running metric (0-100) and gold choice, one of: "
                                                          f"{', '.join(METRICS)}."})
    max_new_tokens_ratio: float = field(default=2.0, metadata={
        "help": "Without max_new_tokens, a batch's greedy decodes stop after this times its longest reference plus "
                "10 new tokens, at most this times its longest source plus 10 (a model that never writes EOS decodes "
                "that many in each of a batch's "
                "1 + 2 x len(inject_positions) decodes)."})
    max_horizon: int = field(default=20, metadata={"help": "Positions k on the horizon curve."})
    inject_positions: list[int] = field(default_factory=lambda: [0, 1, 2, 4, 8],
                                        metadata={"help": "Positions j where a mistake is injected."})
    jacobian_positions: list[int] = field(default_factory=lambda: [1, 2, 4], metadata={
        "help": "Decoder input positions k perturbed for the empirical Jacobian."})
    jacobian_horizon: int = field(default=8, metadata={"help": "Offsets after k where the divergence is measured."})
    jacobian_epsilon: float = field(default=1e-3, metadata={
        "help": "Perturbation norm as a fraction of the embedding norm."})

    def __post_init__(self):
        super().__post_init__()
        if self.metric not in METRICS:
            raise ValueError(f"metric={self.metric!r} is not supported: choose one of {', '.join(METRICS)}.")
        if self.max_new_tokens_ratio <= 0:
            raise ValueError(f"max_new_tokens_ratio must be > 0, got {self.max_new_tokens_ratio}.")
        if self.max_horizon < 1:
            raise ValueError(f"max_horizon must be >= 1, got {self.max_horizon}.")
        if any(j < 0 for j in self.inject_positions):
            raise ValueError(f"inject_positions must all be >= 0, got {self.inject_positions}.")
        if any(k < 0 for k in self.jacobian_positions) or self.jacobian_horizon < 1:
            raise ValueError(f"jacobian_positions must be >= 0 and jacobian_horizon >= 1, got "
                             f"{self.jacobian_positions} and {self.jacobian_horizon}.")
        if not 0 < self.jacobian_epsilon < 1:
            raise ValueError(f"jacobian_epsilon must be in (0, 1), got {self.jacobian_epsilon}.")


def diagnose_from_args(args: DiagnoseArguments) -> int:
    """Returns 0 after loading the model and data named in `args`, running the diagnostics and writing the report."""
    model, tokenizer, sources, references = load_model_and_pairs(args)
    inputs, settings, from_run = shape_sources(args, model, sources)
    report = run_diagnostics(model, tokenizer, inputs, references, max_horizon=args.max_horizon,
                             inject_positions=args.inject_positions, metric=args.metric, batch_size=args.batch_size,
                             max_new_tokens=args.max_new_tokens, max_new_tokens_ratio=args.max_new_tokens_ratio,
                             max_examples=args.max_examples, max_source_length=settings.get("max_source_length"),
                             jacobian_positions=args.jacobian_positions,
                             jacobian_horizon=args.jacobian_horizon, jacobian_epsilon=args.jacobian_epsilon)
    report["config"]["from_run_settings"] = {name: settings[name] for name in from_run
                                             if name not in ("max_length", "num_beams")}
    paths = write_report(report, args.output_dir)
    print(format_summary(report))
    print(f"\nwrote {paths['json']} and {paths['png']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Returns the exit status of `hf-seqrl diagnose` run with `argv` (default: sys.argv[1:])."""
    return diagnose_from_args(parse_command("diagnose", DiagnoseArguments, argv))
