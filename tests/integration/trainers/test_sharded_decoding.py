"""`ds3_gather_for_generation` decides how a trainer's decodes run on a sharded model: gathered whole once (the
default), or layer by layer (`False`, for a model too large to hold whole on one device). One process over gloo with
an FSDP2 model, where a shard is the whole tensor and no gather is made: the collectives of both paths are counted on
2 processes in tests/distributed/test_fsdp.py."""

from functools import partial

import torch
import torch.distributed as dist

from helpers import byt5_tokenizer, make_config, overlap_reward, shard_t5, tiny_model, toy_dataset, toy_pairs
from hf_seqrl import SCSTTrainer, SeqRLConfig
from hf_seqrl.models import family_for
from hf_seqrl.models.seq2seq import rollout_generation_config

config = partial(make_config, SeqRLConfig, max_steps=1, num_samples=2)


def test_ds3_gather_for_generation_false_keeps_the_sharded_model_sharded_for_its_decodes(tmp_path):
    tok = byt5_tokenizer()
    trainers = {gather: SCSTTrainer(model=tiny_model("t5"), args=config(tmp_path / str(gather),
                                                                         ds3_gather_for_generation=gather),
                                    reward_funcs=overlap_reward, train_dataset=toy_dataset(tok, *toy_pairs(8)),
                                    processing_class=tok)
                for gather in (True, False)}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)
    try:
        model = shard_t5(tiny_model("t5", seed=0, layers=2))
        batch = dict(tok(["abc def", "a longer source here"], return_tensors="pt", padding=True))
        generation = rollout_generation_config(model, max_new_tokens=9)
        samples = {}
        for gather, trainer in trainers.items():
            torch.manual_seed(0)
            with trainer.decoding(model) as whole:
                assert whole == gather  # made whole for the decode, or left sharded (decodes in lockstep)
                samples[gather] = family_for(model).sample(model, batch, generation, 2, True).sample_ids
    finally:
        dist.destroy_process_group()
    assert torch.equal(samples[True], samples[False])  # the same samples either way
