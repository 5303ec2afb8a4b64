"""Where a rollout's randomness comes from, and rollouts decoded ahead for the micro-batches of an optimizer step.

`RolloutKeys` gives every sample row a key: the trainer's seed, the process, the optimizer step and the row's place
among the sources that process decodes in that step. A row's draws are a function of its key alone
(`functional.sampling.keyed_uniforms`), so decoding several micro-batches at once (`steps_per_generation > 1`)
samples exactly what decoding them one by one samples. `RolloutsAhead` holds the rollouts so decoded until the
micro-batch each belongs to trains.
"""

from __future__ import annotations

import torch

from ..functional.sampling import row_keys, stream_key
from ..types import Rollout

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


class RolloutsAhead:
    """The rollouts decoded before their micro-batches train, in the order the micro-batches come."""

    def __init__(self):
        self._pending: list[tuple[torch.Tensor, Rollout]] = []

    def reset(self, entries: list[tuple[torch.Tensor, Rollout]]) -> None:
        """Replaces what is pending by `(input_ids, rollout)` of the micro-batches to come, in order."""
        self._pending = list(entries)

    def take(self, input_ids: torch.Tensor) -> Rollout | None:
        """Returns the rollout decoded ahead for the micro-batch `input_ids`, or None when none is pending."""
        if not self._pending:
            return None
        expected, rollout = self._pending.pop(0)
        if not torch.equal(expected, input_ids):
            self._pending.clear()
            raise RuntimeError(
                "The micro-batch to train is not the one its rollout was decoded for: with steps_per_generation > 1 "
                "the micro-batches of an optimizer step must reach the loss in the order the Trainer fetched them.")
        return rollout


def model_inputs(batch: dict, device) -> dict:
    """Returns the tensors of a collated batch that the model families read (`MODEL_INPUTS`), on `device`."""
    return {key: batch[key].to(device) for key in MODEL_INPUTS if torch.is_tensor(batch.get(key))}
