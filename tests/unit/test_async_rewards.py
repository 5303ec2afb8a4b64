"""Async rewards (`async def`): run together on one event loop, alone or beside sync rewards, from a caller with or
without a running loop, with the same checks and errors as sync rewards."""

import asyncio
import pickle
import threading
import time

import pytest

from hf_seqrl.rewards import (PooledReward, build_reward, call_reward, call_reward_parts, call_rewards, combine_parts,
                              is_async_reward, reward_loop)

PREDS, REFS = ["a b", "a b c d"], [["a b"], ["a b"]]


async def slow_length(predictions, references, sources=None, **columns):
    await asyncio.sleep(0.3)
    return [float(len(p.split())) for p in predictions]


async def slow_half(predictions, references, sources=None, **columns):
    await asyncio.sleep(0.3)
    return [0.5] * len(predictions)


def exact(predictions, references, sources=None, **columns):
    return [float(p in refs) for p, refs in zip(predictions, references)]


class AsyncCallable:
    async def __call__(self, predictions, references, sources=None, **columns):
        await asyncio.sleep(0)
        return [1.0] * len(predictions)


def test_async_rewards_are_recognised():
    assert is_async_reward(slow_length) and is_async_reward(AsyncCallable())
    assert not is_async_reward(exact) and not is_async_reward("bleu")


def test_two_async_rewards_of_a_list_run_concurrently():
    reward = build_reward([slow_length, slow_half, exact], [1.0, 2.0, 10.0])
    call_reward(slow_half, PREDS, REFS)  # the loop's thread starts outside the timing
    start = time.perf_counter()
    parts = call_reward_parts(reward, PREDS, REFS, name="mix")
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5, f"two 0.3 s rewards took {elapsed:.2f} s: they ran one after the other"
    assert parts == {"slow_length": [2.0, 4.0], "slow_half": [0.5, 0.5], "exact": [1.0, 0.0]}
    # 1 * length + 2 * 0.5 + 10 * exact
    assert combine_parts(reward, parts) == [13.0, 5.0]


def test_an_async_reward_alone_and_an_async_callable_object():
    assert call_reward(slow_length, PREDS, REFS) == [2.0, 4.0]
    assert call_reward(AsyncCallable(), PREDS, REFS, name="obj") == [1.0, 1.0]
    assert call_rewards([("a", AsyncCallable()), ("b", exact)], PREDS, REFS) == [[1.0, 1.0], [1.0, 0.0]]


def test_a_caller_inside_a_running_event_loop_is_served_by_the_reward_loop():
    reward = build_reward([slow_length, slow_half])

    async def caller():
        # a notebook's situation: a loop runs in this thread, and the reward is called synchronously
        return reward(PREDS, REFS)

    assert asyncio.run(caller()) == [pytest.approx(1.25), pytest.approx(2.25)]
    loop = reward_loop()
    assert loop.is_running() and reward_loop() is loop  # one loop per process, kept between calls
    assert threading.current_thread() is threading.main_thread()


def test_an_async_reward_calling_a_combination_with_async_parts_does_not_wait_on_itself():
    inner = build_reward([slow_half, exact])

    async def outer(predictions, references, sources=None, **columns):
        return inner(predictions, references)

    assert call_reward(outer, PREDS, REFS) == [pytest.approx(0.75), pytest.approx(0.25)]


def test_async_values_are_checked_and_errors_name_the_reward():
    async def wrong_count(predictions, references, sources=None, **columns):
        return [1.0]

    async def failing(predictions, references, sources=None, **columns):
        await asyncio.sleep(0)
        raise KeyError("server said no")

    async def strict(predictions, references, sources):
        return [0.0] * len(predictions)

    with pytest.raises(ValueError, match="reward 'wrong_count' returned 1 values for 2 predictions"):
        call_reward(wrong_count, PREDS, REFS)
    with pytest.raises(RuntimeError, match=r"reward 'failing' raised KeyError at training step 3 on 2 rows, .*: 'server said no'"):
        call_rewards([("failing", failing), ("slow_half", slow_half)], PREDS, REFS, step=3)
    with pytest.raises(RuntimeError, match=r"reward 'strict' raised TypeError.*declare \*\*kwargs"):
        build_reward([strict, slow_half])(PREDS, REFS, domain=["x", "y"])
    # a None (the reward does not apply) passes through as from a sync reward
    async def partial(predictions, references, sources=None, **columns):
        return [None, 1.0]

    mixed = build_reward([partial, exact], [1.0, 10.0])
    assert mixed.parts(PREDS, REFS) == {"partial": [None, 1.0], "exact": [1.0, 0.0]}
    assert mixed(PREDS, REFS) == [10.0, 1.0]


def test_a_pooled_combination_with_an_async_part_equals_the_in_process_one():
    pooled = pickle.loads(pickle.dumps(PooledReward([slow_length, exact], [1.0, 1.0], workers=2, min_pairs=1)))
    predictions, references = PREDS * 2, REFS * 2
    try:
        assert pooled(predictions, references) == build_reward([slow_length, exact], [1.0, 1.0])(predictions,
                                                                                                   references)
    finally:
        if pooled._pool is not None:
            pooled._pool.shutdown()
