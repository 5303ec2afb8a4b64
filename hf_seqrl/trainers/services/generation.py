"""Where a rollout's randomness comes from, and rollouts decoded ahead for the micro-batches of an optimizer step.

`RolloutKeys` gives every sample row a key: the trainer's seed, the process, the optimizer step and the row's place
among the sources that process decodes in that step. A row's draws are a function of its key alone
(`functional.sampling.keyed_uniforms`), so decoding several micro-batches at once (`steps_per_generation > 1`)
samples exactly what decoding them one by one samples. `RolloutSource` numbers the micro-batches of each optimizer
step and holds the rollouts so decoded under their slots until their micro-batches train.
"""

from __future__ import annotations

import torch

from ...functional.sampling import row_keys, stream_key
from ...types import Rollout

MODEL_INPUTS = ("input_ids", "attention_mask", "labels")


class RolloutKeys:
    """Numbers the sources a process decodes within each optimizer step, in order, and returns their rows' keys."""

    def __init__(self, seed: int, process_index: int):
        self.seed, self.process_index = seed, process_index
        self._step, self._sources = None, 0

    def next(self, global_step: int, sources: int, num_samples: int, device) -> torch.Tensor:
        """Returns the keys `(sources * num_samples,)` of the next `sources` sources of optimizer step `global_step`
        (their samples contiguous, as in `Rollout.sample_ids`)."""
        if global_step != self._step:
            self._step, self._sources = global_step, 0
        first, self._sources = self._sources, self._sources + sources
        stream = stream_key(self.seed, self.process_index, global_step)
        return row_keys(stream, first * num_samples, sources * num_samples, device)


class RolloutSource:
    """Where each micro-batch's rollout comes from, by key: the optimizer step and the micro-batch's slot (its place
    among the micro-batches of that step, in the order they reach the loss). A rollout decoded ahead with the other
    micro-batches of its step (`steps_per_generation > 1`) waits under its slot; `take` hands it out, or None when
    the micro-batch decodes its own."""

    def __init__(self):
        self._step, self._next = None, 0
        self._ahead_step, self._ahead = None, {}

    def next_slot(self, global_step: int) -> int:
        """Returns the slot of the next micro-batch of optimizer step `global_step` (0 for its first)."""
        if global_step != self._step:
            self._step, self._next = global_step, 0
        slot, self._next = self._next, self._next + 1
        return slot

    def hold(self, global_step: int, rollouts: list[Rollout]) -> None:
        """Keeps `rollouts`, those of the micro-batches of optimizer step `global_step` in slot order (none: that
        step decodes each micro-batch's rollout when it trains)."""
        self._ahead_step, self._ahead = global_step, dict(enumerate(rollouts))

    def take(self, global_step: int, slot: int) -> Rollout | None:
        """Returns the rollout decoded ahead for slot `slot` of optimizer step `global_step`, or None."""
        return self._ahead.pop(slot, None) if global_step == self._ahead_step else None


def model_inputs(batch: dict, device) -> dict:
    """Returns the tensors of a collated batch that the model families read (`MODEL_INPUTS`), on `device`."""
    return {key: batch[key].to(device) for key in MODEL_INPUTS if torch.is_tensor(batch.get(key))}
