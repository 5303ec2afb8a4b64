"""Pure tensor math of sequence-level training. Imports torch only.

Shapes: `B` sources in a batch, `n` samples per source (samples of one source are contiguous rows),
`T` decoded positions, `V` vocabulary size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Returns the sum of `x` over `dim`, counting only positions where `mask` is true.

    Args:
        x (`torch.Tensor` of shape `(..., T)`): values.
        mask (`torch.Tensor` of shape `(..., T)`, bool or 0/1): which positions count.
    """
    return (x * mask.to(x.dtype)).sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Returns the mean of `x` over `dim` at the positions where `mask` is true (0 where none is).

    Args:
        x (`torch.Tensor` of shape `(..., T)`): values.
        mask (`torch.Tensor` of shape `(..., T)`, bool or 0/1): which positions count.
    """
    count = mask.to(x.dtype).sum(dim=dim)
    return masked_sum(x, mask, dim=dim) / count.clamp(min=1.0)


def advantages(rewards: torch.Tensor, baseline: torch.Tensor | float) -> torch.Tensor:
    """Returns `rewards - baseline`, with no gradient through either.

    Args:
        rewards (`torch.Tensor` of shape `(B*n,)`): reward of each sampled sequence.
        baseline (`torch.Tensor` of shape `(B*n,)` or a float): baseline of each sample.
    """
    baseline = torch.as_tensor(baseline, dtype=rewards.dtype, device=rewards.device)
    return (rewards - baseline).detach()


def center_advantages(adv: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Returns `adv - mean(adv)` over the kept samples; the others stay 0.

    The greedy baseline of SCST sits above the mean reward of the samples whenever the greedy decode is better
    than a typical sample, so most advantages share one sign. That offset adds zero-mean noise to the gradient
    (`offset * grad log p(y)`), which grows with the length of the samples; centering removes it.

    Args:
        adv (`torch.Tensor` of shape `(B*n,)`): advantages.
        keep (`torch.Tensor` of shape `(B*n,)`, *optional*): false for samples left out (non-finite rewards).
    """
    if keep is None:
        keep = torch.ones_like(adv, dtype=torch.bool)
    if not keep.any():
        return adv
    mean = adv[keep].mean()
    return torch.where(keep, adv - mean, torch.zeros_like(adv))


def scale_advantages(adv: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Returns `adv / std(adv)`; `adv` unchanged when the std is below `eps` (constant rewards).

    Args:
        adv (`torch.Tensor` of shape `(B*n,)`): advantages.
    """
    if adv.numel() < 2:
        return adv
    std = adv.std()
    if not torch.isfinite(std) or std < eps:
        return adv
    return adv / std


def leave_one_out_baseline(rewards: torch.Tensor, num_samples: int) -> torch.Tensor:
    """Returns, for each sample, the mean reward of the *other* samples of its source.

    `b_i = (sum_j r_j - r_i) / (n - 1)` (Kool et al., 2019). The baseline of a sample does not depend on its
    own reward, so the policy gradient stays unbiased.

    Args:
        rewards (`torch.Tensor` of shape `(B*n,)`): rewards, the `n` samples of a source contiguous.
        num_samples (`int`): `n`, at least 2.
    """
    if num_samples < 2:
        raise ValueError(f"leave_one_out_baseline needs num_samples >= 2, got {num_samples}.")
    if rewards.numel() % num_samples:
        raise ValueError(f"rewards has {rewards.numel()} entries, not a multiple of num_samples={num_samples}.")
    grouped = rewards.view(-1, num_samples)
    totals = grouped.sum(dim=1, keepdim=True)
    return ((totals - grouped) / (num_samples - 1)).reshape(-1)


def moving_average(previous: float | None, batch_mean: float, decay: float) -> float:
    """Returns the updated exponential moving average `decay * previous + (1 - decay) * batch_mean`.

    The first call (`previous is None`) returns `batch_mean`.
    """
    if previous is None:
        return float(batch_mean)
    return decay * float(previous) + (1.0 - decay) * float(batch_mean)


def sequence_logprobs(
    token_logprobs: torch.Tensor, token_mask: torch.Tensor, length_normalize: bool = False
) -> torch.Tensor:
    """Returns the log-probability of each sequence: sum (or mean) of its token log-probs.

    Args:
        token_logprobs (`torch.Tensor` of shape `(B*n, T)`): log-prob of each sampled token.
        token_mask (`torch.Tensor` of shape `(B*n, T)`): true up to and including the EOS of each sample.
    """
    if length_normalize:
        return masked_mean(token_logprobs, token_mask)
    return masked_sum(token_logprobs, token_mask)


def policy_gradient_loss(
    token_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    advantages: torch.Tensor,
    length_normalize: bool = False,
) -> torch.Tensor:
    """Returns the REINFORCE loss `-mean_i A_i * log p(y_i | x_i)`, a scalar.

    Its gradient is the score-function estimate of `-grad E[reward]` when `A_i = r_i - b_i` with a baseline
    `b_i` that does not depend on `y_i`.

    Args:
        token_logprobs (`torch.Tensor` of shape `(B*n, T)`): log-prob of each sampled token, with grad.
        token_mask (`torch.Tensor` of shape `(B*n, T)`): true up to and including the EOS of each sample.
        advantages (`torch.Tensor` of shape `(B*n,)`): advantage of each sample (treated as a constant).
        length_normalize (`bool`): use the mean instead of the sum of token log-probs.
    """
    seq_logprobs = sequence_logprobs(token_logprobs, token_mask, length_normalize)
    return -(advantages.detach().to(seq_logprobs.dtype) * seq_logprobs).mean()


def mix_losses(rl_loss: torch.Tensor, xe_loss: torch.Tensor | None, rl_weight: float) -> torch.Tensor:
    """Returns `rl_weight * rl_loss + (1 - rl_weight) * xe_loss` (Paulus et al., 2017).

    `xe_loss` may be None only when `rl_weight == 1`.
    """
    if rl_weight >= 1.0:
        return rl_loss
    if xe_loss is None:
        raise ValueError(f"mix_losses needs xe_loss when rl_weight={rl_weight} < 1.")
    if rl_weight <= 0.0:
        return xe_loss
    return rl_weight * rl_loss + (1.0 - rl_weight) * xe_loss


def token_logprobs_from_logits(
    logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Returns `log softmax(logits / temperature)` at `token_ids`, without materializing the log-softmax.

    Args:
        logits (`torch.Tensor` of shape `(N, T, V)`): decoder logits.
        token_ids (`torch.Tensor` of shape `(N, T)`): tokens whose log-probs are wanted (any value where masked).
    """
    logits = logits.float()  # before the division: bf16/fp16 logits would round the scaled values
    if temperature != 1.0:
        logits = logits / temperature
    chosen = logits.gather(-1, token_ids.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Returns the entropy `-sum_v p_v log p_v` of the next-token distribution at each position.

    Args:
        logits (`torch.Tensor` of shape `(N, T, V)`): decoder logits.

    Returns: `torch.Tensor` of shape `(N, T)`.
    """
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def token_kl(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """Returns `KL(p || q) = sum_v p_v (log p_v - log q_v)` at each position (exact, over the vocabulary).

    Args:
        logits (`torch.Tensor` of shape `(N, T, V)`): policy logits `p` (with grad).
        ref_logits (`torch.Tensor` of shape `(N, T, V)`): reference logits `q` (no grad).

    Returns: `torch.Tensor` of shape `(N, T)`.
    """
    logp = F.log_softmax(logits.float(), dim=-1)
    logq = F.log_softmax(ref_logits.float(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(dim=-1)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Returns the mean token cross-entropy over positions where `labels != ignore_index`.

    Args:
        logits (`torch.Tensor` of shape `(N, T, V)`), labels (`torch.Tensor` of shape `(N, T)`).
    """
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=ignore_index)
