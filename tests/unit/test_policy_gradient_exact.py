"""The policy-gradient loss with the leave-one-out and greedy baselines estimates the exact gradient of the
expected reward, on a toy autoregressive policy small enough to enumerate every sequence.

Vocabulary {0: EOS, 1: a, 2: b}, at most 3 tokens: 1 + 2 + 4 + 8 = 15 sequences. The policy is a table of
logits theta[position, previous token] (previous token 3 = start).
"""

import itertools

import pytest
import torch

from hf_seqrl import losses
from hf_seqrl.functional.divergences import reverse_kl_advantages
from hf_seqrl.functional.risk import first_occurrence_mask

EOS, L, V = 0, 3, 3


def all_sequences():
    seqs = [[EOS]]
    for length in (2, 3):
        seqs += [list(p) + [EOS] for p in itertools.product([1, 2], repeat=length - 1)]
    seqs += [list(p) for p in itertools.product([1, 2], repeat=L)]  # hit the length limit without EOS
    return seqs


def reward(seq):
    # Arbitrary but fixed: likes 'a' early, dislikes length.
    return sum(1.0 / (i + 1) for i, t in enumerate(seq) if t == 1) - 0.3 * len(seq) + (0.5 if seq[-1] == EOS else 0)


def token_logprobs(theta, seqs):
    """(N, L) log-probs and mask of padded sequences under the tabular policy."""
    logp = torch.log_softmax(theta, dim=-1)
    rows, masks = [], []
    for seq in seqs:
        prev, row = 3, []
        for t, tok in enumerate(seq):
            row.append(logp[t, prev, tok])
            prev = tok
        row += [torch.zeros(())] * (L - len(seq))
        rows.append(torch.stack(row))
        masks.append([True] * len(seq) + [False] * (L - len(seq)))
    return torch.stack(rows), torch.tensor(masks)


def exact_objective(theta):
    seqs = all_sequences()
    lp, mask = token_logprobs(theta, seqs)
    probs = losses.masked_sum(lp, mask).exp()
    return (probs * torch.tensor([reward(s) for s in seqs])).sum(), probs.detach(), seqs


def greedy_sequence(theta):
    prev, seq = 3, []
    for t in range(L):
        tok = int(theta[t, prev].argmax())
        seq.append(tok)
        if tok == EOS:
            break
        prev = tok
    return seq


def make_theta():
    torch.manual_seed(0)
    return (torch.randn(L, 4, V) * 0.7).requires_grad_(True)


def exact_gradient(theta):
    J, probs, seqs = exact_objective(theta)
    (grad,) = torch.autograd.grad(-J, theta)  # the loss is minimized: gradient of -E[R]
    return grad, probs, seqs


def test_probabilities_sum_to_one():
    _, probs, _ = exact_objective(make_theta())
    assert abs(probs.sum().item() - 1.0) < 1e-6


def test_leave_one_out_expected_gradient_is_exact():
    # Expectation of the estimator over every ordered pair of samples (n = 2), weighted by its probability.
    theta = make_theta()
    target, probs, seqs = exact_gradient(theta)
    rewards = torch.tensor([reward(s) for s in seqs])
    total = torch.zeros(())
    for i, j in itertools.product(range(len(seqs)), repeat=2):
        lp, mask = token_logprobs(theta, [seqs[i], seqs[j]])
        r = rewards[[i, j]]
        adv = losses.advantages(r, losses.leave_one_out_baseline(r, 2))
        total = total + probs[i] * probs[j] * losses.policy_gradient_loss(lp, mask, adv)
    (estimate,) = torch.autograd.grad(total, theta)
    torch.testing.assert_close(estimate, target, atol=1e-6, rtol=1e-5)


def test_greedy_baseline_expected_gradient_is_exact():
    theta = make_theta()
    target, probs, seqs = exact_gradient(theta)
    b = reward(greedy_sequence(theta.detach()))
    lp, mask = token_logprobs(theta, seqs)
    adv = losses.advantages(torch.tensor([reward(s) for s in seqs]), b)
    # policy_gradient_loss averages over rows: weight row k by N * p_k to get sum_k p_k * (...)
    weighted = losses.policy_gradient_loss(lp, mask, adv * probs * len(seqs))
    (estimate,) = torch.autograd.grad(weighted, theta)
    torch.testing.assert_close(estimate, target, atol=1e-6, rtol=1e-5)


def sample_sequences(theta, count, generator):
    probs = torch.softmax(theta.detach(), dim=-1)
    seqs = []
    prev = torch.full((count,), 3)
    alive = torch.ones(count, dtype=torch.bool)
    tokens = torch.zeros(count, L, dtype=torch.long)
    lengths = torch.full((count,), L)
    for t in range(L):
        tok = torch.multinomial(probs[t, prev], 1, generator=generator).squeeze(1)
        tokens[:, t] = tok
        ended = alive & (tok == EOS)
        lengths[ended] = t + 1
        alive &= ~ended
        prev = tok
    for k in range(count):
        seqs.append(tokens[k, : lengths[k]].tolist())
    return seqs


def test_monte_carlo_gradients_match_exact_gradient():
    """Sampled estimates (LOO with n = 4, greedy baseline) land within 4 standard errors of the exact gradient."""
    theta = make_theta()
    target, _, seqs = exact_gradient(theta)
    index = {tuple(s): k for k, s in enumerate(seqs)}
    lp_all, mask_all = token_logprobs(theta, seqs)
    # Per-sequence score function d log p(y) / d theta, computed once per enumerated sequence.
    scores = torch.stack([torch.autograd.grad(losses.masked_sum(lp_all[k], mask_all[k]), theta,
                                              retain_graph=True)[0] for k in range(len(seqs))])
    rewards = torch.tensor([reward(s) for s in seqs])
    gen = torch.Generator().manual_seed(1)
    n, sources = 4, 20000
    drawn = torch.tensor([index[tuple(s)] for s in sample_sequences(theta, n * sources, gen)])
    b_greedy = reward(greedy_sequence(theta.detach()))
    for baseline in ("mean", "greedy"):
        r = rewards[drawn]
        b = losses.leave_one_out_baseline(r, n) if baseline == "mean" else torch.full_like(r, b_greedy)
        adv = losses.advantages(r, b)
        # The estimate through policy_gradient_loss itself (rows = samples), as the trainer computes it.
        lp, mask = lp_all[drawn], mask_all[drawn]
        (estimate,) = torch.autograd.grad(losses.policy_gradient_loss(lp, mask, adv), theta, retain_graph=True)
        # Its standard error: per-source contributions are i.i.d.
        per_source = (-(adv[:, None, None, None] * scores[drawn])).view(sources, n, *theta.shape).mean(1)
        stderr = per_source.std(0) / sources**0.5
        assert torch.all((estimate - target).abs() <= 4 * stderr + 1e-6), baseline
        # and it is tight: the estimate is close in relative terms too
        assert (estimate - target).norm() / target.norm() < 0.05, baseline


def test_minimum_risk_gradient_over_the_whole_output_space_is_exact():
    """With every sequence as the candidate set, MRT's loss and gradient are those of the explicit α-sharpened
    expected cost sum_y p(y)^α (1 - r(y)) / sum_y p(y)^α; at α = 1 that is 1 - E[r], whose gradient is exact."""
    theta = make_theta()
    seqs = all_sequences()
    rewards = torch.tensor([reward(s) for s in seqs])
    lp, mask = token_logprobs(theta, seqs)
    seq_lp = losses.masked_sum(lp, mask)
    for alpha in (1.0, 0.3, 0.005):
        loss = losses.minimum_risk_loss(seq_lp, rewards, len(seqs), alpha)
        (grad,) = torch.autograd.grad(loss, theta, retain_graph=True)
        sharpened = seq_lp.exp() ** alpha  # p(y)^α, spelled out
        explicit = (sharpened * (1 - rewards)).sum() / sharpened.sum()
        (explicit_grad,) = torch.autograd.grad(explicit, theta, retain_graph=True)
        assert loss.item() == pytest.approx(explicit.item(), rel=1e-5), alpha
        torch.testing.assert_close(grad, explicit_grad, atol=1e-6, rtol=1e-5)
    target, _, _ = exact_gradient(theta)  # gradient of -E[r]
    (grad_alpha_one,) = torch.autograd.grad(losses.minimum_risk_loss(seq_lp, rewards, len(seqs), 1.0), theta)
    torch.testing.assert_close(grad_alpha_one, target, atol=1e-6, rtol=1e-5)


def test_minimum_risk_gradient_over_a_fixed_n_best_is_the_explicit_one():
    """Over a fixed candidate set (the 4 likeliest sequences, as a beam's n-best would be, plus a repeat of the
    first, which must count once), MRT's loss and gradient are those of sum_{y in S} p(y)^α (1 - r(y)) /
    sum_{y in S} p(y)^α over the distinct candidates: Q renormalizes over the set, whatever mass lies outside it."""
    theta = make_theta()
    seqs = all_sequences()
    lp_all, mask_all = token_logprobs(theta, seqs)
    seq_lp_all = losses.masked_sum(lp_all, mask_all)
    n_best = [seqs[i] for i in seq_lp_all.detach().argsort(descending=True)[:4].tolist()]
    candidates = n_best + [n_best[0]]
    lp, mask = token_logprobs(theta, candidates)
    seq_lp = losses.masked_sum(lp, mask)
    rewards = torch.tensor([reward(s) for s in candidates])
    # the candidate set's duplicate mask, from the ids padded after their last token
    ids = torch.tensor([s + [-1] * (L - len(s)) for s in candidates])
    keep = first_occurrence_mask(ids, len(candidates))
    assert keep.tolist() == [True, True, True, True, False]
    for alpha in (1.0, 0.3):
        loss = losses.minimum_risk_loss(seq_lp, rewards, len(candidates), alpha, keep)
        (grad,) = torch.autograd.grad(loss, theta, retain_graph=True)
        distinct = seq_lp[:4].exp() ** alpha  # the repeat left out, spelled out
        explicit = (distinct * (1 - rewards[:4])).sum() / distinct.sum()
        (explicit_grad,) = torch.autograd.grad(explicit, theta, retain_graph=True)
        assert loss.item() == pytest.approx(explicit.item(), rel=1e-5), alpha
        torch.testing.assert_close(grad, explicit_grad, atol=1e-6, rtol=1e-5)
    # the set leaves mass out: its risk is not the whole space's
    whole = losses.minimum_risk_loss(seq_lp_all, torch.tensor([reward(s) for s in seqs]), len(seqs), 1.0)
    assert abs(whole.item() - losses.minimum_risk_loss(seq_lp, rewards, len(candidates), 1.0, keep).item()) > 1e-3


def make_teacher():
    torch.manual_seed(1)
    return torch.randn(L, 4, V) * 0.9


def test_reverse_kl_estimator_expectation_is_the_exact_sequence_level_gradient():
    """On-policy distillation: per-token advantages -(log p_s - log p_t), summed to the end of the sample
    (`reverse_kl_advantages(..., reward_to_go=True)`), through `policy_gradient_loss`, weighted by each
    sequence's probability under the student, give the gradient of the exact KL(P_s || P_t) over whole sequences.
    Each token's own log-ratio alone (the recipes' form) holds the prefixes' distribution fixed and does not."""
    theta, teacher = make_theta(), make_teacher()
    seqs = all_sequences()
    lp, mask = token_logprobs(theta, seqs)
    teacher_lp, _ = token_logprobs(teacher, seqs)
    seq_s, seq_t = losses.masked_sum(lp, mask), losses.masked_sum(teacher_lp, mask)
    exact = (seq_s.exp() * (seq_s - seq_t)).sum()  # KL(P_s || P_t) = sum_y P_s(y) (log P_s(y) - log P_t(y))
    (target,) = torch.autograd.grad(exact, theta, retain_graph=True)
    probs = seq_s.detach().exp()
    for to_go in (True, False):
        adv = reverse_kl_advantages(lp, teacher_lp, mask, reward_to_go=to_go)
        # policy_gradient_loss averages over rows: weight row k by N * P_s(k) for sum_k P_s(k) * (...)
        weighted = losses.policy_gradient_loss(lp, mask, adv * (probs * len(seqs)).unsqueeze(1))
        (estimate,) = torch.autograd.grad(weighted, theta, retain_graph=True)
        if to_go:
            torch.testing.assert_close(estimate, target, atol=1e-6, rtol=1e-5)
        else:
            assert (estimate - target).norm() > 1e-3


def token_term(t, prev, tok):
    # an arbitrary fixed per-token reward: likes 'b' after 'a', dislikes EOS early
    return (1.0 if (prev, tok) == (1, 2) else 0.0) - (0.5 if tok == EOS and t == 0 else 0.0) + 0.1 * t * (tok == 1)


def token_values(seqs):
    """(N, L) per-token rewards of padded sequences."""
    rows = []
    for seq in seqs:
        prev, row = 3, []
        for t, tok in enumerate(seq):
            row.append(token_term(t, prev, tok))
            prev = tok
        rows.append(row + [0.0] * (L - len(seq)))
    return torch.tensor(rows)


def test_token_level_estimator_expectation_is_the_gradient_of_the_expected_total_reward():
    """A reward that is a sum of per-token terms: the per-token advantages summed to the end of the sample
    (`token_level_advantages(..., reward_to_go=True)`, no sentence part) through `policy_gradient_loss`, weighted by
    each sequence's probability, give the exact gradient of -E[sum of the terms]; each token's own term alone does not
    (it leaves out what a token does to the terms after it)."""
    from hf_seqrl.functional.advantages import token_level_advantages

    theta = make_theta()
    seqs = all_sequences()
    lp, mask = token_logprobs(theta, seqs)
    values = token_values(seqs)
    probs = losses.masked_sum(lp, mask).exp()
    expected = (probs * losses.masked_sum(values, mask)).sum()
    (target,) = torch.autograd.grad(-expected, theta, retain_graph=True)
    weights = (probs.detach() * len(seqs)).unsqueeze(1)
    for to_go in (True, False):
        adv = token_level_advantages(torch.zeros(len(seqs)), values, mask, reward_to_go=to_go)
        (estimate,) = torch.autograd.grad(losses.policy_gradient_loss(lp, mask, adv * weights), theta,
                                          retain_graph=True)
        if to_go:
            torch.testing.assert_close(estimate, target, atol=1e-6, rtol=1e-5)
        else:
            assert (estimate - target).norm() > 1e-3
