"""The scoring pass reduces the output layer's inputs chunk by chunk (`models.heads`, `functional.lm_head`): per
architecture its values and gradients equal the whole-logits formula in float64 (T5's tied rescale, Marian's and
BART's `final_logits_bias`, BERT2BERT's transform head, Llama, Qwen2, GPT-2, OPT, Phi's biased head, Falcon, OLMo,
Mixtral, Gemma 2's soft cap, Cohere's scale), with bans, the rollout temperature, gold rows, a KL reference and
label smoothing's terms, and no whole-logits warning: the head is recognized by a check forward, not by its
architecture's name. No tensor of every position's logits is made; a head whose forward does something else, an
adapter on the head or a forward hook falls back to the whole logits with one warning naming why, and still scores
right."""

import logging

import pytest
import torch
import torch.nn.functional as F
import transformers
from transformers import Gemma2Config, Gemma2ForCausalLM, T5ForConditionalGeneration

from helpers import byt5_tokenizer, prompt_completion_dataset, tiny_causal_model, tiny_model
from transformers import DataCollatorForSeq2Seq
from hf_seqrl.functional import lm_head
from hf_seqrl.models import heads
from hf_seqrl.models.auto import family_for
from hf_seqrl.models.scoring import ScoreOptions

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


IDS = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2)  # ByT5's
CAUSAL = {  # tiny configs of decoder-only architectures beside Llama: (config class, model class, sizes)
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=32, n_layer=1, n_head=2, n_positions=64)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, ffn_dim=64,
                                                word_embed_proj_dim=32, max_position_embeddings=64)),
    "phi": ("PhiConfig", "PhiForCausalLM", dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                intermediate_size=64)),  # a head with a bias
    "cohere": ("CohereConfig", "CohereForCausalLM", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                         num_attention_heads=2, num_key_value_heads=1,
                                                         logit_scale=0.5)),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2)),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                   num_attention_heads=2)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                            num_attention_heads=2, num_key_value_heads=1,
                                                            num_local_experts=2,
                                                            experts_implementation="eager")),  # float64
}


def causal_model(arch):
    config_class, model_class, sizes = CAUSAL[arch]
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(vocab_size=384, **IDS, **sizes))
    for key, value in IDS.items():
        setattr(model.generation_config, key, value)
    return model


def bert2bert():
    """A BERT2BERT `EncoderDecoderModel` from tiny `BertConfig`s (ByT5's ids): its decoder's head is a transform
    (dense, activation, LayerNorm) before the output Linear."""
    from transformers import BertConfig, BertLMHeadModel, BertModel, EncoderDecoderModel

    sizes = dict(vocab_size=384, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(0)
    model = EncoderDecoderModel(encoder=BertModel(BertConfig(**sizes)), decoder=BertLMHeadModel(
        BertConfig(**sizes, is_decoder=True, add_cross_attention=True)))
    with torch.no_grad():
        model.get_output_embeddings().bias.normal_()  # zeros as built: a bias the pass must add
    for config in (model.config, model.generation_config):
        for key, value in dict(IDS, decoder_start_token_id=2).items():
            setattr(config, key, value)
    return model


def build(arch):
    if arch == "gemma2":
        model = gemma2()
    elif arch in ("llama", "qwen2"):
        model = tiny_causal_model(arch, seed=0)
    elif arch in CAUSAL:
        model = causal_model(arch)
    elif arch == "bert2bert":
        model = bert2bert()
    else:
        model = tiny_model(arch, seed=0)
    if arch in ("marian", "bart"):
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
    if arch in ("llama", "qwen2", "gemma2", *CAUSAL):
        tokenizer = byt5_tokenizer()
        data = prompt_completion_dataset(tokenizer, n=2, seed=3, lengths=(3, 3))  # no padding: Gemma 2's eager
        # attention gives NaN gradients on a fully masked (left-padded) row, whatever scores its logits
        rows = [{k: data[i][k] for k in ("input_ids", "attention_mask", "labels")} for i in range(2)]
        return DataCollatorForSeq2Seq(tokenizer)(rows)
    return collate_rows(["abc", "de"], ["fgh", "i"])


def whole_logits(model, family, batch, rows, group):
    """The forward's own logits of `rows` `(B*group, T)` (what the pass scored before it was chunked)."""
    with heads.whole_logits():
        encoded = family.encode(model, batch, in_forward=True)
        return family.target_forward(model, encoded, rows, group).logits


def head_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hf_seqrl.models.heads"]


@pytest.mark.parametrize("arch", ["t5", "marian", "bart", "bert2bert", "llama", "qwen2", "gpt2", "opt", "phi",
                                  "falcon", "olmo", "mixtral", "gemma2", "cohere"])
def test_chunked_pass_equals_the_whole_logits_formula(monkeypatch, caplog, arch):
    monkeypatch.setattr(heads, "_warned", set())
    caplog.set_level(logging.WARNING, logger="hf_seqrl.models.heads")
    model = build(arch)
    family = family_for(model)
    assert heads.knows_head(model)
    expected_head = {"marian": heads.Head("final_logits_bias"), "bart": heads.Head("final_logits_bias"),
                     "gemma2": heads.Head(softcap=2.0), "cohere": heads.Head(scale=0.5)}.get(arch, heads.Head())
    assert heads.head_of(model)[1] == expected_head
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
    monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 3 * 384)  # 3 positions a chunk of the 384 tokens
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
    assert head_warnings(caplog) == []  # the chunked pass ran: no whole-logits warning


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


class DoubledLogits(T5ForConditionalGeneration):
    """A T5 whose forward doubles the output layer's logits: a head the scoring pass cannot compute."""

    def forward(self, *args, **kwargs):
        output = super().forward(*args, **kwargs)
        output.logits = output.logits * 2
        return output


def test_a_head_that_does_something_unknown_takes_the_logits_with_one_warning(caplog, monkeypatch):
    monkeypatch.setattr(heads, "_warned", set())
    plain = tiny_model("t5", seed=0)
    model = DoubledLogits(plain.config)
    model.load_state_dict(plain.state_dict())
    model.generation_config = plain.generation_config
    family = family_for(model)
    batch = collate_rows(["abc", "de"], ["fgh", "i"])
    sample_ids = torch.tensor([[7, 8, 1], [9, 10, 11]])
    with caplog.at_level(logging.WARNING, logger="hf_seqrl.models.heads"):
        for _ in range(2):
            scored = family.score(model, batch, sample_ids, 1)
    warnings = head_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "DoubledLogits" in warnings[0] and "whole logits" in warnings[0]
    assert "changes its output Linear's logits" in warnings[0]
    logits = whole_logits(model, family, batch, sample_ids, 1)  # the doubled ones: what the model computes
    expected = F.log_softmax(logits, -1).gather(-1, sample_ids[..., None])[..., 0]
    torch.testing.assert_close(scored.token_logprobs, expected, rtol=1e-5, atol=1e-5)
    plain_scored = family.score(plain, batch, sample_ids, 1)  # the undoubled head, chunked: other values
    assert not torch.allclose(plain_scored.token_logprobs, expected, atol=1e-3)


class Rescaled(torch.nn.Linear):
    """An output Linear of another class (as an adapter on the head makes it)."""


@pytest.mark.parametrize("change", ["adapter", "hook"])
def test_an_adapter_or_a_hook_on_the_head_takes_the_logits_with_a_warning_naming_it(caplog, monkeypatch, change):
    monkeypatch.setattr(heads, "_warned", set())
    model = tiny_model("t5", seed=0)
    head = model.get_output_embeddings()
    if change == "adapter":
        replaced = Rescaled(head.in_features, head.out_features, bias=False)
        replaced.weight = head.weight
        model.set_output_embeddings(replaced)
    else:
        head.register_forward_hook(lambda module, inputs, output: None)
    with caplog.at_level(logging.WARNING, logger="hf_seqrl.models.heads"):
        assert not heads.knows_head(model)
        scored = family_for(model).score(model, collate_rows(["abc"], ["de"]), torch.tensor([[7, 8, 1]]), 1)
    warnings = head_warnings(caplog)
    assert len(warnings) == 1 and ("not a plain Linear" if change == "adapter" else "forward hooks") in warnings[0]
    assert torch.isfinite(scored.token_logprobs).all()


def test_the_check_runs_once_per_model_and_leaves_its_modes_and_random_state_alone(monkeypatch):
    model = tiny_model("t5", seed=0, dropout=0.1).train()
    model.encoder.eval()  # a submodule kept in eval mode stays there
    checks = []
    check = heads.check_head
    monkeypatch.setattr(heads, "check_head", lambda *a: checks.append(1) or check(*a))
    state = torch.get_rng_state()
    assert heads.knows_head(model)
    assert torch.equal(torch.get_rng_state(), state)  # the check drew nothing: a replayed dropout draw stays the same
    assert model.training and not model.encoder.training and model.decoder.training
    family = family_for(model)
    for _ in range(2):
        family.score(model, collate_rows(["abc"], ["de"]), torch.tensor([[7, 8, 1]]), 1)
    assert len(checks) == 1
    assert heads.knows_head(tiny_model("t5", seed=0)) and len(checks) == 2  # another instance: its own check
    with heads.whole_logits():
        assert not heads.knows_head(model)


def test_the_head_check_forward_says_so_to_counters_of_decoder_positions():
    """The check forward runs once per model, inside `checking_head()`: a counter of a run's decoder positions (the
    benchmarks' budget) leaves it out, and every other forward is outside it."""
    model = tiny_model("t5", seed=0)
    seen = []
    model.get_decoder().register_forward_pre_hook(lambda module, args: seen.append(heads.checking_head()))
    assert heads.knows_head(model) and seen == [True]
    model(input_ids=torch.tensor([[5, 6, 1]]), labels=torch.tensor([[7, 1]]))
    assert heads.knows_head(model) and seen == [True, False] and not heads.checking_head()
