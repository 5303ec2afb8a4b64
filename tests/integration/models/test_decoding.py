"""The rollout decode on tiny T5, BART and Marian models: greedy rows equal greedy `generate` token for token,
samples follow `generate(do_sample=True)`'s distribution, forced tokens, early exit, and the RNG it uses."""

import pytest
import torch

from helpers import byt5_tokenizer, tiny_model
from hf_seqrl.models.base import DecodeSettings
from hf_seqrl.models.tokens import completion_mask, pad_id
from hf_seqrl.models import family_for
from hf_seqrl.models.seq2seq import rollout_generation_config
from helpers import chi_square_p_value

ARCHS = ["t5", "bart", "marian"]
# Added to the EOS logit so that greedy rows end at different lengths (the tiny models' logits differ in scale).
EOS_BIAS = {"t5": 6.0, "bart": 0.0, "marian": 0.0}


def varied_model(arch: str, eos_bias: float = 0.0):
    """Returns a tiny model whose greedy outputs vary with the source (weights perturbed), plus `eos_bias` on EOS."""
    model = tiny_model(arch).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator))
    if eos_bias:
        bias = torch.zeros(model.config.vocab_size)
        bias[1] = eos_bias
        model.get_output_embeddings().register_forward_hook(lambda module, args, output: output + bias)
    return model


def sources():
    enc = byt5_tokenizer()(["hello", "abc", "a longer source", "xyz uvw", "the cat sat", "q"], return_tensors="pt",
                           padding=True)
    return enc["input_ids"], enc["attention_mask"]


def greedy_generate(model, ids, attn, max_new_tokens, **kwargs):
    out = model.generate(input_ids=ids, attention_mask=attn, do_sample=False, num_beams=1,
                         max_new_tokens=max_new_tokens, **kwargs)[:, 1:]
    return out.masked_fill(~completion_mask(out, [1]), pad_id(model))


def same_tokens(a, b, pad):
    """Returns whether two id matrices are equal once the shorter is padded with `pad` to the longer."""
    length = max(a.shape[1], b.shape[1])
    widen = [torch.nn.functional.pad(t, (0, length - t.shape[1]), value=pad) for t in (a, b)]
    return torch.equal(*widen)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_rows_equal_greedy_generate(arch):
    model = varied_model(arch, EOS_BIAS[arch])
    ids, attn = sources()
    expected = greedy_generate(model, ids, attn, 10)
    assert len(set(map(tuple, expected.tolist()))) > 2  # outputs differ between sources
    torch.manual_seed(0)
    rollout = family_for(model).sample(model, {"input_ids": ids, "attention_mask": attn},
                                       rollout_generation_config(model, max_new_tokens=10), 3, True)
    assert same_tokens(rollout.greedy_ids, expected, pad_id(model))
    assert torch.equal(rollout.greedy_mask.sum(1), completion_mask(expected, [1]).sum(1))
    # top-k 1 makes every sample the greedy decode: the sample rows run the same computation
    rollout = family_for(model).sample(model, {"input_ids": ids, "attention_mask": attn},
                                       rollout_generation_config(model, max_new_tokens=10, top_k=1), 2, False)
    assert same_tokens(rollout.sample_ids, expected.repeat_interleave(2, dim=0), pad_id(model))


def test_greedy_rows_end_at_different_lengths():
    # The rows of test_greedy_rows_equal_greedy_generate[t5] end early and late: finished rows are padded.
    model = varied_model("t5", EOS_BIAS["t5"])
    ids, attn = sources()
    out = model.generate(input_ids=ids, attention_mask=attn, do_sample=False, num_beams=1, max_new_tokens=10)
    lengths = completion_mask(out[:, 1:], [1]).sum(1)
    assert lengths.min() < 3 and lengths.max() == 10


def test_forced_bos_and_eos_tokens_as_generate_forces_them():
    model = varied_model("bart")
    model.generation_config.forced_bos_token_id = 2
    model.generation_config.forced_eos_token_id = 1
    ids, attn = sources()
    config = rollout_generation_config(model, max_new_tokens=6)
    assert (config.forced_bos_token_id, config.forced_eos_token_id) == (2, 1)
    expected = greedy_generate(model, ids, attn, 6, forced_bos_token_id=2, forced_eos_token_id=1)
    torch.manual_seed(0)
    rollout = family_for(model).sample(model, {"input_ids": ids, "attention_mask": attn}, config, 4, True)
    assert same_tokens(rollout.greedy_ids, expected, pad_id(model))
    for tokens in (rollout.greedy_ids, rollout.sample_ids):
        assert (tokens[:, 0] == 2).all()  # forced BOS first
        assert tokens.shape[1] == 6 and ((tokens == 1).sum(1) == 1).all()  # every row ends with one EOS


@pytest.mark.parametrize("sync_every", [1, 4])
def test_decoding_stops_at_the_first_look_after_every_row_has_ended(monkeypatch, sync_every):
    from hf_seqrl.models import decoding

    monkeypatch.setattr(decoding, "SYNC_EVERY", sync_every)
    model = varied_model("marian", eos_bias=1e4)  # EOS always wins
    calls = []
    model.register_forward_hook(lambda module, args, output: calls.append(1))
    ids, attn = sources()
    rollout = family_for(model).sample(model, {"input_ids": ids, "attention_mask": attn},
                                       rollout_generation_config(model, max_new_tokens=20), 3, True)
    assert rollout.sample_ids.shape[1] == 1 and (rollout.sample_ids == 1).all()  # cut after the last EOS
    # One forward (encoder + first step), then the steps until the loop next looks at the device: at step 1 when it
    # looks every step, at step 4 when every 4 (three forwards whose rows only write pad).
    assert len(calls) == sync_every


@pytest.mark.parametrize("warps", [dict(temperature=0.8, top_k=12, top_p=0.95), dict(epsilon_cutoff=0.0026)],
                         ids=["top-k-top-p", "epsilon"])
@pytest.mark.parametrize("arch", ARCHS)
def test_first_tokens_follow_the_distribution_of_sampling_generate(arch, warps):
    # The first token's distribution is enumerable: generate's processed scores at step 1, softmaxed.
    model = tiny_model(arch).eval()  # unperturbed: flat logits, so the warps leave several tokens
    ids, attn = sources()
    ids, attn = ids[:1], attn[:1]
    config = rollout_generation_config(model, max_new_tokens=1, **warps)
    scores = model.generate(input_ids=ids, attention_mask=attn, generation_config=config, output_scores=True,
                            return_dict_in_generate=True).scores[0]
    probs = torch.softmax(scores[0].double(), dim=-1)
    torch.manual_seed(7)
    draws = 20_000
    rollout = family_for(model).sample(model, {"input_ids": ids, "attention_mask": attn}, config, draws, False)
    counts = torch.bincount(rollout.sample_ids[:, 0], minlength=probs.shape[0]).double()
    assert counts[probs == 0].sum() == 0 and int((probs > 0).sum()) > 3 and bool((probs == 0).any())
    assert chi_square_p_value(counts, probs) > 1e-3  # fixed seed: a fixed outcome


def homogeneity_p_value(counts_a: torch.Tensor, counts_b: torch.Tensor) -> float:
    """Returns the p-value of the chi-square test that two count vectors come from one distribution."""
    keep = (counts_a + counts_b) > 0
    table = torch.stack([counts_a[keep], counts_b[keep]]).double()
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    statistic = ((table - expected) ** 2 / expected).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2))


@pytest.mark.parametrize("arch", ARCHS)
def test_two_token_samples_follow_the_distribution_of_sampling_generate(arch):
    # Whole sequences of two tokens (the second drawn through the KV cache), counted against as many draws of
    # generate(do_sample=True); top-k 4 keeps the number of sequences small (at most 4 * 4 + EOS endings).
    model = tiny_model(arch).eval()
    ids, attn = (t[:1] for t in sources())
    config = rollout_generation_config(model, max_new_tokens=2, temperature=1.5, top_k=4)
    draws = 20_000
    torch.manual_seed(11)
    ours = family_for(model).sample(model, {"input_ids": ids, "attention_mask": attn}, config, draws, False).sample_ids
    config.num_return_sequences = draws
    torch.manual_seed(12)
    theirs = model.generate(input_ids=ids, attention_mask=attn, generation_config=config)[:, 1:]
    vocab = model.config.vocab_size

    def counts(tokens):
        tokens = torch.nn.functional.pad(tokens, (0, 2 - tokens.shape[1]), value=pad_id(model))
        return torch.bincount(tokens[:, 0] * vocab + tokens[:, 1], minlength=vocab * vocab).double()

    ours_counts, theirs_counts = counts(ours), counts(theirs)
    assert int((ours_counts > 0).sum()) > 8  # many different sequences
    assert homogeneity_p_value(ours_counts, theirs_counts) > 1e-3  # fixed seeds: a fixed outcome


def test_rng_moves_on_by_one_uniform_per_sample_row_and_step():
    model = varied_model("t5")
    ids, attn = sources()
    config = rollout_generation_config(model, max_new_tokens=9)
    torch.manual_seed(5)
    first = family_for(model).sample(model, {"input_ids": ids, "attention_mask": attn}, config, 2, True)
    after_first = torch.get_rng_state()
    second = family_for(model).sample(model, {"input_ids": ids, "attention_mask": attn}, config, 2, True)
    assert not torch.equal(first.sample_ids, second.sample_ids)  # consecutive rollouts draw fresh noise
    torch.manual_seed(5)
    torch.rand(9, ids.shape[0] * 2)  # the documented draw: (max_new_tokens, B * num_samples)
    assert torch.equal(torch.get_rng_state(), after_first)
    torch.manual_seed(5)
    again = family_for(model).sample(model, {"input_ids": ids, "attention_mask": attn}, config, 2, True)
    assert torch.equal(again.sample_ids, first.sample_ids)  # a seed reproduces a rollout


@pytest.mark.parametrize("setting", [dict(num_beams=2), dict(repetition_penalty=1.2), dict(no_repeat_ngram_size=2)])
def test_settings_the_decode_does_not_implement_are_refused(setting):
    config = rollout_generation_config(tiny_model("t5"), max_new_tokens=4)
    config.update(**setting)
    with pytest.raises(ValueError, match=f"generation_config.{next(iter(setting))}"):
        DecodeSettings.from_generation_config(config)


def test_max_length_counts_the_start_token_as_generate_does():
    model = tiny_model("t5")
    config = rollout_generation_config(model, max_new_tokens=None, max_length=8)
    assert DecodeSettings.from_generation_config(config).max_new_tokens == 7


@pytest.mark.parametrize("arch", ARCHS)
def test_ended_rows_leave_the_forward_without_changing_any_row(arch, monkeypatch):
    # Rows end at different steps; once at most half of the rows in the forward still run, the ended ones are
    # dropped from it. Every row's tokens equal those of the decode that keeps all rows (same uniforms). The loop
    # looks at every step here (rows leave at the first look after they may), and at its default pace below.
    from hf_seqrl.models import decoding
    from hf_seqrl.models.seq2seq import decode

    monkeypatch.setattr(decoding, "SYNC_EVERY", 1)

    model = varied_model(arch)

    def eos_near_the_top(module, args, output):  # a sample row ends often, a greedy row never
        output = output.clone()
        output[..., 1] = output.max(dim=-1).values - 0.5
        return output

    model.get_output_embeddings().register_forward_hook(eos_near_the_top)
    ids, attn = sources()
    settings = DecodeSettings.from_generation_config(rollout_generation_config(model, max_new_tokens=12))
    uniforms = torch.rand((12, ids.shape[0] * 3), generator=torch.Generator().manual_seed(0))
    rows_per_step = []
    hook = model.get_decoder().register_forward_hook(
        lambda module, args, kwargs, output: rows_per_step.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    compact = decode(model, ids, attn, settings, 4, True, uniforms)
    hook.remove()
    full = decode(model, ids, attn, settings, 4, True, uniforms, compact_below=0)
    assert torch.equal(compact, full)
    lengths = completion_mask(full, list(settings.eos_ids)).sum(1)
    assert lengths.min() < lengths.max()
    assert rows_per_step[0] == ids.shape[0] and rows_per_step[1] == 4 * ids.shape[0]  # first forward: the sources
    assert min(rows_per_step[1:]) < 4 * ids.shape[0]  # ended rows left the forward
    assert all(a >= b for a, b in zip(rows_per_step[1:], rows_per_step[2:]))
    monkeypatch.setattr(decoding, "SYNC_EVERY", 4)
    rows_per_step.clear()
    hook = model.get_decoder().register_forward_hook(
        lambda module, args, kwargs, output: rows_per_step.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    assert torch.equal(decode(model, ids, attn, settings, 4, True, uniforms), full)
    hook.remove()
    # the rows in the forward change only after a look (after tokens 4 and 8): from the forwards 4 and 8 on
    changes = [i for i in range(2, len(rows_per_step)) if rows_per_step[i] != rows_per_step[i - 1]]
    assert all(i in (4, 8) for i in changes)
