"""MIXER: the Δ schedule, the loss by hand, continuations of a forced prefix, and the trainer."""

import pytest
import torch

from conftest import tiny_model, toy_pairs
from hf_seqrl import losses
from hf_seqrl.rollout import rollout_generation_config, sample_from_prefix, sample_rollout
from hf_seqrl.schedules import mixer_delta


def test_delta_grows_by_delta_every_increment():
    assert [mixer_delta(s, 2, 100) for s in (0, 99, 100, 250, 1000)] == [2, 2, 4, 6, 22]
    with pytest.raises(ValueError, match="delta >= 1"):
        mixer_delta(0, 0, 100)


def test_mixer_loss_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-0.5, -0.5, -1.0, 0.0]])
    prefix = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    cont = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([0.5, -2.0])
    # row 0: xe = 1 + 2 = 3, pg = -0.5 * (-3 - 4) = 3.5 -> 6.5; row 1: xe = 0.5, pg = 2 * (-0.5 - 1) = -3 -> -2.5
    assert losses.mixer_loss(logp, prefix, cont, adv).item() == pytest.approx((6.5 - 2.5) / 2)
    # no prefix: exactly the policy-gradient loss with sums over tokens
    none = torch.zeros_like(prefix)
    assert losses.mixer_loss(logp, none, cont, adv).item() == pytest.approx(
        losses.policy_gradient_loss(logp, cont, adv).item())


@pytest.mark.parametrize("arch", ["t5", "bart", "marian"])
def test_continuations_start_with_the_forced_prefix(arch, tokenizer):
    model = tiny_model(arch, seed=2)
    sources, _ = toy_pairs(3, seed=4, alphabet="abcd", lengths=(3, 5))
    enc = tokenizer(sources, return_tensors="pt", padding=True)
    prefix = torch.tensor([[5, 6], [7, 8], [9, 10]])
    config = rollout_generation_config(model, max_new_tokens=4)
    out = sample_from_prefix(model, enc["input_ids"], enc["attention_mask"], prefix, config, 2, with_greedy=True)
    assert out.sample_ids.shape[0] == 6 and out.greedy_ids.shape[0] == 3
    assert torch.equal(out.sample_ids[:, :2], prefix.repeat_interleave(2, dim=0))
    assert torch.equal(out.greedy_ids[:, :2], prefix)
    assert out.sample_ids.shape[1] <= 2 + 4 and out.sample_mask[:, :2].all()
    # the greedy continuation is the argmax path of the model given the prefix
    forced = torch.cat([torch.full((3, 1), model.generation_config.decoder_start_token_id), prefix], dim=1)
    greedy = model.generate(**enc, decoder_input_ids=forced, do_sample=False, max_new_tokens=4)
    length = out.greedy_ids.shape[1]
    expected = greedy[:, 1:1 + length]
    assert torch.equal(out.greedy_ids[out.greedy_mask], expected[out.greedy_mask])


def test_without_greedy_rows_samples_match_a_plain_rollout_of_the_same_rng(tokenizer):
    # P >= 1 rows continue from the prefix; the sampling itself is generate's, from the global RNG
    model = tiny_model("t5", seed=2)
    sources, _ = toy_pairs(2, seed=4, alphabet="abcd", lengths=(3, 5))
    enc = tokenizer(sources, return_tensors="pt", padding=True)
    config = rollout_generation_config(model, max_new_tokens=5)
    torch.manual_seed(3)
    first = sample_from_prefix(model, enc["input_ids"], enc["attention_mask"], torch.tensor([[5], [6]]), config, 3)
    torch.manual_seed(3)
    again = sample_from_prefix(model, enc["input_ids"], enc["attention_mask"], torch.tensor([[5], [6]]), config, 3)
    assert torch.equal(first.sample_ids, again.sample_ids)
    plain = sample_rollout(model, enc["input_ids"], enc["attention_mask"], config, 3)
    assert plain.sample_ids.shape[0] == first.sample_ids.shape[0] == 6
