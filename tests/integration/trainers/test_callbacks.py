"""PlateauStopper: stops after `patience` scores without a new best, keeps and restores the best weights."""

import pytest
import torch
from transformers import TrainerControl, TrainerState

from hf_seqrl.callbacks import PlateauStopper


def drive(stopper, model, scores, every=1, start_weight=0.0):
    """Runs the callback over steps `every, 2*every, ...`; the weight at step s is s (so weights name their step).
    Returns the step at which it asked training to stop (None if never)."""
    state, control = TrainerState(), TrainerControl()
    values = iter(scores)
    stopper.score_fn = lambda m: next(values)
    with torch.no_grad():
        model.weight.fill_(start_weight)
    stopper.on_train_begin(None, state, control, model=model)
    for step in range(1, every * len(scores) + 1):
        state.global_step = step
        with torch.no_grad():
            model.weight.fill_(float(step))
        stopper.on_step_end(None, state, control, model=model)
        if control.should_training_stop:
            return step
    return None


def test_stops_after_patience_scores_without_a_new_best_and_restores_the_best():
    model = torch.nn.Linear(1, 1, bias=False)
    stopper = PlateauStopper(None, every=2, patience=2)
    # scores at steps 2, 4, 6, 8, 10: best at 6; 8 and 10 do not beat it -> stop at 10
    assert drive(stopper, model, [1.0, 3.0, 5.0, 4.0, 5.0, 9.0], every=2) == 10
    assert stopper.best_step == 6 and stopper.best_score == 5.0 and stopper.stop_reason == "plateau"
    assert stopper.history == [(2, 1.0), (4, 3.0), (6, 5.0), (8, 4.0), (10, 5.0)]
    stopper.restore_best(model)
    assert model.weight.item() == 6.0


def test_min_delta_and_time_cap():
    model = torch.nn.Linear(1, 1, bias=False)
    stopper = PlateauStopper(None, every=1, patience=2, min_delta=0.5)
    # +0.2 and +0.4 over the best do not count with min_delta 0.5 -> plateau at step 3
    assert drive(stopper, model, [1.0, 1.2, 1.4, 9.0]) == 3 and stopper.best_step == 1
    capped = PlateauStopper(None, every=1, patience=10, max_seconds=0.0)
    assert drive(capped, model, [1.0, 2.0]) == 1 and capped.stop_reason == "time cap"


def test_score_at_start_keeps_the_starting_weights_when_training_never_beats_them():
    model = torch.nn.Linear(1, 1, bias=False)
    stopper = PlateauStopper(None, every=1, patience=2, score_at_start=True)
    assert drive(stopper, model, [7.0, 6.0, 6.5, 9.0], start_weight=-1.0) == 2
    assert stopper.best_step == 0 and stopper.history[0] == (0, 7.0)
    stopper.restore_best(model)
    assert model.weight.item() == -1.0


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="every >= 1 and patience >= 1"):
        PlateauStopper(lambda m: 0.0, every=0, patience=2)


def test_a_stopper_saved_in_a_checkpoint_and_loaded_again_stops_and_restores_as_an_uninterrupted_one(tmp_path):
    from types import SimpleNamespace

    scores = [1.0, 3.0, 5.0, 4.0, 5.0, 9.0]
    model = torch.nn.Linear(1, 1, bias=False)
    whole = PlateauStopper(None, every=2, patience=2)
    assert drive(whole, model, scores, every=2) == 10

    # The first run scores at steps 2, 4 and 6, the Trainer saves checkpoint-6, and the run is killed.
    first = PlateauStopper(None, every=2, patience=2)
    assert drive(first, model, scores[:3], every=2) is None
    (tmp_path / "checkpoint-6").mkdir()
    state = TrainerState(global_step=6, is_world_process_zero=True)
    first.on_save(SimpleNamespace(output_dir=str(tmp_path)), state, TrainerControl())
    assert first.seconds > 0

    resumed = PlateauStopper(None, every=2, patience=2)
    resumed.load_state(str(tmp_path / "checkpoint-6"))
    assert resumed.seconds == pytest.approx(first.seconds, abs=0.5)
    control, values = TrainerControl(), iter(scores[3:])
    resumed.score_fn = lambda m: next(values)
    resumed.on_train_begin(None, state, control, model=model)
    for step in (7, 8, 9, 10):
        state.global_step = step
        with torch.no_grad():
            model.weight.fill_(float(step))
        resumed.on_step_end(None, state, control, model=model)
    assert control.should_training_stop and resumed.stop_reason == "plateau"
    assert resumed.history == whole.history and resumed.best_step == whole.best_step == 6
    resumed.restore_best(model)
    assert model.weight.item() == 6.0


def test_loading_a_checkpoint_saved_without_the_stopper_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="saved without this PlateauStopper"):
        PlateauStopper(None, every=1, patience=1).load_state(str(tmp_path))
