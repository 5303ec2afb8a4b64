"""Dropout cannot bias the estimator: `disable_dropout`, and the KL reference pass replaying the policy's draws.

Checkpoints ship dropout 0.1; rollouts decode in eval mode while the scoring pass runs in train mode. With dropout on,
the scored log-probs are those of a randomly thinned network: at learning rate 0 the KL to the (identical) reference
and the ratios of a reused rollout move although the weights do not.
"""

from functools import partial

import pytest
import torch

from helpers import byt5_tokenizer, make_config, overlap_reward, tiny_model, toy_dataset, toy_pairs
from hf_seqrl import SCSTTrainer, SeqRLConfig
from hf_seqrl.models.base import disable_dropout, replayed_rng, rng_state
from hf_seqrl.models.tiny import build_tiny_model

config = partial(make_config, SeqRLConfig, learning_rate=0.0, num_samples=2)  # config(tmp_path, **overrides)


def dropout_model(arch: str, p: float = 0.3):
    if arch == "llama":
        return build_tiny_model("llama", vocab_size=384, d_model=32, layers=2, dropout=p, max_positions=128,
                                pad_token_id=0, eos_token_id=1, seed=0)
    return tiny_model(arch, dropout=p)


@pytest.mark.parametrize("arch", ["t5", "bart", "marian", "llama"])
def test_disable_dropout_makes_train_mode_equal_eval_mode(arch):
    model = dropout_model(arch)
    ids = torch.tensor([[5, 6, 7, 8, 1], [9, 10, 11, 1, 0]])
    inputs = dict(input_ids=ids, attention_mask=(ids != 0).long())
    if arch != "llama":
        inputs["decoder_input_ids"] = torch.tensor([[0, 5, 6, 7], [0, 9, 10, 11]])
    model.train()
    torch.manual_seed(0)
    with torch.no_grad():
        noisy = model(**inputs).logits
    assert not torch.allclose(noisy, model.eval()(**inputs).logits)  # dropout 0.3 is on in train mode
    assert disable_dropout(model) > 0
    config = model.config.get_text_config(decoder=True)
    assert max(getattr(config, name, 0.0) or 0.0 for name in ("dropout", "dropout_rate", "attention_dropout")) == 0.3
    model.train()
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, model.eval()(**inputs).logits, rtol=0, atol=0)


def test_replayed_rng_draws_the_same_dropout_masks():
    layer = torch.nn.Dropout(0.5)
    x = torch.ones(4, 8)
    state = rng_state(torch.device("cpu"))
    first = layer(x)
    with replayed_rng(state, torch.device("cpu")):
        again = layer(x)
    after = layer(x)
    assert torch.equal(first, again) and not torch.equal(first, after)


def train(tmp_path, **settings):
    tokenizer = byt5_tokenizer()
    src, tgt = toy_pairs(8, seed=1, alphabet="abcd", lengths=(3, 5))
    model = tiny_model("marian", dropout=0.3)
    trainer = SCSTTrainer(model=model, args=config(tmp_path, **settings), reward_funcs=overlap_reward,
                          processing_class=tokenizer, train_dataset=toy_dataset(tokenizer, src, tgt))
    trainer.train()
    return [h for h in trainer.state.log_history if "rl/reward" in h]


@pytest.mark.parametrize("disable", [True, False])
def test_kl_is_zero_at_learning_rate_zero_with_dropout_either_way(tmp_path, disable):
    # Marian with dropout 0.3: the reference pass runs in the policy's mode and replays its draws.
    logs = train(tmp_path, kl_coef=0.1, disable_dropout=disable, max_steps=3)
    assert len(logs) == 3 and all(h["rl/kl"] == 0.0 for h in logs)


def test_reused_rollout_ratios_stay_one_at_learning_rate_zero(tmp_path):
    logs = train(tmp_path, num_iterations=2, max_steps=4, disable_dropout=True)  # two full cycles
    assert len(logs) == 4
    assert all(h["rl/ratio_mean"] == pytest.approx(1.0, abs=1e-6) and h["rl/clip_fraction"] == 0.0 for h in logs)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_with_dropout_on_a_reused_rollout_replays_its_masks_and_keeps_exact_ratios(tmp_path, level):
    # At learning rate 0 the weights do not move; the second step's scoring pass replays the random draws of the first
    # (which gave p_old), so it thins the same units: every ratio is exactly 1 and nothing is clipped.
    logs = train(tmp_path, num_iterations=2, max_steps=2, disable_dropout=False, importance_sampling_level=level)
    for h in logs:
        assert h["rl/ratio_min"] == h["rl/ratio_max"] == 1.0 and h["rl/clip_fraction"] == 0.0, h
