"""The inverse-CDF sampler: hand-computed draws, and the distribution `generate(do_sample=True)` samples from."""

import pytest
import torch
from transformers import (EpsilonLogitsWarper, LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper,
                          TopPLogitsWarper)

from helpers import chi_square_p_value
from hf_seqrl.functional.sampling import (argmax_or_sample, draw_uniforms, inverse_cdf_sample, keyed_uniforms, mix32,
                                          rollout_uniforms, row_keys, sample_tokens, stream_key, warp_logits)

INF = float("inf")


def test_fixed_uniforms_pick_the_first_token_whose_cumulative_probability_reaches_them():
    # probabilities [0.1, 0.2, 0.3, 0.4]: cumulative [0.1, 0.3, 0.6, 1.0]
    logits = torch.tensor([0.1, 0.2, 0.3, 0.4]).log().expand(6, 4)
    uniforms = torch.tensor([0.05, 0.12, 0.29, 0.31, 0.75, 1.0])
    expected = [0, 1, 1, 2, 3, 3]
    assert inverse_cdf_sample(logits, uniforms).tolist() == expected
    # two levels, blocks of 3: block sums [0.6, 0.4]; u = 0.75 is in block 1 at 0.15 of its 0.4 -> token 3
    assert inverse_cdf_sample(logits, uniforms, block_size=3).tolist() == expected
    assert inverse_cdf_sample(logits, uniforms, block_size=1).tolist() == expected


def test_tokens_of_probability_zero_are_never_chosen():
    # probabilities [0.5, 0, 0, 0.5, 0]: cumulative [0.5, 0.5, 0.5, 1, 1]; u = 1 must give token 3, not 4
    logits = torch.tensor([[0.0, -INF, -INF, 0.0, -INF]]).expand(4, 5)
    uniforms = torch.tensor([0.2, 0.5000001, 0.9, 1.0])
    for block_size in (256, 2):
        assert inverse_cdf_sample(logits, uniforms, block_size).tolist() == [0, 3, 3, 3]


def test_warping_by_hand():
    # logits log([0.1, 0.2, 0.3, 0.4])
    logits = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).log()
    # top-k 2 keeps 0.3 and 0.4 -> [3/7, 4/7]: u = 0.42 -> token 2, u = 0.43 -> token 3
    assert sample_tokens(logits.expand(2, 4), torch.tensor([0.42, 0.43]), top_k=2).tolist() == [2, 3]
    # top-p 0.65: ascending cumulative [0.1, 0.3, 0.6, 1.0]; drop where <= 0.35 -> keeps 0.3 and 0.4 (as top-k 2)
    assert sample_tokens(logits.expand(2, 4), torch.tensor([0.42, 0.43]), top_p=0.65).tolist() == [2, 3]
    # temperature 0.5 squares the probabilities: [1, 4, 9, 16] / 30, cumulative [1, 5, 14, 30] / 30
    draws = sample_tokens(logits.expand(4, 4), torch.tensor([0.03, 0.16, 0.17, 0.47]), temperature=0.5)
    assert draws.tolist() == [0, 1, 2, 3]
    # epsilon 0.15 drops 0.1 -> [0.2, 0.3, 0.4] / 0.9, cumulative [2, 5, 9] / 9: u = 0.22 -> token 1, 0.23 -> 2
    assert sample_tokens(logits.expand(2, 4), torch.tensor([0.22, 0.23]), epsilon_cutoff=0.15).tolist() == [1, 2]
    # epsilon above every probability keeps the most likely token alone
    assert sample_tokens(logits.expand(2, 4), torch.tensor([0.01, 1.0]), epsilon_cutoff=0.5).tolist() == [3, 3]


@pytest.mark.parametrize("vocab", [10, 384, 32128, 58101])
@pytest.mark.parametrize("block_size", [3, 256])
def test_two_level_search_equals_one_float64_running_sum(vocab, block_size):
    generator = torch.Generator().manual_seed(vocab + block_size)
    logits = torch.randn(64, vocab, generator=generator) * 3
    logits[:, ::7] = -INF
    uniforms = draw_uniforms(1, 64, "cpu", generator)[0]
    cumulative = torch.softmax(logits.double(), dim=-1).cumsum(dim=-1)
    flat = torch.searchsorted(cumulative, (uniforms.double() * cumulative[:, -1]).unsqueeze(-1)).squeeze(-1)
    assert torch.equal(inverse_cdf_sample(logits, uniforms, block_size), flat)


# Settings as a rollout config passes them; the expected distribution comes from transformers' own warpers.
SETTINGS = [dict(), dict(temperature=0.7), dict(top_k=4), dict(top_p=0.8), dict(temperature=1.3, top_k=6, top_p=0.9),
            dict(epsilon_cutoff=0.06), dict(temperature=1.3, top_p=0.95, epsilon_cutoff=0.05)]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()) or "plain")
@pytest.mark.parametrize("block_size", [256, 3])
def test_draws_follow_the_distribution_generate_samples_from(settings, block_size):
    logits = torch.tensor([[1.2, -0.3, 0.5, 2.0, -1.0, 0.0, 0.9, -2.5, 1.5, 0.2]])
    warpers = LogitsProcessorList()
    if "temperature" in settings:
        warpers.append(TemperatureLogitsWarper(settings["temperature"]))
    if "top_k" in settings:
        warpers.append(TopKLogitsWarper(settings["top_k"]))
    if "top_p" in settings:
        warpers.append(TopPLogitsWarper(settings["top_p"]))
    if "epsilon_cutoff" in settings:
        warpers.append(EpsilonLogitsWarper(settings["epsilon_cutoff"]))
    probs = torch.softmax(warpers(torch.zeros(1, 1, dtype=torch.long), logits.clone()), dim=-1)[0].double()
    torch.testing.assert_close(torch.softmax(warp_logits(logits, **settings), dim=-1)[0].double(), probs)
    draws = 100_000
    uniforms = draw_uniforms(1, draws, "cpu", torch.Generator().manual_seed(1234))[0]
    if block_size == 256:
        tokens = sample_tokens(logits.expand(draws, -1), uniforms, **settings)
    else:
        tokens = inverse_cdf_sample(warp_logits(logits, **settings).expand(draws, -1), uniforms, block_size)
    counts = torch.bincount(tokens, minlength=logits.shape[-1]).double()
    assert counts[probs == 0].sum() == 0  # tokens the warpers remove are never drawn
    # Fixed seed, so the outcome is fixed; at the 0.1% level a correct sampler fails one setting in a thousand.
    assert chi_square_p_value(counts, probs) > 1e-3


def test_chi_square_rejects_a_wrong_distribution():
    # The test above has power: draws at temperature 1 do not pass as draws at temperature 0.9.
    logits = torch.tensor([[1.2, -0.3, 0.5, 2.0, -1.0, 0.0, 0.9, -2.5, 1.5, 0.2]])
    uniforms = draw_uniforms(1, 100_000, "cpu", torch.Generator().manual_seed(1234))[0]
    counts = torch.bincount(sample_tokens(logits.expand(100_000, -1), uniforms), minlength=10).double()
    assert chi_square_p_value(counts, torch.softmax(logits[0] / 0.9, dim=-1).double()) < 1e-6


def test_uniforms_lie_in_the_half_open_unit_interval_and_move_the_rng_on():
    torch.manual_seed(3)
    uniforms = draw_uniforms(5, 7, "cpu")
    after = torch.get_rng_state()
    torch.manual_seed(3)
    assert torch.equal(uniforms, 1.0 - torch.rand(5, 7)) and torch.equal(torch.get_rng_state(), after)
    assert uniforms.shape == (5, 7) and bool((uniforms > 0).all()) and bool((uniforms <= 1).all())


def test_argmax_or_sample_draws_on_the_sampled_rows_only():
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.7], [0.5, 0.3, 0.2], [0.2, 0.2, 0.6]]))
    sampled = torch.tensor([1, 2])  # rows 1 and 2 sample, row 0 takes the argmax
    # row 1 at u = 0.6 falls in the second token's CDF interval (0.5, 0.8]; row 2 at u = 0.1 in the first [0, 0.2]
    chosen = argmax_or_sample(logits, sampled, torch.tensor([0.6, 0.1]))
    assert chosen.tolist() == [2, 1, 0]
    assert argmax_or_sample(logits, torch.zeros(0, dtype=torch.long), torch.empty(0)).tolist() == [2, 0, 2]
    every = argmax_or_sample(logits, None, torch.tensor([0.05, 0.95, 0.5]))  # every row samples
    assert every.tolist() == [0, 2, 2]


def lowbias32(x: int) -> int:
    """The integer hash spelled out on Python ints (arbitrary precision, reduced mod 2**32 after each product)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) % 2**32
    x ^= x >> 15
    x = (x * 0x846CA68B) % 2**32
    return x ^ (x >> 16)


def test_mix32_is_lowbias32_without_int64_overflow():
    values = [0, 1, 2, 12345, 2**31 - 1, 2**31, 2**32 - 1]
    assert mix32(torch.tensor(values)).tolist() == [lowbias32(v) for v in values]
    assert lowbias32(1) == 0x688990C0 and lowbias32(0) == 0


def test_keys_fold_their_parts_and_rows_of_a_stream_are_numbered_alike_whatever_the_split():
    assert stream_key(7, 1, 42) == lowbias32(lowbias32(lowbias32(7) ^ 1) ^ 42)
    stream = stream_key(7, 1, 42)
    keys = row_keys(stream, 0, 10)
    assert keys.tolist() == [lowbias32(stream ^ row) for row in range(10)]
    assert torch.equal(row_keys(stream, 4, 3), keys[4:7])
    assert len(set(keys.tolist())) == 10


def test_keyed_uniforms_depend_on_the_row_key_and_step_only():
    keys = row_keys(stream_key(0, 0, 0), 0, 6)
    u = keyed_uniforms(keys, 5)
    k, t = int(keys[2]), 3  # step 3 hashes t + 1 = 4
    assert u[t, 2].item() == (lowbias32(lowbias32(k ^ lowbias32(4))) + 1) / 2**32
    assert torch.equal(keyed_uniforms(keys[[4, 2]], 5), u[:, [4, 2]])  # other rows of the decode change nothing
    assert torch.equal(keyed_uniforms(keys, 8)[:5], u)  # nor does the length limit
    assert u.dtype == torch.float64 and 0 < u.min() and u.max() <= 1


def test_keyed_uniforms_are_uniform_and_uncorrelated_across_steps():
    u = keyed_uniforms(row_keys(stream_key(3), 0, 4000), 6)
    counts = torch.histc(u.flatten(), bins=20, min=0, max=1)
    assert chi_square_p_value(counts, torch.full((20,), 1 / 20)) > 1e-3
    for t in range(5):
        assert abs(torch.corrcoef(u[t:t + 2])[0, 1].item()) < 0.05


def test_rollout_uniforms_take_keys_or_the_global_rng():
    torch.manual_seed(0)
    drawn = rollout_uniforms(4, 3, "cpu")
    torch.manual_seed(0)
    assert torch.equal(drawn, draw_uniforms(4, 3, "cpu"))
    keys = row_keys(5, 0, 3)
    assert torch.equal(rollout_uniforms(4, 3, "cpu", keys), keyed_uniforms(keys, 4))
    with pytest.raises(ValueError, match="3 sample rows need 3 keys"):
        rollout_uniforms(4, 3, "cpu", keys[:2])
