"""Trainer callbacks for the cross-entropy warm-up: stop when a validation metric plateaus, keep the best weights.

Sequence-level training starts from a converged cross-entropy model (Ranzato et al. 2016; Edunov et al. 2018):
from a half-trained one, more cross-entropy wins trivially. `PlateauStopper` makes "converged" concrete.
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

# What the stopper writes into each Trainer checkpoint, so that a resumed run stops where an uninterrupted one would.
STATE_FILE = "plateau_stopper.json"
BEST_FILE = "plateau_stopper_best.safetensors"


class PlateauStopper(TrainerCallback):
    """Scores the model every `every` optimizer steps, keeps a copy of the best weights, and stops training after
    `patience` scores in a row without a new best (or once `max_seconds` of training have passed).

    Args:
        score_fn (`Callable[[PreTrainedModel], float]`): returns the validation metric (higher is better) of the
            model; called in whatever train/eval mode the model is in, so it should switch to eval itself.
        every (`int`): optimizer steps between two scores.
        patience (`int`): scores without a new best before stopping.
        max_seconds (`float`, *optional*): wall-clock cap of the training run, checked at every score.
        min_delta (`float`, *optional*, defaults to `0.0`): a score must beat the best by more than this to count.
        score_at_start (`bool`, *optional*, defaults to `False`): also score the model before the first step, so
            that the starting weights win if training never beats them (fine-tuning an already good model).

    After training, `best_state` holds the best weights (load them with `model.load_state_dict`), `best_step` and
    `best_score` say where they came from, `history` lists `(step, score)`, and `stop_reason` is `"plateau"`,
    `"time cap"` or `None` (the run ended on `max_steps`).

    With a `save_strategy`, each Trainer checkpoint also holds the stopper's state (its history, best score and
    weights, and the training seconds so far); `load_state(checkpoint)` before `train(resume_from_checkpoint=...)`
    takes it back, so a killed and resumed run scores, stops and restores as an uninterrupted one.
    """

    def __init__(self, score_fn: Callable, every: int, patience: int, max_seconds: float | None = None,
                 min_delta: float = 0.0, score_at_start: bool = False):
        if every < 1 or patience < 1:
            raise ValueError(f"PlateauStopper needs every >= 1 and patience >= 1, got every={every}, "
                             f"patience={patience}.")
        self.score_fn, self.every, self.patience = score_fn, every, patience
        self.max_seconds, self.min_delta, self.score_at_start = max_seconds, min_delta, score_at_start
        self.history: list[tuple[int, float]] = []
        self.best_score, self.best_step, self.best_state, self.stale = float("-inf"), 0, None, 0
        self.stop_reason: str | None = None
        self._start, self._resumed_seconds = None, 0.0

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._start = time.monotonic() - self._resumed_seconds
        if self.score_at_start and model is not None and not self.history:
            self._score(state.global_step, model)

    @property
    def seconds(self) -> float:
        """Training seconds so far, those of the runs this one resumed included."""
        return self._resumed_seconds if self._start is None else time.monotonic() - self._start

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if not state.is_world_process_zero or not os.path.isdir(folder):
            return
        from safetensors.torch import save_file

        if self.best_state is not None:
            save_file({k: v.contiguous() for k, v in self.best_state.items()}, os.path.join(folder, BEST_FILE))
        with open(os.path.join(folder, STATE_FILE), "w") as f:
            json.dump({"history": self.history, "best_score": self.best_score, "best_step": self.best_step,
                       "stale": self.stale, "seconds": self.seconds}, f)

    def load_state(self, checkpoint: str) -> None:
        """Takes back the state saved in the Trainer checkpoint folder `checkpoint` (see the class docstring)."""
        path = os.path.join(checkpoint, STATE_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{checkpoint} holds no {STATE_FILE}: it was saved without this PlateauStopper "
                                    f"among the callbacks; resume from a checkpoint saved with it, or start over.")
        with open(path) as f:
            saved = json.load(f)
        self.history = [tuple(h) for h in saved["history"]]
        self.best_score, self.best_step, self.stale = saved["best_score"], saved["best_step"], saved["stale"]
        self._resumed_seconds = saved["seconds"]
        best = os.path.join(checkpoint, BEST_FILE)
        if os.path.exists(best):
            from safetensors.torch import load_file

            self.best_state = load_file(best)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every:
            return
        self._score(state.global_step, model)
        if self.stale >= self.patience:
            self.stop_reason = "plateau"
        elif self.max_seconds is not None and time.monotonic() - self._start >= self.max_seconds:
            self.stop_reason = "time cap"
        control.should_training_stop = control.should_training_stop or self.stop_reason is not None

    def _score(self, step: int, model) -> None:
        score = float(self.score_fn(model))
        self.history.append((step, round(score, 4)))
        if score > self.best_score + self.min_delta:
            self.best_score, self.best_step, self.stale = score, step, 0
            self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            self.stale += 1

    def restore_best(self, model) -> None:
        """Loads the best weights seen into `model` (no-op when nothing was scored)."""
        if self.best_state is not None:
            model.load_state_dict(self.best_state)
