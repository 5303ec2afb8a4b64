"""COMET as a training reward: a tiny COMET checkpoint (tests/fixtures/comet, in the Hub layout) in `reward_funcs` trains
a tiny Marian with SCST. The policy's byte-level tokenizer and COMET's XLM-R tokenizer differ: the reward reads the
decoded text."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from helpers import COMET_FIXTURES, byt5_tokenizer, make_config, params, tiny_model, toy_pairs
from hf_seqrl import SCSTTrainer, SeqRLConfig
from hf_seqrl.rewards import CometReward


def logged_samples(trainer) -> list[dict]:
    """Returns the rows of every `completions/step-N.jsonl`, in step order."""
    folder = Path(trainer.args.output_dir) / "completions"
    paths = sorted(folder.glob("step-*.jsonl"), key=lambda p: int(p.stem.split("-")[1]))
    return [json.loads(line) for path in paths for line in path.read_text().splitlines()]


@pytest.mark.parametrize("name", ["regression", "xcomet"])
def test_two_scst_steps_with_a_comet_checkpoint_as_reward(tmp_path, name):
    sources, targets = toy_pairs(8, seed=0, alphabet="abcd", lengths=(2, 5))
    model = tiny_model("marian", dropout=0.1)
    before = params(model)
    reward = CometReward(COMET_FIXTURES / name, batch_size=4)
    args = make_config(SeqRLConfig, tmp_path, max_steps=2, per_device_train_batch_size=4, max_new_tokens=5,
                       num_samples=2, baseline="mean", log_completions=True, logging_steps=1)
    trainer = SCSTTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"source": sources, "target": targets}),
                          processing_class=byt5_tokenizer(), reward_funcs=reward)
    trainer.train()
    logged = [h["rl/reward"] for h in trainer.state.log_history if "rl/reward" in h]
    assert len(logged) == 2 and all(math.isfinite(r) for r in logged)
    assert any(not torch.equal(before[k], v) for k, v in params(model).items())  # the policy moved
    assert reward.device == trainer.args.device and not any(p.requires_grad for p in reward.model.parameters())
    rows = logged_samples(trainer)
    assert len(rows) == 2 * 4 * 2 and {r["source"] for r in rows} <= set(sources)
    # what the trainer logged is COMET's score of the decoded sample against its source and reference
    direct = reward([r["prediction"] for r in rows], [r["references"] for r in rows], [r["source"] for r in rows])
    assert [r["reward"] for r in rows] == pytest.approx(direct, abs=1e-5)
    assert len({round(r["reward"], 5) for r in rows}) > 1
    if name == "xcomet":
        assert len(reward.last_error_spans) == len(rows) and all(isinstance(s, list) for s in reward.last_error_spans)


def test_a_comet_folder_or_checkpoint_path_in_reward_funcs_is_a_comet_reward(tmp_path):
    sources, targets = toy_pairs(8, seed=0, alphabet="abcd", lengths=(2, 5))
    folder = COMET_FIXTURES / "regression"
    args = make_config(SeqRLConfig, tmp_path, max_steps=2, per_device_train_batch_size=4, max_new_tokens=5,
                       logging_steps=1)
    trainer = SCSTTrainer(model=tiny_model("marian", dropout=0.1), args=args, processing_class=byt5_tokenizer(),
                          train_dataset=Dataset.from_dict({"source": sources, "target": targets}),
                          reward_funcs=[str(folder), "chrf"])
    comet = trainer.reward_fn.rewards[0]
    assert isinstance(comet, CometReward) and trainer.reward_fn.names == ["comet", "chrf_reward"]
    trainer.train()
    assert len([h for h in trainer.state.log_history if "rl/rewards/comet/mean" in h]) == 2
    # the folder, its model.ckpt and a Path all load the checkpoint CometReward(folder) loads
    texts = (["abc", "dd"], [["abc"], ["da"]], ["abc", "dda"])
    expected = CometReward(folder)(*texts)
    from hf_seqrl.rewards.combine import as_reward
    for given in (folder, folder / "checkpoints" / "model.ckpt"):
        assert as_reward(given)(*texts) == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError, match="is a path but not a COMET checkpoint.*RewardModelReward"):
        as_reward(str(COMET_FIXTURES / "encoder-xlmr"))
