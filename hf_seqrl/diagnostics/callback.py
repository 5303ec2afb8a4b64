"""`DiagnosticsCallback`: the diagnostics of a small held-out set at evaluation time, as `eval_diag/*` metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import TrainerCallback
from transformers.utils import logging

from .measure import run_diagnostics

logger = logging.get_logger(__name__)


class DiagnosticsCallback(TrainerCallback):
    """Runs `run_diagnostics` on a small held-out set at every `every`-th evaluation.

    The headline numbers join the evaluation metrics as `eval_diag/<name>` (returned by `trainer.evaluate()`).
    The Trainer logs its metrics before `on_evaluate`; a callback bound to its trainer (`bind_trainer`, done
    by the hf-seqrl trainers themselves) logs the diagnostics as one more entry, so reporting integrations
    (TensorBoard, W&B) receive them; unbound, they extend the evaluation entry of `state.log_history`. Every
    process runs the diagnostics, so that sharded models (FSDP, ZeRO-3) decode in lockstep.
    """

    def __init__(self, tokenizer, sources: Sequence[str], references: Sequence[Any], every: int = 1, **run_kwargs):
        self.tokenizer, self.sources, self.references = tokenizer, list(sources), list(references)
        self.every, self.run_kwargs, self.num_evaluations = max(1, int(every)), run_kwargs, 0
        self.last_report: dict | None = None
        self.trainer = None

    def bind_trainer(self, trainer) -> "DiagnosticsCallback":
        """Logs the diagnostics through `trainer` (to its reporting integrations); returns the callback."""
        self.trainer = trainer
        return self

    def on_evaluate(self, args, state, control, metrics=None, model=None, **kwargs):
        self.num_evaluations += 1
        if model is None or (self.num_evaluations - 1) % self.every:
            return
        run_kwargs = {"progress": False, **self.run_kwargs}
        self.last_report = run_diagnostics(model, self.tokenizer, self.sources, self.references, **run_kwargs)
        values = {f"eval_diag/{key}": value for key, value in self.last_report["summary"].items() if value is not None}
        if metrics is not None:
            metrics.update(values)
        if self.trainer is not None:
            from transformers import Trainer

            # The base `log`: hf-seqrl's own would flush its buffered train metrics into this entry.
            Trainer.log(self.trainer, dict(values))
        else:
            last = state.log_history[-1] if state.log_history else {}
            if metrics and all(key in last for key in metrics if key not in values):
                # Trainer.evaluate logged its metrics just before this event: extend that entry, not a new row.
                last.update(values)
            else:
                state.log_history.append({**values, "step": state.global_step})
        if state.is_world_process_zero:
            logger.info("diagnostics: " + ", ".join(f"{k}={v:.4f}" for k, v in values.items()))
