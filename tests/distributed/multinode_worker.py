"""Run by tests/distributed/test_multinode.py on each of two "machines" of one process each (two `accelerate launch
--num_machines 2 --machine_rank 0|1` on 127.0.0.1, started by recipes/slurm/multinode.sbatch), CPU over gloo.

Each machine writes into its own folder, `OUT/machine<rank>`, as a node-local disk would hold it, and runs the
pipeline of `hf-seqrl train` (`hf_seqrl.cli.train.train_main`) on `OUT/train.txt` in turn:

1. `save_on_each_node`: the run with `--save_on_each_node true`, refused before its first step (the error is kept).
2. `first`: 2 SCST steps, a checkpoint at step 2, the sample log on.
3. `resume_refused`: `--resume_from_checkpoint true` where machine 1's folder holds no complete checkpoint (only
   machine 0 writes them): refused on both machines alike, none left waiting (the error is kept).
4. machine 1 lists what its folder holds (`OUT/machine1_files_before_copy.json`), then copies machine 0's
   `checkpoint-2` into it (the fix the error names).
5. `resumed`: resumed from it for one more step.
6. `distill`: `hf-seqrl distill-data` of the teacher `OUT/teacher` over the toy test file, each machine writing to
   its own folder.

After each run it saves `OUT/<run>_rank<rank>.pt`: the trainer's parameters and log history (or the error).

Usage: python tests/distributed/multinode_worker.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import torch

torch.set_num_threads(1)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from helpers import whole_state_dict  # noqa: E402

import hf_seqrl.cli.train as pipeline  # noqa: E402
from hf_seqrl.cli.processes import destroy_process_group, no_accelerator  # noqa: E402

TRAINERS = []  # the trainer each pipeline run built


def keep_trainer(*args, **kwargs):
    trainer = BUILD_TRAINER(*args, **kwargs)
    TRAINERS.append(trainer)
    return trainer


BUILD_TRAINER, pipeline.build_trainer = pipeline.build_trainer, keep_trainer


def train(out: str, run: str, rank: int, *flags: str, refused: bool = False) -> None:
    """Runs the pipeline with `flags` on the common settings and saves what the run left on this process, or, when
    the run is to be `refused`, its error (and raises when it is not refused)."""
    common = ["--config", os.path.join(REPO, "recipes", "configs", "tiny_offline_translation.yaml"),
              "--train_file", os.path.join(out, "train.txt"), "--validation_file", "", "--test_file", "",
              "--eval_strategy", "no", "--tiny_d_model", "32", "--warmup_xe_steps", "0", "--num_samples", "2",
              "--per_device_train_batch_size", "2", "--max_new_tokens", "8", "--lr_scheduler_type", "constant",
              "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", "2", "--log_completions", "true",
              "--num_completions_to_print", "0", "--output_dir", os.path.join(out, f"machine{rank}", "run")]
    if refused:
        try:
            pipeline.train_main([*common, *flags])
        except ValueError as error:
            torch.save({"error": str(error)}, os.path.join(out, f"{run}_rank{rank}.pt"))
        else:
            raise AssertionError(f"{run}: not refused")
    else:
        pipeline.train_main([*common, *flags])
        trainer = TRAINERS[-1]
        torch.save({"params": whole_state_dict(trainer.accelerator.unwrap_model(trainer.model)),
                    "log_history": trainer.state.log_history, "world_size": trainer.args.world_size,
                    "process_index": trainer.args.process_index,
                    "local_process_index": trainer.args.local_process_index},
                   os.path.join(out, f"{run}_rank{rank}.pt"))
    TRAINERS.clear()


def main(out: str) -> None:
    from accelerate import PartialState

    from hf_seqrl.cli.distill_data import main as distill_data

    # The job's process group, set up here so that it outlives each pipeline run (a run destroys a group it set up).
    state = PartialState(cpu=no_accelerator())
    rank = state.process_index
    train(out, "save_on_each_node", rank, "--max_steps", "2", "--save_on_each_node", "true", refused=True)
    train(out, "first", rank, "--max_steps", "2")
    train(out, "resume_refused", rank, "--max_steps", "3", "--resume_from_checkpoint", "true", refused=True)
    state.wait_for_everyone()
    if rank == 1:  # what the error says to do: machine 0's checkpoint copied to the same path on machine 1
        run = os.path.join(out, "machine1", "run")
        with open(os.path.join(out, "machine1_files_before_copy.json"), "w") as f:
            json.dump(sorted(os.path.relpath(os.path.join(folder, name), run) for folder, _, names in os.walk(run)
                             for name in names), f)
        shutil.copytree(os.path.join(out, "machine0", "run", "checkpoint-2"),
                        os.path.join(out, "machine1", "run", "checkpoint-2"), dirs_exist_ok=True)
    state.wait_for_everyone()
    train(out, "resumed", rank, "--max_steps", "3", "--resume_from_checkpoint", "true")
    distill_data(["--teacher", os.path.join(out, "teacher"), "--data", os.path.join(REPO, "recipes", "data",
                                                                                    "toy_de_en.test.txt"),
                  "--output", os.path.join(out, f"machine{rank}", "distilled.jsonl"), "--max_examples", "7",
                  "--num_beams", "2", "--max_new_tokens", "8", "--batch_size", "2"])
    destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    # Every result is saved and the group destroyed: skip the interpreter's teardown, where a native thread left by
    # the backend can abort the process ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
