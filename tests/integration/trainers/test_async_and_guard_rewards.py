"""Rewards in a training run: async rewards (alone and beside others, scored together on the reward loop) and the
`length_ratio` guard named in `reward_funcs`."""

import asyncio
import math
import threading
import time
from functools import partial

from helpers import make_config, tiny_model, toy_dataset, toy_pairs
from hf_seqrl import SCSTTrainer, SeqRLConfig


args = partial(make_config, SeqRLConfig, max_steps=2, max_new_tokens=6)  # args(tmp_path, **overrides)


def data(tokenizer):
    src, tgt = toy_pairs(8, seed=3, alphabet="abcd", lengths=(2, 5))
    return toy_dataset(tokenizer, src, tgt).add_column("sources", src)


def test_async_rewards_train_beside_a_sync_one_and_run_together(tmp_path, tokenizer):
    calls, spans = [], []

    async def remote_overlap(predictions, references, sources, **columns):
        # a reward that waits on a server: the policy's thread is not the one that runs it
        start = time.perf_counter()
        await asyncio.sleep(0.2)
        spans.append((start, time.perf_counter()))
        calls.append(threading.current_thread() is threading.main_thread())
        return [len(set(p) & set(r[0])) / max(len(set(p) | set(r[0])), 1) for p, r in zip(predictions, references)]

    async def remote_constant(predictions, references, sources, **columns):
        start = time.perf_counter()
        await asyncio.sleep(0.2)
        spans.append((start, time.perf_counter()))
        return [0.25] * len(predictions)

    trainer = SCSTTrainer(model=tiny_model("t5"), args=args(tmp_path, reward_weights=[1.0, 1.0, 1.0]),
                          reward_funcs=[remote_overlap, "chrf", remote_constant], train_dataset=data(tokenizer),
                          processing_class=tokenizer)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "rl/reward" in entry]
    # SCST scores the samples and the greedy baseline: two calls a step, each off the policy's thread
    assert len(logs) == 2 and calls == [False] * 4
    for entry in logs:
        assert entry["rl/rewards/remote_constant/mean"] == 0.25 and entry["rl/rewards/remote_constant/std"] == 0.0
        assert 0.0 <= entry["rl/rewards/remote_overlap/mean"] <= 1.0
        parts = entry["rl/rewards/remote_overlap/mean"] + entry["rl/rewards/chrf_reward/mean"] + 0.25
        assert abs(entry["rl/reward"] - parts) < 1e-5
    # the two async rewards of each step overlapped in time
    for (a_start, a_end), (b_start, b_end) in zip(spans[::2], spans[1::2]):
        assert max(a_start, b_start) < min(a_end, b_end)


def test_a_lone_async_reward_trains(tmp_path, tokenizer):
    async def exact(predictions, references, sources, **columns):
        await asyncio.sleep(0)
        return [float(p == r[0]) for p, r in zip(predictions, references)]

    trainer = SCSTTrainer(model=tiny_model("t5"), args=args(tmp_path), reward_funcs=exact,
                          train_dataset=data(tokenizer), processing_class=tokenizer)
    trainer.train()
    assert all(math.isfinite(entry["rl/reward"]) for entry in trainer.state.log_history if "rl/reward" in entry)


def test_length_ratio_by_name_in_reward_funcs(tmp_path, tokenizer):
    seen = []

    def spy(predictions, references, sources, **columns):
        seen.append((list(predictions), [list(r) for r in references]))
        return [0.0] * len(predictions)

    trainer = SCSTTrainer(model=tiny_model("t5"), args=args(tmp_path, max_steps=1), reward_funcs=["length_ratio", spy],
                          train_dataset=data(tokenizer), processing_class=tokenizer)
    trainer.train()
    from hf_seqrl.rewards import get_reward

    # SCST scores the samples and the greedy baseline in two calls; the logged mean is the samples'
    means = []
    for predictions, references in seen:
        values = [v for v in get_reward("length_ratio")(predictions, references) if v is not None]
        means.append(sum(values) / len(values))
    logged = trainer.state.log_history[0]["rl/rewards/length_ratio/mean"]
    assert len(seen) == 2 and any(abs(logged - mean) < 1e-6 for mean in means)
