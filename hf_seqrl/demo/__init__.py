"""The demo that `hf-seqrl demo` runs and the benchmarks' `demo` task reuse: SCST against more cross-entropy on a
generated three-dialect toy translation task, offline, with a tiny model.

`task` builds the task, its word-level tokenizer, the model and the datasets; `arms` trains checkpoint C and the
arms from it (SCST, more cross-entropy, scheduled sampling); `run` prints the table and saves the SCST model, its
card and the results.
"""

from .arms import ARM_TITLES, ARMS, compare, greedy_scores, xe_trainer
from .run import HELDOUT_FILE, RESULTS_FILE, format_report, run_demo, run_with_settings, write_card
from .task import FULL, QUICK, DemoSettings, build_model, build_tokenizer, make_task, to_dataset

__all__ = ["ARMS", "ARM_TITLES", "FULL", "HELDOUT_FILE", "QUICK", "RESULTS_FILE", "DemoSettings", "build_model",
           "build_tokenizer", "compare", "format_report", "greedy_scores", "make_task", "run_demo",
           "run_with_settings", "to_dataset", "write_card", "xe_trainer"]
