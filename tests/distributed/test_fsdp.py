"""Rollouts and the scoring pass on a model sharded with FSDP2 (`fully_shard`) or DeepSpeed ZeRO-3, two CPU
processes over gloo.

accelerate's FSDP plugin needs GPUs (on CPU, accelerate falls back to MULTI_CPU and ignores it), so the Trainer is not
the driver here: tests/fsdp_worker.py shards the model as accelerate's TRANSFORMER_BASED_WRAP does and runs
the family's `sample`, `score` and the loss itself, beside an unsharded reference, with ranks that decode
different lengths.
"""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import REPO

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                       reason="torch.distributed with the gloo backend is needed"),
]



def _has_deepspeed() -> bool:
    try:
        importlib.import_module("deepspeed")
    except Exception:  # not installed, or no usable accelerator for it
        return False
    return True


@pytest.fixture(scope="module", params=["fsdp2", pytest.param("zero3", marks=pytest.mark.skipif(
    not _has_deepspeed(), reason="DeepSpeed is not installed (pip install deepspeed)"))])
def ranks(request, tmp_path_factory):
    """Returns what each rank of tests/fsdp_worker.py wrote, after a run under torchrun with a time limit, with the
    model sharded by FSDP2 or by DeepSpeed ZeRO-3."""
    out = tmp_path_factory.mktemp(request.param)
    with socket.socket() as s:  # a free port, so that concurrent runs do not collide
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               DS_ACCELERATOR="cpu", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(port), str(REPO / "tests" / "distributed" / "fsdp_worker.py"), str(out), request.param]
    # A rank that stopped decoding while the other still gathers weights would hang: the time limit catches it.
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"exit code {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in (0, 1)]


def test_ranks_decode_different_lengths(ranks):
    lengths = [[step["length"] for step in rank["history"]["sharded"]] for rank in ranks]
    assert lengths == [[3, 3, 3], [9, 9, 9]]


def gathers(collectives: dict) -> int:
    """Returns the all-gathers among counted `collectives` (FSDP2's gathers count as all_gather, ZeRO-3's as
    all_gather_into_tensor)."""
    return collectives.get("all_gather", 0) + collectives.get("all_gather_into_tensor", 0)


def test_a_rollout_gathers_the_sharded_model_once_whatever_its_length(ranks):
    # The ranks decode 3 and 9 tokens: an all-gather per token would count 6 more on rank 1. The whole model is
    # gathered once per rollout (FSDP2: one all-gather per sharded module; ZeRO-3: GatheredParameters), with no
    # all-reduce to keep ranks in lockstep.
    for step in range(3):
        decodes = [rank["history"]["sharded"][step]["decode"] for rank in ranks]
        assert decodes[0] == decodes[1], decodes
        assert gathers(decodes[0]) > 0, decodes  # the counter sees the sharded model's gathers
        assert decodes[0].get("all_reduce", 0) == 0
        if ranks[0]["sharding"] == "fsdp2":
            assert gathers(decodes[0]) <= 5  # the 4 blocks and the root


def test_a_layer_by_layer_decode_runs_in_lockstep_and_fsdp2_gathers_at_every_token(ranks):
    # The control of the test above: with `decode_per_layer` (ds3_gather_for_generation=False) the ranks decode in
    # lockstep to the longer rank's 9 tokens (all-reduces); FSDP2 gathers its blocks again at each token, which the
    # counter sees. ZeRO-3 keeps a gathered parameter while it is reused soon (`stage3_max_reuse_distance`), so its
    # gathers do not grow with the length on a model this small.
    once = gathers(ranks[1]["history"]["sharded"][0]["decode"])
    assert ranks[0]["per_layer"] == ranks[1]["per_layer"]
    for rank in ranks:
        assert rank["per_layer"].get("all_reduce", 0) > 0, rank["per_layer"]
        assert gathers(rank["per_layer"]) > 0
        if rank["sharding"] == "fsdp2":
            assert gathers(rank["per_layer"]) > once + 9, (rank["per_layer"], once)


def test_sharded_training_follows_the_unsharded_reference(ranks):
    # Same uniforms, same weights: the same samples; gradients differ only in summation order (FSDP2's or ZeRO-3's
    # reduce-scatter vs an all-reduce), observed |diff| <= 5e-7 in losses and parameters.
    for rank in ranks:
        sharded = [step["loss"] for step in rank["history"]["sharded"]]
        reference = [step["loss"] for step in rank["history"]["reference"]]
        assert sharded == pytest.approx(reference, abs=1e-5, rel=1e-5)
        assert len(set(sharded)) == 3  # the steps changed the model
        for name, (full, unsharded) in rank["params"].items():
            torch.testing.assert_close(full, unsharded, atol=1e-5, rtol=1e-5, msg=name)
