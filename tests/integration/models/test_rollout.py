"""Rollouts on tiny T5, BART and Marian models: masks, greedy rows, log-probs with grad (decoding details in
test_decoding.py)."""

import pytest
import torch

from helpers import byt5_tokenizer, tiny_model
from hf_seqrl import losses
from hf_seqrl.functional.logprobs import token_logprobs_from_logits
from hf_seqrl.models.tokens import completion_mask, decoder_start_id, pad_id, shift_right
from hf_seqrl.models import family_for
from hf_seqrl.models.seq2seq import rollout_generation_config

ARCHS = ["t5", "bart", "marian"]


def test_completion_mask_counts_eos_not_after():
    ids = torch.tensor([[5, 6, 1, 0, 0], [1, 0, 0, 0, 0], [5, 5, 5, 5, 5], [5, 1, 7, 1, 0]])
    expected = [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert completion_mask(ids, [1]).int().tolist() == expected
    # several EOS ids
    assert completion_mask(torch.tensor([[5, 9, 1]]), [1, 9]).int().tolist() == [[1, 1, 0]]


def test_shift_right():
    labels = torch.tensor([[5, 6, 1, -100]])
    assert shift_right(labels, 0, 0).tolist() == [[0, 5, 6, 1]]


def batch(tokenizer):
    enc = tokenizer(["hello", "abc", "a longer source"], return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


@pytest.mark.parametrize("arch", ARCHS)
def test_sampled_rollout_shapes_masks_and_greedy_rows(arch):
    tok = byt5_tokenizer()
    model = tiny_model(arch)
    ids, attn = batch(tok)
    config = rollout_generation_config(model, max_new_tokens=7)
    torch.manual_seed(0)
    ro = family_for(model).sample(model, {"input_ids": ids, "attention_mask": attn}, config, 3, True)
    assert ro.sample_ids.shape[0] == 9 and ro.greedy_ids.shape[0] == 3
    assert ro.sample_ids.shape[1] <= 7
    # tokens after EOS are pad and never count; the EOS itself does
    for row, mask in zip(ro.sample_ids, ro.sample_mask):
        eos = (row == 1).nonzero()
        if len(eos):
            first = eos[0, 0].item()
            assert mask[: first + 1].all() and not mask[first + 1:].any()
            assert (row[first + 1:] == pad_id(model)).all()
        else:
            assert mask.all()
    # greedy rows decoded inside the sampling call equal a separate greedy generate
    greedy = model.generate(input_ids=ids, attention_mask=attn, do_sample=False, num_beams=1, max_new_tokens=7)[:, 1:]
    length = min(greedy.shape[1], ro.greedy_ids.shape[1])
    g = greedy[:, :length].masked_fill(~completion_mask(greedy, [1])[:, :length], pad_id(model))
    assert torch.equal(ro.greedy_ids[:, :length], g)


def test_rollout_config_drops_decoding_heuristics():
    model = tiny_model("bart")
    model.generation_config.num_beams = 4
    model.generation_config.no_repeat_ngram_size = 3
    model.generation_config.repetition_penalty = 1.5
    config = rollout_generation_config(model, max_new_tokens=5, temperature=0.7, top_k=3, top_p=0.9)
    assert config.num_beams == 1 and config.do_sample
    assert not config.no_repeat_ngram_size and config.repetition_penalty in (None, 1.0)
    assert (config.temperature, config.top_k, config.top_p) == (0.7, 3, 0.9)


def naive_token_logprobs(model, ids, attn, sample_ids, n, temperature=1.0):
    """Reference: encoder re-run for every sample row (no expansion hook)."""
    start, pad = decoder_start_id(model), pad_id(model)
    out = model(input_ids=ids.repeat_interleave(n, 0), attention_mask=attn.repeat_interleave(n, 0),
                decoder_input_ids=shift_right(sample_ids, start, pad), use_cache=False)
    return token_logprobs_from_logits(out.logits, sample_ids, temperature), out.logits


@pytest.mark.parametrize("arch", ARCHS)
def test_scoring_pass_matches_per_sample_encoding_and_gradients(arch):
    tok = byt5_tokenizer()
    model = tiny_model(arch)
    ids, attn = batch(tok)
    torch.manual_seed(1)
    ro = family_for(model).sample(model, {"input_ids": ids, "attention_mask": attn},
                                  rollout_generation_config(model, max_new_tokens=6), 2, False)
    adv = torch.tensor([0.5, -1.0, 0.2, 0.3, -0.4, 1.0])

    def grads(logprobs):
        model.zero_grad()
        losses.policy_gradient_loss(logprobs, ro.sample_mask, adv, length_normalize=True).backward()
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    scored = family_for(model).score(model, {"input_ids": ids, "attention_mask": attn}, ro.sample_ids, 2, None, 0.8)
    fast = grads(scored.token_logprobs)
    ref_lp, _ = naive_token_logprobs(model, ids, attn, ro.sample_ids, 2, temperature=0.8)
    torch.testing.assert_close(scored.token_logprobs, ref_lp, atol=1e-5, rtol=1e-5)
    slow = grads(ref_lp)
    assert fast.keys() == slow.keys() and any("encoder" in k or "shared" in k for k in fast)
    for key in fast:
        torch.testing.assert_close(fast[key], slow[key], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_gold_rows_give_the_model_cross_entropy(arch):
    tok = byt5_tokenizer()
    model = tiny_model(arch)
    ids, attn = batch(tok)
    labels = tok(text_target=["olleh", "cba", "ecruos regnol a"], return_tensors="pt", padding=True)["input_ids"]
    labels = labels.masked_fill(labels == 0, -100)
    ro = family_for(model).sample(model, {"input_ids": ids, "attention_mask": attn},
                                  rollout_generation_config(model, max_new_tokens=4), 2, False)
    scored = family_for(model).score(model, {"input_ids": ids, "attention_mask": attn}, ro.sample_ids, 2, labels, 0.7)
    expected = model(input_ids=ids, attention_mask=attn, labels=labels).loss
    torch.testing.assert_close(losses.cross_entropy_from_logprobs(scored.gold_logprobs, labels), expected, atol=1e-5, rtol=1e-5)
    # The gold log-probs of the same pass are at temperature 1 while the samples' are at 0.7.
    from_logprobs = losses.cross_entropy_from_logprobs(scored.gold_logprobs, labels)
    torch.testing.assert_close(from_logprobs, expected, atol=1e-5, rtol=1e-5)
    ref_lp, _ = naive_token_logprobs(model, ids, attn, ro.sample_ids, 2, temperature=0.7)
    torch.testing.assert_close(scored.token_logprobs, ref_lp, atol=1e-5, rtol=1e-5)
    # The same gradient as the model's own loss.
    (g_pass,) = torch.autograd.grad(from_logprobs, model.lm_head.weight if arch != "t5" else model.shared.weight)
    expected = model(input_ids=ids, attention_mask=attn, labels=labels).loss
    (g_model,) = torch.autograd.grad(expected, model.lm_head.weight if arch != "t5" else model.shared.weight)
    torch.testing.assert_close(g_pass, g_model, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_decoding_uses_the_kv_cache_when_the_model_config_says_not_to(arch):
    # `Trainer.__init__` sets `model.config.use_cache = False`; a model built from that config gets
    # `generation_config.use_cache = False`, and `generate` would re-run the decoder over the whole prefix at every
    # step (several times slower). Rollouts and evaluation decode one new position per step all the same.
    from hf_seqrl.evaluation import generate_texts

    tok = byt5_tokenizer()
    trained = tiny_model(arch)
    trained.config.use_cache = False  # what Trainer leaves in the config
    model = type(trained)(trained.config).eval()
    for key in ("decoder_start_token_id", "pad_token_id", "eos_token_id"):
        setattr(model.generation_config, key, getattr(model.config, key))
    model.generation_config.bad_words_ids = None
    model.generation_config.min_new_tokens = 4  # several decoder steps in `generate_texts` (greedy)
    assert model.generation_config.use_cache is False
    widths = []

    def record(module, args, kwargs):
        ids = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]
        widths.append(ids.shape[1])

    hook = model.get_decoder().register_forward_pre_hook(record, with_kwargs=True)
    ids, attn = batch(tok)
    decodes = {
        "family.sample": lambda: family_for(model).sample(model, {"input_ids": ids, "attention_mask": attn},
                                                           rollout_generation_config(model, max_new_tokens=6), 2, True),
        "generate_texts": lambda: generate_texts(model, tok, ["abc", "de"], max_new_tokens=6, progress=False),
    }
    for name, decode in decodes.items():
        widths.clear()
        decode()
        assert len(widths) > 1 and set(widths[1:]) == {1}, (name, widths)
    hook.remove()


def test_rollout_split_cuts_each_part_to_its_own_longest_row():
    from hf_seqrl.types import Rollout

    # 3 sources x 2 samples; source 0's rows end after 1 and 2 tokens, source 1's after 4, source 2's after 2;
    # source 0's greedy row runs 3 tokens, so part 0 keeps 3 columns, part 1 (sources 1 and 2) keeps 4.
    lengths = [1, 2, 4, 1, 2, 2]
    mask = torch.tensor([[t < n for t in range(5)] for n in lengths])
    ids = torch.arange(30).view(6, 5).masked_fill(~mask, 0)
    greedy_mask = torch.tensor([[t < n for t in range(5)] for n in (3, 1, 1)])
    greedy_ids = torch.arange(15).view(3, 5).masked_fill(~greedy_mask, 0)
    sample_cut, greedy_cut = torch.tensor([0, 0, 1, 0, 1, 0]).bool(), torch.tensor([1, 0, 0]).bool()
    first, second = Rollout(ids, mask, greedy_ids, greedy_mask, 2, sample_cut, greedy_cut).split([1, 2])
    assert first.sample_ids.tolist() == [[0, 0, 0], [5, 6, 0]] and first.greedy_ids.tolist() == [[0, 1, 2]]
    assert first.sample_cut.tolist() == [False, False] and second.sample_cut.tolist() == [True, False, True, False]
    assert first.greedy_cut.tolist() == [True] and second.greedy_cut.tolist() == [False, False]
    assert second.sample_ids.shape == (4, 4) and torch.equal(second.sample_ids, ids[2:, :4])
    assert torch.equal(second.greedy_mask, greedy_mask[1:, :4]) and second.num_samples == 2
    with pytest.raises(ValueError, match="the parts hold 2 sources, the rollout 3"):
        Rollout(ids, mask, None, None, 2, sample_cut).split([1, 1])
