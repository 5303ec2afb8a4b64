"""The model's own token bans in rollouts: `bad_words_ids` (single tokens), `suppress_tokens` and
`begin_suppress_tokens` of its generation config mask the logits of the samples, of the greedy row and of the scoring
pass alike, on tiny Marian, T5, BART and Llama models."""

import pytest
import torch
from transformers import DataCollatorForSeq2Seq, GenerationConfig

from helpers import (byt5_tokenizer, chi_square_p_value, make_config, prompt_completion_dataset, tiny_causal_model,
                     tiny_model, toy_dataset, toy_pairs)
from hf_seqrl import SCSTTrainer, SeqRLConfig
from hf_seqrl.functional import lm_head
from hf_seqrl.models import CausalFamily, Seq2SeqFamily, heads
from hf_seqrl.models.bans import TokenBans
from hf_seqrl.models.base import DecodeSettings
from hf_seqrl.models.tokens import completion_mask, shift_right
from hf_seqrl.models.causal import completion_forward, completion_labels, generate_completions

PAD, EOS = 0, 1
SUPPRESSED, BEGIN = 5, 6  # suppress_tokens=[5] everywhere, begin_suppress_tokens=[6] at the first target position


def sources(n=3):
    enc = byt5_tokenizer()(["hello", "abc", "a longer source"][:n], return_tensors="pt", padding=True)
    return enc


def marian_preferring_pad():
    """Returns a tiny Marian whose pad logit (also its decoder start token) beats every other by far."""
    model = tiny_model("marian").eval()
    with torch.no_grad():
        model.final_logits_bias[0, PAD] = 30.0
    return model


def add_logit_bias(model, bias: dict[int, float]):
    """Adds `bias` to the model's output logits (its LM head becomes a Linear with that bias: the decode and the
    scoring pass see it)."""
    head = model.get_output_embeddings()
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    biased.weight = head.weight
    with torch.no_grad():
        biased.bias.zero_()
        for token, value in bias.items():
            biased.bias[token] = value
    model.set_output_embeddings(biased)
    return model


def explicit_logprobs(logits, token_ids, banned_at, temperature=1.0):
    """Reference: `log_softmax` over the allowed entries only (the banned columns removed) at `token_ids`.

    `banned_at(t)` lists the ids banned at target position t; entries at banned tokens are NaN."""
    columns = []
    for t in range(token_ids.shape[-1]):
        allowed = torch.ones(logits.shape[-1], dtype=torch.bool)
        allowed[banned_at(t)] = False
        index = (allowed.long().cumsum(0) - 1).clamp(min=0)  # a token's column among the allowed ones
        logp = (logits[..., t, allowed] / temperature).log_softmax(-1)
        ids = token_ids[..., t].clamp(min=0)
        value = logp.gather(-1, index[ids].unsqueeze(-1)).squeeze(-1)
        columns.append(torch.where(allowed[ids], value, torch.full_like(value, float("nan"))))
    return torch.stack(columns, dim=-1)


# ---- bad_words_ids: Marian's banned pad ----------------------------------------------------------------------------

def test_banned_pad_is_never_sampled_nor_written_by_the_greedy_row():
    model, family = marian_preferring_pad(), Seq2SeqFamily()
    batch = {k: v[:1] for k, v in sources().items()}
    # Without the ban, the samples write pad nearly always.
    torch.manual_seed(0)
    unbanned = family.sample(model, batch, family.generation_config(model, 1), num_samples=1000)
    assert (unbanned.sample_ids[:, 0] == PAD).float().mean() > 0.99
    model.generation_config.bad_words_ids = [[PAD]]
    config = family.generation_config(model, 2)
    assert config.bad_words_ids == [[PAD]]
    torch.manual_seed(0)
    rollout = family.sample(model, batch, config, num_samples=10_000, with_greedy=True)
    counted = rollout.sample_ids[rollout.sample_mask]
    assert counted.numel() >= 10_000 and not (counted == PAD).any()
    assert not (rollout.greedy_ids[rollout.greedy_mask] == PAD).any()
    # The greedy row is greedy `generate`'s, which applies the ban itself.
    greedy = model.generate(**batch, do_sample=False, num_beams=1, max_new_tokens=2)[:, 1:]
    assert torch.equal(rollout.greedy_ids, greedy.masked_fill(~completion_mask(greedy, [EOS]), PAD))
    # The first tokens follow the softmax over the other tokens (renormalized).
    with torch.no_grad():
        logits = model(**batch, decoder_input_ids=torch.tensor([[PAD]])).logits[0, 0]
    probs = logits.masked_fill(torch.arange(logits.shape[0]) == PAD, float("-inf")).softmax(-1)
    counts = torch.bincount(rollout.sample_ids[:, 0], minlength=logits.shape[0]).double()
    assert chi_square_p_value(counts, probs.double()) > 1e-3


def test_scoring_pass_uses_the_distribution_sampled_from_with_its_gradients():
    model, family = marian_preferring_pad(), Seq2SeqFamily()
    model.generation_config.bad_words_ids = [[PAD]]
    batch, n, temperature = sources(), 3, 0.7
    torch.manual_seed(0)
    rollout = family.sample(model, batch, family.generation_config(model, 6, temperature=temperature), n)
    labels = byt5_tokenizer()(text_target=["olleh", "cba", "ecruos regnol a"], return_tensors="pt",
                              padding=True)["input_ids"]
    labels = labels.masked_fill(labels == PAD, -100)
    scored = family.score(model, batch, rollout.sample_ids, n, gold_labels=labels, temperature=temperature)
    assert torch.isfinite(scored.token_logprobs).all() and torch.isfinite(scored.gold_logprobs).all()
    # The same logits from a plain forward: one row per sample (the encoder re-run), then the gold rows.
    out = model(input_ids=batch["input_ids"].repeat_interleave(n, 0),
                attention_mask=batch["attention_mask"].repeat_interleave(n, 0),
                decoder_input_ids=shift_right(rollout.sample_ids, PAD, PAD))
    gold_out = model(**batch, decoder_input_ids=shift_right(labels, PAD, PAD))
    expected = explicit_logprobs(out.logits, rollout.sample_ids, lambda t: [PAD], temperature)
    expected_gold = explicit_logprobs(gold_out.logits, labels, lambda t: [PAD])
    mask, gold_mask = rollout.sample_mask, labels != -100
    torch.testing.assert_close(scored.token_logprobs[mask], expected[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(scored.gold_logprobs[gold_mask], expected_gold[gold_mask], atol=1e-5, rtol=1e-5)
    # Gradients equal autograd's through the explicit formula.
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(0))
    params = [p for p in model.parameters() if p.requires_grad]

    def objective(token_logprobs, gold_logprobs):
        return (token_logprobs[mask] * weights[mask]).sum() + gold_logprobs[gold_mask].sum()

    grads = torch.autograd.grad(objective(scored.token_logprobs, scored.gold_logprobs), params, allow_unused=True)
    expected_grads = torch.autograd.grad(objective(expected, expected_gold), params, allow_unused=True)
    for got, want in zip(grads, expected_grads):
        if want is None:
            assert got is None or not got.any()
        else:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    # Entropy of the same distribution, at temperature 1 (the pad's mass of e^30 removed).
    entropy = scored.entropy
    logp = out.logits[..., 1:].log_softmax(-1)
    torch.testing.assert_close(entropy, -(logp.exp() * logp).sum(-1), atol=1e-4, rtol=1e-4)


def test_chunked_and_whole_logits_scoring_agree_under_bans(monkeypatch):
    # The output layer's inputs reduced a few positions at a time, against the forward's own logits (the path of a
    # model whose output layer is not known), with a (T, V) ban mask.
    model, family = marian_preferring_pad(), Seq2SeqFamily()
    model.generation_config.bad_words_ids = [[PAD]]
    model.generation_config.begin_suppress_tokens = [BEGIN]  # a (T, V) mask
    batch, n = sources(), 2
    torch.manual_seed(0)
    rollout = family.sample(model, batch, family.generation_config(model, 5, temperature=0.8), n)
    labels = torch.tensor([[7, 8, 1, -100], [9, 1, -100, -100], [10, 11, 12, 1]])
    monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 3 * model.config.vocab_size)  # several chunks per row
    results = []
    for whole in (False, True):
        with heads.whole_logits(whole):
            scored = family.score(model, batch, rollout.sample_ids, n, gold_labels=labels, temperature=0.8)
        loss = scored.token_logprobs[rollout.sample_mask].sum() + scored.gold_logprobs[labels != -100].sum()
        results.append((scored.token_logprobs, scored.gold_logprobs, scored.entropy,
                        torch.autograd.grad(loss, model.get_output_embeddings().weight)[0]))
    for chunked, whole in zip(*results):
        torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-5)


def test_training_with_the_ban_stays_finite_and_never_samples_pad(tmp_path, monkeypatch):
    # The repro of the issue: SCST on a model whose banned pad is its favourite, with every term that reads the
    # scoring pass (token-normalized policy gradient, mixed cross-entropy, entropy, KL).
    tokenizer, model = byt5_tokenizer(), marian_preferring_pad()
    model.generation_config.bad_words_ids = [[PAD]]
    args = make_config(SeqRLConfig, tmp_path, max_steps=2, num_samples=2, rl_weight=0.7, kl_coef=0.05,
                       entropy_coef=0.01, loss_normalization="token")
    trainer = SCSTTrainer(model=model, args=args, reward_funcs="chrf", processing_class=tokenizer,
                          train_dataset=toy_dataset(tokenizer, *toy_pairs(8, alphabet="abcd", lengths=(2, 5))))
    rollouts, sample = [], trainer.family.sample
    monkeypatch.setattr(trainer.family, "sample", lambda *a, **k: rollouts.append(sample(*a, **k)) or rollouts[-1])
    trainer.train()
    assert rollouts and not any((r.sample_ids[r.sample_mask] == PAD).any() for r in rollouts)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    for name in ("loss", "rl/pg_loss", "rl/xe_loss", "rl/entropy", "rl/kl"):
        assert all(torch.isfinite(torch.tensor(h[name])) for h in logs), name


# ---- suppress_tokens and begin_suppress_tokens ---------------------------------------------------------------------

def collate(tokenizer, dataset):
    rows = [{k: dataset[i][k] for k in ("input_ids", "attention_mask", "labels")} for i in range(len(dataset))]
    return DataCollatorForSeq2Seq(tokenizer)(rows)


def suppressing_model(arch):
    """Returns `(model, family, batch, position of the begin ban)`: the suppressed token the model's favourite (+20),
    the begin-suppressed one its next (+10), EOS unlikely (-10)."""
    if arch == "llama":
        model, family = tiny_causal_model("llama", seed=1).eval(), CausalFamily()
        tokenizer = byt5_tokenizer()
        batch = collate(tokenizer, prompt_completion_dataset(tokenizer, n=3, seed=2))
    else:
        model, family, batch = tiny_model(arch.split("-")[0]).eval(), Seq2SeqFamily(), sources()
    begin = 0
    if arch == "bart-forced-bos":  # a forced first token moves the begin ban to position 1, as in `generate`
        model.generation_config.forced_bos_token_id = 2
        begin = 1
    add_logit_bias(model, {SUPPRESSED: 20.0, BEGIN: 10.0, EOS: -10.0})  # no row ends before the begin position
    return model, family, batch, begin


def greedy_reference(model, family, batch, max_new_tokens):
    """Returns greedy `generate`'s target tokens (it applies the processors itself), pad after EOS."""
    if isinstance(family, CausalFamily):
        prompt_ids, prompt_mask = family.prompts(model, batch)
        ids, _ = generate_completions(model, prompt_ids, prompt_mask, do_sample=False, max_new_tokens=max_new_tokens)
        return ids
    out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], do_sample=False,
                         num_beams=1, max_new_tokens=max_new_tokens)[:, 1:]
    return out.masked_fill(~completion_mask(out, [EOS]), PAD)


@pytest.mark.parametrize("arch", ["t5", "bart", "bart-forced-bos", "llama"])
def test_suppress_and_begin_suppress_tokens_in_samples_greedy_rows_and_scores(arch):
    model, family, batch, begin = suppressing_model(arch)
    assert (greedy_reference(model, family, batch, 3)[:, begin] == SUPPRESSED).all()  # unbanned: its favourite
    model.generation_config.suppress_tokens = [SUPPRESSED]
    model.generation_config.begin_suppress_tokens = [BEGIN]
    n, steps = 200, 4
    torch.manual_seed(0)
    rollout = family.sample(model, batch, family.generation_config(model, steps), n, with_greedy=True)
    for ids, mask in ((rollout.sample_ids, rollout.sample_mask), (rollout.greedy_ids, rollout.greedy_mask)):
        assert not (ids[mask] == SUPPRESSED).any()
        assert not (ids[:, begin] == BEGIN).any()
        assert (ids[:, begin + 1][mask[:, begin + 1]] == BEGIN).float().mean() > 0.9  # allowed there: the favourite
    reference = greedy_reference(model, family, batch, steps)
    width = min(reference.shape[1], rollout.greedy_ids.shape[1])
    assert torch.equal(rollout.greedy_ids[:, :width], reference[:, :width])
    # The scoring pass: at position `begin` both tokens are out of the softmax, elsewhere the suppressed one.
    labels = batch.get("labels") if arch == "llama" else torch.tensor([[7, 8, 1], [9, 1, -100], [10, 11, 1]])
    scored = family.score(model, batch, rollout.sample_ids, n, gold_labels=labels)

    def banned_at(t):
        return [SUPPRESSED, BEGIN] if t == begin else [SUPPRESSED]

    if arch == "llama":
        prompt_ids, prompt_mask = family.prompts(model, batch)
        logits = completion_forward(model, prompt_ids, prompt_mask, rollout.sample_ids, group=n).logits
        gold = completion_labels(labels)
        gold_logits = completion_forward(model, prompt_ids, prompt_mask, gold.clamp(min=0)).logits
        expected_gold, gold_mask = explicit_logprobs(gold_logits, gold, banned_at), gold != -100
        got_gold = scored.gold_logprobs[labels != -100]  # aligned with the labels
    else:
        batch_rows = {k: v.repeat_interleave(n, 0) for k, v in batch.items()}
        start = model.generation_config.decoder_start_token_id
        logits = model(**batch_rows, decoder_input_ids=shift_right(rollout.sample_ids, start, PAD)).logits
        gold_logits = model(**batch, decoder_input_ids=shift_right(labels, start, PAD)).logits
        expected_gold, gold_mask = explicit_logprobs(gold_logits, labels, banned_at), labels != -100
        got_gold = scored.gold_logprobs[gold_mask]
    expected = explicit_logprobs(logits, rollout.sample_ids, banned_at)
    mask = rollout.sample_mask
    torch.testing.assert_close(scored.token_logprobs[mask], expected[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_gold, expected_gold[gold_mask], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(scored.token_logprobs).all()


def test_a_forced_prefix_covers_the_begin_position():
    # The begin ban is on the first target position; a forced prefix (MIXER's gold prefix) fills it, so that the
    # continuation is free of it, in the decode as in the scoring pass.
    model, family, batch, _ = suppressing_model("t5")
    model.generation_config.begin_suppress_tokens = [SUPPRESSED]
    prefix = torch.tensor([[7], [8], [9]])
    rollout = family.sample_from_prefix(model, batch, prefix, family.generation_config(model, 2), 2, True)
    assert (rollout.greedy_ids[:, 1] == SUPPRESSED).all()
    direct = family.sample(model, batch, family.generation_config(model, 2), num_samples=2, with_greedy=True)
    assert not (direct.greedy_ids[:, 0] == SUPPRESSED).any()


# ---- what cannot be a mask -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["seq2seq", "causal"])
def test_multi_token_bad_words_are_refused_with_the_fix(family):
    model, family = (tiny_model("marian"), Seq2SeqFamily()) if family == "seq2seq" else (tiny_causal_model(),
                                                                                          CausalFamily())
    model.generation_config.bad_words_ids = [[PAD], [5, 6]]
    with pytest.raises(ValueError, match=r"generation_config\.bad_words_ids holds the entry \[5, 6\].*"
                                         r"model\.generation_config\.bad_words_ids to single-token lists"):
        family.generation_config(model, 4)
    config = GenerationConfig(do_sample=True, pad_token_id=PAD, eos_token_id=EOS, bad_words_ids=[[5, 6]])
    with pytest.raises(ValueError, match=r"bad_words_ids holds the entry \[5, 6\]"):
        DecodeSettings.from_generation_config(config)


def test_token_bans_read_as_generate_reads_them():
    config = GenerationConfig(eos_token_id=EOS, bad_words_ids=[[EOS], [9], [PAD]], suppress_tokens=[4, 9],
                              begin_suppress_tokens=[3], forced_bos_token_id=None)
    bans = TokenBans.from_generation_config(config)
    # an EOS-only entry is dropped, as `generate` drops it
    assert (bans.ids, bans.begin_ids, bans.begin) == ((PAD, 4, 9), (3,), 0)
    assert bans.mask(3, 12, "cpu")[:, [PAD, 3, 4, 9]].tolist() == [[True, True, True, True],
                                                                   [True, False, True, True]] + [[True, False, True,
                                                                                                  True]]
    assert bans.after_prefix(1).mask(3, 12, "cpu").shape == (12,)  # the begin position lies in the prefix
    assert TokenBans().mask(3, 12, "cpu") is None
