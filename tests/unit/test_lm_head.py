"""`functional.lm_head`: the scoring pass's reductions made from hidden states a chunk of positions at a time, against
hand-computed values and against the whole-logits formula in float64 (values and gradients), with bans, per-position
temperatures, a bias, a scale, a soft cap and a reference."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers.trainer_pt_utils import LabelSmoother

from hf_seqrl import losses
from hf_seqrl.functional.divergences import generalized_jsd
from hf_seqrl.functional import lm_head
from hf_seqrl.functional.lm_head import position_stats
from hf_seqrl.functional.output_layer import OutputLayer, Positions


def test_hand_computed_logprob_entropy_and_kl_of_one_position():
    # hidden [1], weight [[0], [0], [ln 2]]: logits [0, 0, ln 2], p = [1/4, 1/4, 1/2]
    layer = OutputLayer(torch.tensor([[0.0], [0.0], [math.log(2)]]))
    inputs = Positions(torch.ones(1, 1), layer)
    uniform = Positions(torch.ones(1, 1), OutputLayer(torch.zeros(3, 1)))  # q = [1/3, 1/3, 1/3]
    stats = position_stats(inputs, torch.tensor([2]), reference=uniform, entropy=True, plain=True, raw=True)
    assert stats.logprobs.item() == pytest.approx(math.log(0.5))
    assert stats.entropy.item() == pytest.approx(1.5 * math.log(2))  # 2 * 1/4 * ln 4 + 1/2 * ln 2
    assert stats.kl.item() == pytest.approx(math.log(3) - 1.5 * math.log(2))  # sum p ln p - sum p ln(1/3)
    assert stats.plain_logprobs.item() == pytest.approx(math.log(0.5))
    assert stats.raw_logprob_sums.item() == pytest.approx(2 * math.log(0.25) + math.log(0.5))
    # token 1 banned: p = [1/3, 0, 2/3]; at temperature 1/2 the logits double: [0, -, 2 ln 2] -> [1/5, 0, 4/5]
    banned = torch.tensor([False, True, False])
    stats = position_stats(inputs, torch.tensor([2]), 0.5, banned, entropy=True, raw=True)
    assert stats.logprobs.item() == pytest.approx(math.log(0.8))
    assert stats.entropy.item() == pytest.approx(-(1 / 3 * math.log(1 / 3) + 2 / 3 * math.log(2 / 3)))
    assert stats.raw_logprobs.item() == pytest.approx(math.log(0.5))  # label smoothing's terms ignore the bans


def explicit(logits, ref_logits, ids, temperature, banned_at):
    """The whole-tensor formulas, `banned_at` `(P, V)` (finfo.min there: the gradients of -inf would be NaN)."""
    low = torch.finfo(logits.dtype).min
    z = logits.masked_fill(banned_at, low)
    logp = F.log_softmax(z, -1)
    scaled = F.log_softmax((logits / temperature.unsqueeze(-1)).masked_fill(banned_at, low), -1)
    p = logp.exp()
    logq = F.log_softmax(ref_logits.masked_fill(banned_at, low), -1)
    raw = F.log_softmax(logits, -1)
    where = lambda x: torch.where(banned_at, 0.0, x)  # noqa: E731 - 0 * log 0 = 0
    return {"logprobs": scaled.gather(-1, ids[:, None])[:, 0], "entropy": -where(p * logp).sum(-1),
            "kl": where(p * (logp - logq)).sum(-1), "plain_logprobs": logp.gather(-1, ids[:, None])[:, 0],
            "raw_logprobs": raw.gather(-1, ids[:, None])[:, 0], "raw_logprob_sums": raw.sum(-1)}


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_chunked_values_and_gradients_equal_the_whole_tensor_formula(monkeypatch, softcap):
    generator = torch.Generator().manual_seed(0)
    count, d, vocab = 11, 4, 13
    hidden = torch.randn(count, d, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(vocab, d, dtype=torch.float64, generator=generator, requires_grad=True)
    bias = torch.randn(vocab, dtype=torch.float64, generator=generator, requires_grad=True)
    layer = OutputLayer(weight, bias, scale=1.5, softcap=softcap)
    ref_layer = OutputLayer(weight.detach() * 0.5)
    ref_hidden = torch.randn(count, d, dtype=torch.float64, generator=generator)
    ids = torch.randint(0, vocab, (count,), generator=generator)
    temperature = torch.rand(count, dtype=torch.float64, generator=generator) + 0.5
    banned = torch.zeros(2, vocab, dtype=torch.bool)
    banned[0, 3], banned[1, [3, 5]] = True, True
    rows = torch.randint(0, 2, (count,), generator=generator)
    ids = torch.where(banned[rows, ids], 0, ids)  # no scored token is banned
    monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 3 * vocab)  # 3 positions a chunk: 4 chunks
    stats = position_stats(Positions(hidden, layer), ids, temperature, banned, rows,
                           reference=Positions(ref_hidden, ref_layer), entropy=True, entropy_grad=True, plain=True,
                           raw=True)
    expected = explicit(layer(hidden), ref_layer(ref_hidden), ids, temperature, banned[rows])
    weights = torch.randn(6, count, dtype=torch.float64, generator=generator)
    for name, want in expected.items():
        got = getattr(stats, name)
        torch.testing.assert_close(got.double(), want)
    objective = sum((getattr(stats, name).double() * w).sum() for name, w in zip(expected, weights))
    reference = sum((want * w).sum() for want, w in zip(expected.values(), weights))
    grads = torch.autograd.grad(objective, (hidden, weight, bias))
    for got, want in zip(grads, torch.autograd.grad(reference, (hidden, weight, bias))):
        torch.testing.assert_close(got, want)


def test_precomputed_logits_take_the_same_path(monkeypatch):
    monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 10)
    generator = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(7, 3, generator=generator), torch.randn(5, 3, generator=generator)
    ids = torch.randint(0, 5, (7,), generator=generator)
    from_hidden = position_stats(Positions(hidden, OutputLayer(weight)), ids, 0.7, entropy=True)
    from_logits = position_stats(Positions(logits=hidden @ weight.T), ids, 0.7, entropy=True)
    for got, want in zip(from_logits, from_hidden):
        if want is not None:
            torch.testing.assert_close(got, want)


def test_no_logits_tensor_of_every_position_is_saved_for_the_backward(monkeypatch):
    monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 4 * 1000)
    hidden = torch.randn(64, 8, requires_grad=True)
    weight = torch.randn(1000, 8, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x.numel()) or x, lambda x: x):
        stats = position_stats(Positions(hidden, OutputLayer(weight)), torch.zeros(64, dtype=torch.long),
                               entropy=True)
    assert max(saved) < 64 * 1000 // 4  # the checkpoints keep hidden states and weights, not logits
    stats.logprobs.sum().backward()
    assert weight.grad.abs().sum() > 0 and stats.entropy.grad_fn is None  # the entropy metric is detached


def test_label_smoothed_cross_entropy_equals_transformers_label_smoother():
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 5, 7, generator=generator)
    labels = torch.randint(0, 7, (2, 5), generator=generator)
    labels[1, 3:] = -100
    logp = logits.log_softmax(-1)
    got = losses.label_smoothed_cross_entropy(logp.gather(-1, labels.clamp(min=0)[..., None])[..., 0],
                                              logp.sum(-1), labels, 0.1, 7)
    torch.testing.assert_close(got, LabelSmoother(epsilon=0.1)({"logits": logits}, labels))
    # hand-computed: one position, p = [1/2, 1/2], label 0: 0.9 * ln 2 + 0.1 * (2 ln 2) / 2
    one = losses.label_smoothed_cross_entropy(torch.tensor([[math.log(0.5)]]), torch.tensor([[2 * math.log(0.5)]]),
                                              torch.tensor([[0]]), 0.1, 2)
    assert one.item() == pytest.approx(math.log(2))


@pytest.mark.parametrize("beta,tau", [(0.0, 1.0), (1.0, 2.0), (0.3, 0.7)])
def test_chunked_divergence_equals_the_whole_tensor_formula(monkeypatch, beta, tau):
    """The `divergence` stat against `generalized_jsd` over whole logits in float64: values and the
    gradients of hidden states, weight and bias, with per-row bans, a soft cap, a teacher with its own bias and
    width, and the divergence's own temperature (the samples' log-probs at another)."""
    generator = torch.Generator().manual_seed(1)
    count, d, d_teacher, vocab = 9, 4, 6, 13
    hidden = torch.randn(count, d, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(vocab, d, dtype=torch.float64, generator=generator, requires_grad=True)
    bias = torch.randn(vocab, dtype=torch.float64, generator=generator, requires_grad=True)
    layer = OutputLayer(weight, bias, softcap=4.0)
    teacher_layer = OutputLayer(torch.randn(vocab, d_teacher, dtype=torch.float64, generator=generator),
                                torch.randn(vocab, dtype=torch.float64, generator=generator))
    teacher_hidden = torch.randn(count, d_teacher, dtype=torch.float64, generator=generator)
    ids = torch.randint(1, vocab, (count,), generator=generator)
    banned = torch.zeros(2, vocab, dtype=torch.bool)
    banned[0, 0], banned[1, [0, 7]] = True, True
    rows = torch.randint(0, 2, (count,), generator=generator)
    ids = torch.where(banned[rows, ids], 1, ids)
    monkeypatch.setattr(lm_head, "CHUNK_ELEMENTS", 3 * vocab)
    stats = position_stats(Positions(hidden, layer), ids, 1.3, banned, rows,
                           divergence=lm_head.Divergence(Positions(teacher_hidden, teacher_layer), beta, tau))
    want = generalized_jsd(layer(hidden), teacher_layer(teacher_hidden), beta, tau, banned[rows])
    torch.testing.assert_close(stats.divergence.double(), want)
    weights = torch.randn(count, dtype=torch.float64, generator=generator)
    grads = torch.autograd.grad((stats.divergence * weights).sum(), (hidden, weight, bias))
    for got, expected in zip(grads, torch.autograd.grad((want * weights).sum(), (hidden, weight, bias))):
        torch.testing.assert_close(got, expected)


def test_hand_computed_divergence_of_one_position():
    # student logits [0, 0, ln 2]: p_s = [1/4, 1/4, 1/2]; teacher uniform: p_t = [1/3, 1/3, 1/3]
    inputs = Positions(torch.ones(1, 1, dtype=torch.float64),
                       OutputLayer(torch.tensor([[0.0], [0.0], [math.log(2)]], dtype=torch.float64)))
    uniform = Positions(torch.ones(1, 1, dtype=torch.float64), OutputLayer(torch.zeros(3, 1, dtype=torch.float64)))
    forward = position_stats(inputs, torch.tensor([2]), divergence=lm_head.Divergence(uniform, 0.0))
    reverse = position_stats(inputs, torch.tensor([2]), divergence=lm_head.Divergence(uniform, 1.0))
    # KL(t || s) = sum 1/3 ln(1/3 / p_s) = -ln 3 - (2 ln(1/4) + ln(1/2)) / 3 = 5/3 ln 2 - ln 3
    assert forward.divergence.item() == pytest.approx(5 / 3 * math.log(2) - math.log(3))
    assert reverse.divergence.item() == pytest.approx(math.log(3) - 1.5 * math.log(2))
