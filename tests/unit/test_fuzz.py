"""Property tests (hypothesis): rewards never crash and stay in [0, 1]; losses stay finite with clean gradients."""

import math

import pytest
import sacrebleu
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hf_seqrl import losses
from hf_seqrl.functional.advantages import moments, scale_advantages, std_from_moments
from hf_seqrl.functional.logprobs import token_entropy, token_kl, token_logprobs_from_logits
from hf_seqrl.rewards import BUILTIN_REWARDS
from hf_seqrl.rewards import get_reward

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80)
long_text = st.text(alphabet="ab cde\u00e9\u4e2d ", min_size=500, max_size=3000)
nonblank = text.filter(lambda s: s.strip())


@FUZZ
@given(pred=st.one_of(text, long_text, st.sampled_from(["", "   ", "\n\t"])),
       refs=st.lists(nonblank, min_size=1, max_size=12))
@pytest.mark.parametrize("name", BUILTIN_REWARDS)
def test_rewards_never_crash_and_stay_in_unit_interval(name, pred, refs):
    value = get_reward(name)([pred], [refs])[0]
    assert 0.0 <= value <= 1.0
    if not pred.strip():
        assert value == 0.0


@FUZZ
@given(pred=nonblank, refs=st.lists(nonblank, min_size=1, max_size=5))
def test_bleu_and_chrf_equal_sacrebleu(pred, refs):
    assert get_reward("bleu")([pred], [refs])[0] == pytest.approx(
        min(1.0, sacrebleu.sentence_bleu(pred, refs).score / 100), abs=1e-12)
    assert get_reward("chrf")([pred], [refs])[0] == pytest.approx(
        min(1.0, sacrebleu.sentence_chrf(pred, refs).score / 100), abs=1e-12)


@st.composite
def masked_batch(draw):
    rows = draw(st.integers(1, 6))
    n = draw(st.sampled_from([1, 2, 3]))
    cols = draw(st.integers(1, 9))
    seed = draw(st.integers(0, 10_000))
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows * n, cols, 7, generator=gen) * draw(st.sampled_from([0.1, 1.0, 30.0]))
    mask = torch.rand(rows * n, cols, generator=gen) < draw(st.floats(0.0, 1.0))
    rewards = torch.rand(rows * n, generator=gen)
    ids = torch.randint(0, 7, (rows * n, cols), generator=gen)
    return logits, ids, mask, rewards, n


@FUZZ
@given(batch=masked_batch(), normalize=st.booleans())
def test_policy_gradient_finite_and_masked_positions_get_no_gradient(batch, normalize):
    logits, ids, mask, rewards, n = batch
    logits.requires_grad_(True)
    token_logprobs = token_logprobs_from_logits(logits, ids)
    baseline = losses.leave_one_out_baseline(rewards, n) if n >= 2 else torch.zeros_like(rewards)
    adv = losses.advantages(rewards, baseline)
    adv = scale_advantages(adv, std_from_moments(moments(adv)))
    loss = losses.policy_gradient_loss(token_logprobs, mask, adv, length_normalize=normalize)
    entropy = losses.masked_mean(token_entropy(logits).flatten(), mask.flatten(), 0)
    kl = losses.masked_mean(token_kl(logits, logits.detach() * 0.5).flatten(), mask.flatten(), 0)
    total = loss - 0.01 * entropy + 0.1 * kl
    assert math.isfinite(total.item())
    total.backward()
    assert torch.isfinite(logits.grad).all()
    assert (logits.grad[~mask] == 0).all()
