"""The scoring pass reduces the output layer's inputs chunk by chunk (`models.heads`, `functional.lm_head`): per
family its values and gradients equal the whole-logits formula in float64 (T5's tied rescale, Marian's
`final_logits_bias`, Llama, Gemma 2's soft cap), with bans, the rollout temperature, gold rows, a KL reference and
label smoothing's terms; no tensor of every position's logits is made; an unknown head falls back with one warning."""

import logging

import pytest
import torch
import torch.nn.functional as F
from transformers import Gemma2Config, Gemma2ForCausalLM

from helpers import byt5_tokenizer, prompt_completion_dataset, tiny_causal_model, tiny_model
from transformers import DataCollatorForSeq2Seq
from hf_seqrl.functional import lm_head
from hf_seqrl.models import heads
from hf_seqrl.models.auto import family_for
from hf_seqrl.models.base import ScoreOptions

BANNED = 5


def gemma2():
    config = Gemma2Config(vocab_size=384, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, final_logit_softcapping=2.0,
                          pad_token_id=0, eos_token_id=1, bos_token_id=2, attn_implementation="eager")
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(config)
    for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
        setattr(model.generation_config, key, getattr(config, key))
    return model


def build(arch):
    if arch == "gemma2":
        model = gemma2()
    elif arch == "llama":
        model = tiny_causal_model("llama", seed=0)
    else:
        model = tiny_model(arch, seed=0)
    if arch == "marian":
        with torch.no_grad():
            model.final_logits_bias.normal_()  # zeros as built: a bias the pass must add
    model.generation_config.bad_words_ids = [[BANNED]]
    return model.double().eval()


def collate_rows(sources, targets):
    """Returns a seq2seq batch: the sources, and their targets as labels (-100 at padding)."""
    tokenizer = byt5_tokenizer()
    batch = dict(tokenizer(sources, return_tensors="pt", padding=True))
    labels = tokenizer(text_target=targets, return_tensors="pt", padding=True)["input_ids"]
    return {**batch, "labels": labels.masked_fill(labels == tokenizer.pad_token_id, -100)}


def batch_of(model, arch):
    if arch in ("llama", "gemma2"):
        tokenizer = byt5_tokenizer()
        data = prompt_completion_dataset(tokenizer, n=2, seed=3, lengths=(3, 3))  # no padding: Gemma 2's eager
        # attention gives NaN gradients on a fully masked (left-padded) row, whatever scores its logits
        rows = [{k: data[i][k] for k in ("input_ids", "attention_mask", "labels")} for i in range(2)]
        return DataCollatorForSeq2Seq(tokenizer)(rows)
    return collate_rows(["abc", "de"], ["fgh", "i"])


def whole_logits(model, family, batch, rows, group):
    """The forward's own logits of `rows` `(B*group, T)` (what the pass scored before it was chunked)."""
    with heads_unknown():
        encoded = family.encode(model, batch, in_forward=True)
        return family.target_forward(model, encoded, rows, group).logits


class heads_unknown:
    def __enter__(self):
        self.saved, heads.KNOWN_HEADS = heads.KNOWN_HEADS, {}

    def __exit__(self, *exc):
        heads.KNOWN_HEADS = self.saved


@pytest.mark.parametrize("arch", ["t5", "marian", "llama", "gemma2"])
def test_chunked_pass_equals_the_whole_logits_formula(monkeypatch, arch):
    model = build(arch)
    family = family_for(model)
    assert heads.knows_head(model)
    batch, n, temperature = batch_of(model, arch), 2, 0.7
    generator = torch.Generator().manual_seed(1)
    sample_ids = torch.randint(6, 200, (2 * n, 4), generator=generator)
    sample_ids[0, 2:] = 1
    gold = batch["labels"]
    reference = build(arch)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
        ref_positions = family.reference_positions(reference, batch, sample_ids, n)
    monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 3 * model.config.vocab_size)  # 3 positions a chunk
    scored = family.score(model, batch, sample_ids, n, gold, temperature,
                          ScoreOptions(ref_positions, entropy_grad=True, plain=True, raw=True))

    logits = whole_logits(model, family, batch, sample_ids, n)
    ref_logits = whole_logits(reference, family, batch, sample_ids, n).detach()
    low = torch.finfo(logits.dtype).min
    banned = torch.zeros(logits.shape[-1], dtype=torch.bool)
    banned[BANNED] = True
    logp = F.log_softmax(logits.masked_fill(banned, low), -1)
    scaled = F.log_softmax((logits / temperature).masked_fill(banned, low), -1)
    logq = F.log_softmax(ref_logits.masked_fill(banned, low), -1)
    pick = lambda x, ids: x.gather(-1, ids.clamp(min=0)[..., None])[..., 0]  # noqa: E731
    gold_rows = family.target_labels({"labels": gold})
    gold_logits = whole_logits(model, family, batch, gold_rows, 1)
    gold_logp = F.log_softmax(gold_logits.masked_fill(banned, low), -1)
    raw = F.log_softmax(gold_logits, -1)
    expected = {
        "token_logprobs": pick(scaled, sample_ids), "plain_logprobs": pick(logp, sample_ids),
        "entropy": -(logp.exp() * logp.masked_fill(banned, 0)).sum(-1),
        "kl": (logp.exp() * (logp - logq).masked_fill(banned, 0)).sum(-1),
        "gold_logprobs": pick(gold_logp, gold_rows), "raw_logprobs": pick(raw, gold_rows),
        "raw_logprob_sums": raw.sum(-1)}
    counted = gold_rows != -100
    if family.name == "causal":  # the family places the gold values where the labels hold the completion
        counted = gold != -100
        for name in ("gold_logprobs", "raw_logprobs", "raw_logprob_sums"):
            placed = torch.zeros(gold.shape, dtype=torch.float64)
            placed[counted] = expected[name][gold_rows != -100]
            expected[name] = placed
    weights = {name: torch.randn(value.shape, dtype=torch.float64, generator=generator)
               for name, value in expected.items()}
    objective, reference_objective = 0.0, 0.0
    for name, want in expected.items():
        got = getattr(scored, name)
        where = counted if name.startswith(("gold", "raw")) else torch.ones_like(got, dtype=torch.bool)
        torch.testing.assert_close(got[where], want[where], rtol=1e-5, atol=1e-6, msg=name)
        objective = objective + (got * weights[name])[where].sum()
        reference_objective = reference_objective + (want * weights[name])[where].sum()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(objective, params, allow_unused=True)
    for got, want in zip(grads, torch.autograd.grad(reference_objective, params, allow_unused=True)):
        if want is None:
            assert got is None or not got.any()
        else:  # T5's attention softmax runs in float32 whatever the weights: rows batched otherwise round otherwise
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_no_tensor_of_every_positions_logits_is_made(monkeypatch):
    # a 4096-token vocabulary, 2 sources x (2 samples + gold) x 8 positions: their logits would be 196,608 floats
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        size = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for value in out if isinstance(out, (tuple, list)) else (out,):
                # rows of width d_model = 32 (the output matrix, its slices, their gradients) aside
                if isinstance(value, torch.Tensor) and value.dim() and 32 not in value.shape[-1:] + value.shape[:1]:
                    self.size = max(self.size, value.numel())
            return out

    monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 8 * 4096)  # a chunk of 8 positions' worth of logits
    model = tiny_model("t5", seed=0)
    model.resize_token_embeddings(4096)
    family = family_for(model)
    batch = collate_rows(["abcdefg", "hij"], ["klmnopq", "rs"])
    sample_ids = torch.randint(3, 4096, (4, 6))  # 24 sample positions and 16 gold ones (no 32, the model width)
    with Largest() as largest:
        scored = family.score(model, batch, sample_ids, 2, batch["labels"], 0.9)
        (scored.token_logprobs.sum() + scored.gold_logprobs.sum()).backward()
    every = 2 * 3 * 8 * 4096
    assert largest.size <= every // 4, largest.size
    assert model.get_output_embeddings().weight.grad.abs().sum() > 0


def test_an_unknown_head_takes_the_logits_with_one_warning(caplog, monkeypatch):
    model = tiny_model("t5", seed=0)
    monkeypatch.setattr(heads, "KNOWN_HEADS", {})
    monkeypatch.setattr(heads, "_warned", set())
    family = family_for(model)
    batch = collate_rows(["abc"], ["de"])
    with caplog.at_level(logging.WARNING, logger="hf_seqrl.models.heads"):
        for _ in range(2):
            scored = family.score(model, batch, torch.tensor([[7, 8, 1]]), 1)
    warnings = [r.getMessage() for r in caplog.records if "output layer" in r.getMessage()]
    assert len(warnings) == 1 and "T5ForConditionalGeneration" in warnings[0] and "KNOWN_HEADS" in warnings[0]
    assert torch.isfinite(scored.token_logprobs).all()
