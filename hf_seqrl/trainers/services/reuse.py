"""Rollouts that serve several optimizer steps (`SeqRLConfig.num_iterations` = μ > 1).

The data side: `RepeatBlockSampler` draws the rows of each optimizer step (per-device batch × accumulation steps ×
processes) `μ` times in a row, so every process meets the micro-batches of a step again in the `μ − 1` steps
that follow. The Trainer's own bookkeeping (epochs, `max_steps`, skipping batches on resume) then stays right.

The rollout side: `RolloutReuse` keeps, per micro-batch slot of an optimizer step, the rollout taken in the first
step of the cycle (samples, advantages, log-probs at rollout time), and hands it back in the next `μ − 1` steps.
Optimizer step `s` belongs to cycle `s // μ`. A checkpoint taken inside a cycle saves the kept rollouts (one file
per process), so a resumed run continues the cycle on the same samples; a slot with no rollout of the current
cycle (the first RL step after a warm-up that ends inside a cycle) rolls out anew.
"""

from __future__ import annotations

import os
from typing import Callable

import torch
from torch.utils.data import Sampler

from ...types import RolloutBatch


class RepeatBlockSampler(Sampler):
    """Yields a shuffled order of the rows in blocks of `block_size`, each block `repeats` times in a row.

    An incomplete last block is dropped: its rows could not fill the micro-batches of every process. The order of
    an epoch is `randperm(seed + epoch)`, the epoch being read from `global_step` when iteration starts (the
    Trainer starts every epoch, and every resumed one, at a multiple of the epoch's steps).

    Args:
        num_rows (`int`): rows of the dataset.
        block_size (`int`): rows of one optimizer step over all processes.
        repeats (`int`): μ.
        seed (`int`): seed of the shuffling.
        global_step (`Callable[[], int]`): the Trainer's optimizer step count.
    """

    def __init__(self, num_rows: int, block_size: int, repeats: int, seed: int, global_step: Callable[[], int]):
        if num_rows < block_size:
            raise ValueError(
                f"num_iterations > 1 reuses the rollout of a whole optimizer step ({block_size} rows: per-device batch "
                f"x gradient_accumulation_steps x processes), but train_dataset has only {num_rows} rows.")
        self.num_rows, self.block_size, self.repeats, self.seed = num_rows, block_size, repeats, seed
        self.global_step = global_step

    @property
    def steps_per_epoch(self) -> int:
        return (self.num_rows // self.block_size) * self.repeats

    def __len__(self) -> int:
        return self.steps_per_epoch * self.block_size

    def __iter__(self):
        epoch = self.global_step() // self.steps_per_epoch
        generator = torch.Generator().manual_seed(self.seed + epoch)
        order = torch.randperm(self.num_rows, generator=generator).tolist()
        for start in range(0, self.num_rows - self.block_size + 1, self.block_size):
            block = order[start:start + self.block_size]
            for _ in range(self.repeats):
                yield from block


class RolloutReuse:
    """The rollouts of the current cycle, one per micro-batch slot of an optimizer step.

    Call `take` once per micro-batch, with its slot (`generation.RolloutSource`); after a miss, roll out, then call
    `keep` with the result.
    """

    FILE = "rollout_buffer_rank{rank}.pt"

    def __init__(self, num_iterations: int):
        self.num_iterations = num_iterations
        self.slots: dict[int, dict] = {}

    @staticmethod
    def check_dataset(train_dataset, num_iterations: int) -> None:
        """Raises a ValueError if `num_iterations > 1` and `train_dataset` cannot be drawn again (no length)."""
        if num_iterations > 1 and train_dataset is not None and not hasattr(train_dataset, "__len__"):
            raise ValueError(
                f"SeqRLConfig.num_iterations={num_iterations} draws each optimizer step's rows again for the steps "
                "that reuse their rollout, which needs a dataset with a length: use a map-style dataset or "
                "num_iterations=1.")

    def sampler(self, dataset, args, global_step: Callable[[], int]) -> RepeatBlockSampler:
        """Returns the train sampler that draws each optimizer step's rows `num_iterations` times."""
        block = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        seed = args.data_seed if args.data_seed is not None else args.seed
        return RepeatBlockSampler(len(dataset), block, self.num_iterations, seed, global_step)

    def take(self, global_step: int, slot: int) -> RolloutBatch | None:
        """Returns the rollout kept for slot `slot` of optimizer step `global_step` (its cycle's), or None. The
        trainer's `RepeatBlockSampler` gives each slot of a cycle's steps the same rows."""
        last_use = global_step % self.num_iterations == self.num_iterations - 1
        entry = self.slots.pop(slot, None) if last_use else self.slots.get(slot)  # free it after its last step
        if entry is None or entry["cycle"] != global_step // self.num_iterations:
            return None
        return entry["batch"]

    def holds(self, global_step: int) -> bool:
        """Returns whether the rollouts of optimizer step `global_step` are kept from an earlier step of its cycle
        (checked on the first slot: a cycle's slots are rolled out together)."""
        entry = self.slots.get(0)
        return entry is not None and entry["cycle"] == global_step // self.num_iterations

    def keep(self, global_step: int, slot: int, batch: RolloutBatch) -> None:
        """Keeps the rollout of `slot` for the rest of its cycle (nothing to keep after the cycle's last step)."""
        if global_step % self.num_iterations != self.num_iterations - 1:
            self.slots[slot] = {"cycle": global_step // self.num_iterations, "batch": batch}

    # ---- checkpoints: one file per process, since each process keeps the rollouts of its own micro-batches ----

    def save(self, folder: str, rank: int) -> None:
        path = os.path.join(folder, self.FILE.format(rank=rank))
        if not self.slots:
            if os.path.exists(path):
                os.remove(path)
            return
        state = {slot: {"cycle": e["cycle"],
                        "batch": {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in vars(e["batch"]).items()}}
                 for slot, e in self.slots.items()}
        os.makedirs(folder, exist_ok=True)
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)

    def load(self, folder: str, rank: int, device) -> None:
        path = os.path.join(folder, self.FILE.format(rank=rank))
        self.slots = {}
        if not os.path.isfile(path):
            return
        for slot, e in torch.load(path, map_location=device, weights_only=True).items():
            batch = RolloutBatch(**e["batch"])
            if batch.rng_state is not None:  # RNG states are CPU byte tensors, whatever the device
                batch.rng_state = tuple(None if state is None else state.cpu() for state in batch.rng_state)
            self.slots[int(slot)] = {"cycle": e["cycle"], "batch": batch}
