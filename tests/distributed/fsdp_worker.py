"""Run by tests/test_fsdp.py under `torchrun --nproc_per_node 2` (CPU, gloo): RL steps on a sharded model.

SHARDING `fsdp2`: a tiny T5 is sharded with torch's `fully_shard` (each block, then the root), as accelerate's
TRANSFORMER_BASED_WRAP does. `zero3`: the same model in a DeepSpeed ZeRO stage-3 engine (every parameter
partitioned, `stage3_param_persistence_threshold` 0), stepped with `engine.backward` / `engine.step`. An unsharded
copy with the same initial weights is the reference. Each step, on each model: seed, rollout
(`Seq2SeqFamily.sample`, greedy row + 2 samples), rewards, greedy baseline, `score` with the gold rows, the mixed
loss, backward, SGD. The reference averages its gradients over the ranks by hand, which is what FSDP2's
reduce-scatter does, so both runs follow the same trajectory. The ranks decode different lengths (their sources
and length limits differ), so a rank whose rows have ended must keep stepping while the other decodes.

Each rank writes OUT/rank<i>.pt: per step the losses, sample lengths and the collectives of the rollout decode of
both runs, the collectives of one decode of the sharded model layer by layer (`decode_per_layer`), and the final
parameters.

Usage: torchrun --nproc_per_node 2 tests/fsdp_worker.py OUT_DIR [fsdp2|zero3]
"""

from __future__ import annotations

import copy
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
from counting import CollectiveCounter  # noqa: E402
from helpers import byt5_tokenizer, shard_t5, skip_deepspeed_shm_build, tiny_model, whole_state_dict  # noqa: E402
from hf_seqrl import losses
from hf_seqrl.models.sharding import decode_per_layer, register_zero3
from hf_seqrl.models import family_for
from hf_seqrl.models.seq2seq import rollout_generation_config

STEPS = 3
MAX_NEW_TOKENS = (3, 9)  # per rank: rank 0's rows end six steps before rank 1's
SOURCES = (["ab", "cd"], ["a much longer source", "and one more"])


def toy_reward(sample_ids: torch.Tensor) -> torch.Tensor:
    """Returns a reward per row that depends on the sampled tokens (the share of even token ids)."""
    return (sample_ids % 2 == 0).float().mean(dim=1)


def rl_step(model, optimizer, batch, config, seed: int, average_gradients: bool, engine=None) -> dict:
    """Returns the loss and sample length of one SCST step (rl_weight 0.5) on `model`, after its SGD update (through
    the DeepSpeed `engine` when given: its backward and step reduce the gradients)."""
    ids, attn, labels = batch
    torch.manual_seed(seed)
    with CollectiveCounter() as collectives:
        rollout = family_for(model).sample(model, {"input_ids": ids, "attention_mask": attn}, config, 2, True)
    advantages = toy_reward(rollout.sample_ids) - toy_reward(rollout.greedy_ids).repeat_interleave(2)
    scored = family_for(model).score(engine or model, {"input_ids": ids, "attention_mask": attn}, rollout.sample_ids, 2,
                                     labels, 1.0)
    pg_loss = losses.policy_gradient_loss(scored.token_logprobs, rollout.sample_mask, advantages)
    loss = losses.mix_losses(pg_loss, losses.cross_entropy_from_logprobs(scored.gold_logprobs, labels), 0.5)
    if engine is not None:
        engine.backward(loss)
        engine.step()
        return {"loss": loss.item(), "length": rollout.sample_ids.shape[1], "decode": dict(collectives.counts)}
    loss.backward()
    if average_gradients:
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
            parameter.grad /= dist.get_world_size()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": loss.item(), "length": rollout.sample_ids.shape[1], "decode": dict(collectives.counts)}


def zero3_engine(model, lr: float):
    """Returns a DeepSpeed ZeRO-3 engine of `model` (every parameter partitioned) with an SGD optimizer."""
    import deepspeed

    skip_deepspeed_shm_build()
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr),
                                      config=config)
    return engine


def main(out: str, sharding: str = "fsdp2") -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    tokenizer = byt5_tokenizer()
    enc = tokenizer(SOURCES[rank], return_tensors="pt", padding=True)
    labels = tokenizer(text_target=[s[::-1] for s in SOURCES[rank]], return_tensors="pt", padding=True)["input_ids"]
    batch = (enc["input_ids"], enc["attention_mask"], labels.masked_fill(labels == 0, -100))
    sharded = tiny_model("t5", seed=0, layers=2)
    reference = copy.deepcopy(sharded)
    engine, optimizer = None, None
    if sharding == "zero3":
        engine = zero3_engine(sharded, lr=0.5)
        assert register_zero3(sharded, engine)
    else:
        shard_t5(sharded)
        optimizer = torch.optim.SGD(sharded.parameters(), lr=0.5)
    config = rollout_generation_config(reference, max_new_tokens=MAX_NEW_TOKENS[rank])
    runs = {"sharded": (sharded, optimizer, False, engine),
            "reference": (reference, torch.optim.SGD(reference.parameters(), lr=0.5), True, None)}
    history = {name: [] for name in runs}
    for step in range(STEPS):
        for name, (model, opt, average, eng) in runs.items():
            history[name].append(rl_step(model, opt, batch, config, 100 * step + rank, average, eng))
    # The control: decoding layer by layer (`ds3_gather_for_generation=False`), the sharded model gathers its weights
    # at every decoded token, in lockstep with the other rank.
    torch.manual_seed(rank)
    with decode_per_layer(), CollectiveCounter() as collectives:
        family_for(sharded).sample(sharded, {"input_ids": batch[0], "attention_mask": batch[1]}, config, 2, True)
    per_layer = dict(collectives.counts)
    unsharded = reference.state_dict()
    params = {name: (value, unsharded[name].detach().clone()) for name, value in whole_state_dict(sharded).items()}
    torch.save({"rank": rank, "sharding": sharding, "history": history, "per_layer": per_layer, "params": params},
               os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    del engine
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
