"""Two machines of one process each on 127.0.0.1, launched by recipes/slurm/multinode.sbatch as SLURM would run it.

`scontrol` and `srun` are stand-ins (`slurm_stand_ins`): the allocation's nodes are all 127.0.0.1, and srun starts
the command once per node, concurrently, with the node's SLURM_NODEID. So the script runs two `accelerate launch
--config_file recipes/accelerate_configs/multi_node_ddp.yaml --num_machines 2 --num_processes 2 --machine_rank 0|1
--main_process_ip 127.0.0.1 --main_process_port P` (CPU processes over gloo) of tests/distributed/multinode_worker.py,
which runs the `hf-seqrl train` pipeline (SCST) and `hf-seqrl distill-data`, each machine writing into a folder of
its own as onto a node-local disk. Every row of the training file has the same source, so two processes sampling
with the same keys would draw the same samples.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import REPO, byt5_tokenizer, free_port, launch_env, tiny_model

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                       reason="torch.distributed with the gloo backend is needed"),
]

SBATCH = REPO / "recipes" / "slurm" / "multinode.sbatch"
SOURCE = "der mann isst heute"
REFERENCES = ["the man eats today", "a man is eating", "the man is eating today", "today the man eats",
              "he eats today", "the man eats", "a man eats today", "the man has his meal today"]
STAND_INS = {
    # `scontrol show hostnames NODELIST`: one line per node of the allocation, here all this machine
    "scontrol": '[ "$1 $2" = "show hostnames" ] || exit 2\nfor _ in $(seq "$SLURM_NNODES"); do echo 127.0.0.1; done\n',
    # `srun [--option=value ...] COMMAND ...`: the command on every node at once, each with its SLURM_NODEID, each
    # node's output in $SRUN_LOGS/node<i>.log; fails when one fails
    "srun": ('while [ "${1#-}" != "$1" ]; do shift; done\npids=()\n'
             'for node in $(seq 0 $((SLURM_NNODES - 1))); do\n'
             '  SLURM_NODEID=$node SLURM_PROCID=$node SLURM_LOCALID=0 "$@" > "$SRUN_LOGS/node$node.log" 2>&1 &\n'
             '  pids+=($!)\ndone\nstatus=0\nfor pid in "${pids[@]}"; do wait "$pid" || status=$?; done\n'
             'exit $status\n'),
}


def slurm_stand_ins(folder: Path) -> Path:
    """Writes the `scontrol` and `srun` stand-ins into `folder/bin` and returns that folder."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    for name, body in STAND_INS.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    return bin_dir


@pytest.fixture(scope="module")
def two_machines(tmp_path_factory):
    """Returns `(out folder, the script's output, its port, {"<run><rank>": what the worker saved})` after the
    two-machine job."""
    tmp = tmp_path_factory.mktemp("two_machines")
    out = tmp / "out"
    out.mkdir()
    (out / "train.txt").write_text("".join(f"{SOURCE}\t{reference}\n" for reference in REFERENCES))
    tiny_model("t5", seed=3).save_pretrained(out / "teacher")
    byt5_tokenizer().save_pretrained(out / "teacher")
    port = free_port()
    env = dict(launch_env(tmp), SLURM_JOB_NODELIST="node[1-2]", SLURM_NNODES="2", GPUS_PER_NODE="1",
               MAIN_PROCESS_PORT=str(port), SLURM_SUBMIT_DIR=str(REPO), SRUN_LOGS=str(tmp),
               PATH=os.pathsep.join([str(slurm_stand_ins(tmp)), str(Path(sys.executable).parent), os.environ["PATH"]]))
    start = time.perf_counter()
    result = subprocess.run(["bash", str(SBATCH), "tests/distributed/multinode_worker.py", str(out)], cwd=tmp,
                            env=env, capture_output=True, text=True, timeout=420)
    print(f"two machines x 1 process: {time.perf_counter() - start:.1f} s")
    logs = "\n".join(f"--- node {i}\n{(tmp / f'node{i}.log').read_text()[-4000:]}" for i in (0, 1)
                     if (tmp / f"node{i}.log").exists())
    assert result.returncode == 0, f"exit code {result.returncode}\n{result.stdout}\n{result.stderr}\n{logs}"
    runs = {f"{run}{rank}": torch.load(out / f"{run}_rank{rank}.pt", weights_only=False)
            for run in ("save_on_each_node", "first", "resume_refused", "resumed") for rank in (0, 1)}
    return out, result.stdout, port, runs


def files_under(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())


def test_the_script_launches_one_machine_per_node(two_machines):
    out, stdout, port, runs = two_machines
    assert (f"2 nodes x 1 processes, machine 0 at 127.0.0.1:{port}, "
            "recipes/accelerate_configs/multi_node_ddp.yaml") in stdout
    for rank in (0, 1):  # one process group of two, each process the first (and only) of its machine
        run = runs[f"first{rank}"]
        assert (run["world_size"], run["process_index"], run["local_process_index"]) == (2, rank, 0)


def test_both_machines_hold_identical_parameters(two_machines):
    runs = two_machines[3]
    for run in ("first", "resumed"):
        for name, value in runs[f"{run}0"]["params"].items():
            assert torch.equal(value, runs[f"{run}1"]["params"][name]), (run, name)
    first, resumed = runs["first0"]["params"], runs["resumed0"]["params"]
    assert any(not torch.equal(first[k], resumed[k]) for k in first)  # the resumed step trained


def test_each_process_draws_its_own_samples(two_machines):
    """The sample log holds, at each step, both processes' samples of the same source: if both processes sampled with
    the same keys (one per machine-local process, say), their samples would be the same."""
    out = two_machines[0]
    for step in (1, 2, 3):
        rows = [json.loads(line) for line in (out / "machine0" / "run" / "completions" / f"step-{step}.jsonl")
                .read_text().splitlines()]
        assert [row["process"] for row in rows] == [0] * 4 + [1] * 4  # batch 2 x 2 samples on each process
        assert {row["source"] for row in rows} == {SOURCE}
        by_process = [[row for row in rows if row["process"] == p] for p in (0, 1)]
        # each process trained on rows of its own (the references tell them apart) ...
        references = [{ref for row in rows_of_process for ref in row["references"]} for rows_of_process in by_process]
        assert not references[0] & references[1], step
        # ... and sampled on its own: with the same keys, every sample of process 0 would equal process 1's at the same
        # place; with keys of their own, two samples agree by chance only (an empty one, say)
        predictions = [[row["prediction"] for row in rows_of_process] for rows_of_process in by_process]
        assert sum(a != b for a, b in zip(*predictions)) >= 3, (step, predictions)


def test_written_once_per_job_by_the_first_process(two_machines):
    """The model, its card, the sample log, the settings and the checkpoints are written once, on machine 0; machine 1
    keeps only what each process saves of its own (its random state in each checkpoint)."""
    out = two_machines[0]
    first = out / "machine0" / "run"
    assert (first / "README.md").read_text().count("- Algorithm: REINFORCE with leave-one-out baseline") == 1
    assert {"model.safetensors", "seqrl_run.json", "all_results.json", "README.md"} <= set(files_under(first))
    assert sorted(p.name for p in (first / "completions").iterdir()) == ["step-1.jsonl", "step-2.jsonl", "step-3.jsonl"]
    checkpoint = files_under(first / "checkpoint-2")
    assert {"model.safetensors", "optimizer.pt", "seqrl_state.json", "rng_state_0.pth"} <= set(checkpoint)
    assert "rng_state_1.pth" not in checkpoint
    assert json.loads((out / "machine1_files_before_copy.json").read_text()) == ["checkpoint-2/rng_state_1.pth"]


def test_save_on_each_node_is_refused_on_both_machines(two_machines):
    runs = two_machines[3]
    for rank in (0, 1):
        assert "save_on_each_node=True on a job of several machines" in runs[f"save_on_each_node{rank}"]["error"]


def test_a_checkpoint_on_one_machine_only_is_refused_then_resumed_from_a_copy(two_machines):
    """Resuming where machine 1 holds no checkpoint fails on both machines (none is left waiting); copied to the same
    path on machine 1, the checkpoint resumes: steps 1-2 come from it, step 3 trains."""
    runs = two_machines[3]
    for rank in (0, 1):
        error = runs[f"resume_refused{rank}"]["error"]
        assert "the processes did not find the same checkpoint" in error and "none on process(es) [1]" in error
    for rank in (0, 1):
        steps = [h["step"] for h in runs[f"resumed{rank}"]["log_history"] if "loss" in h]
        assert steps == [1, 2, 3], steps


def test_distill_data_shares_the_rows_among_the_machines(two_machines):
    """7 rows on 2 machines: machine 0 decodes rows 0-3 into its part, machine 1 rows 4-6 into its own, and machine 0
    writes the whole output, each row decoded as one process decodes that block."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_seqrl.evaluation import generate_texts

    out = two_machines[0]
    parts = [[json.loads(line) for line in (out / f"machine{m}" / f"distilled.process-{m}-of-2.jsonl")
              .read_text().splitlines()] for m in (0, 1)]
    sources = [line.split("\t")[0] for line in (REPO / "recipes/data/toy_de_en.test.txt").read_text().splitlines()][:7]
    assert [[row["source"] for row in part] for part in parts] == [sources[:4], sources[4:]]
    assert not (out / "machine1" / "distilled.jsonl").exists()
    whole = [json.loads(line) for line in (out / "machine0" / "distilled.jsonl").read_text().splitlines()]
    assert whole == parts[0] + parts[1]
    teacher = AutoModelForSeq2SeqLM.from_pretrained(out / "teacher").eval()
    tokenizer = AutoTokenizer.from_pretrained(out / "teacher")
    expected = [text for block in (sources[:4], sources[4:]) for text in
                generate_texts(teacher, tokenizer, block, num_beams=2, batch_size=2, max_new_tokens=8)]
    assert [row["teacher_target"] for row in whole] == expected
    record = json.loads((out / "machine0" / "distilled.jsonl.settings.json").read_text())
    assert (record["num_beams"], record["max_new_tokens"]) == (2, 8)
