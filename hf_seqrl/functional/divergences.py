"""Divergences between a student's and a teacher's next-token distributions, and the on-policy reverse KL as
per-token advantages: the math of distillation (`hf_seqrl.objectives.distillation`). Pure tensor code (torch only).

`beta` selects the divergence as TRL's `DistillationConfig.beta` does: 0 is the forward `KL(teacher || student)`
(word-level knowledge distillation), 1 the reverse `KL(student || teacher)`, anything between the generalized
Jensen-Shannon divergence `beta KL(p_t || m) + (1 - beta) KL(p_s || m)` with the mixture
`m = (1 - beta) p_s + beta p_t` (Agarwal et al., 2024). Both distributions are softmaxes at `temperature`, banned
tokens out of both (probability exactly 0, and `0 * log 0` stays 0).

The scoring pass reduces the same divergence from hidden states a slice of the vocabulary at a time
(`hf_seqrl.functional.lm_head`, the `divergence` stat); these full-logits forms are its reference and what a user
with logits in hand calls.
"""

from __future__ import annotations

import math

import torch


def check_beta(beta: float, owner: str = "beta") -> None:
    """Raises a ValueError unless `beta` is in [0, 1] (the interpolation of `generalized_jsd`)."""
    if not 0.0 <= beta <= 1.0 or math.isnan(beta):
        raise ValueError(f"{owner}={beta} must be in [0, 1]: 0 is the forward KL(teacher || student), 1 the reverse "
                         "KL(student || teacher), values between the generalized Jensen-Shannon divergence.")


def distribution_logprobs(logits: torch.Tensor, temperature: float = 1.0,
                          banned: torch.Tensor | None = None) -> torch.Tensor:
    """Returns the log-softmax of `logits / temperature` `(..., V)` in float32 (float64 stays), banned entries
    (`banned`, bool, broadcastable to the logits) at `finfo.min` minus the normalizer: out of the distribution."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    if banned is not None:
        z = z.masked_fill(banned, torch.finfo(z.dtype).min)
    return torch.log_softmax(z, dim=-1)


def _banned_zero(x: torch.Tensor, banned: torch.Tensor | None) -> torch.Tensor:
    return x if banned is None else x.masked_fill(banned, 0.0)


def divergence_terms(beta: float, log_s: torch.Tensor, log_t: torch.Tensor, banned: torch.Tensor | None = None):
    """Returns `(value, aux, log_m)`, the divergence `beta` selects summed over the last dim of the student's and the
    teacher's log-probs `log_s`, `log_t` `(..., C)` (a whole vocabulary, or a chunk of it whose sums are added up):
    `value` `(...)`; `aux` `(...)`, what its gradient reads (`KL(p_s || m)` for the generalized JSD, else the value);
    `log_m` the mixture's log-probs (None at `beta` 0 or 1). Banned entries (`banned`, `(..., C)`) contribute 0."""
    ps = log_s.exp()
    if beta == 0.0:
        value = (log_t.exp() * _banned_zero(log_t - log_s, banned)).sum(dim=-1)
        return value, value, None
    if beta == 1.0:
        value = (ps * _banned_zero(log_s - log_t, banned)).sum(dim=-1)
        return value, value, None
    log_m = torch.logaddexp(log_s + math.log(1 - beta), log_t + math.log(beta))
    kl_s = (ps * _banned_zero(log_s - log_m, banned)).sum(dim=-1)
    kl_t = (log_t.exp() * _banned_zero(log_t - log_m, banned)).sum(dim=-1)
    return beta * kl_t + (1 - beta) * kl_s, kl_s, log_m


def generalized_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float = 0.5,
                    temperature: float = 1.0, banned: torch.Tensor | None = None) -> torch.Tensor:
    """Returns the divergence `beta` selects between the student's and the teacher's distributions at each position
    (see the module): `(...)`, with grad through `student_logits` (and `teacher_logits` if it has any).

    Args:
        student_logits, teacher_logits (`torch.Tensor` of shape `(..., V)`): the two models' logits at the same
            positions (the same tokenizer).
        beta (`float` in [0, 1]): 0 forward KL, 1 reverse KL, else the generalized JSD.
        temperature (`float`): both distributions are softmaxes of the logits over `temperature`.
        banned (`torch.BoolTensor` broadcastable to `(..., V)`, *optional*): tokens out of both distributions.
    """
    check_beta(beta)
    if banned is not None:
        banned = banned.expand_as(student_logits)
    log_s = distribution_logprobs(student_logits, temperature, banned)
    log_t = distribution_logprobs(teacher_logits, temperature, banned)
    return divergence_terms(beta, log_s, log_t, banned)[0]


def forward_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0,
               banned: torch.Tensor | None = None) -> torch.Tensor:
    """Returns `KL(teacher || student)` at each position `(...)` (`generalized_jsd` at `beta=0`)."""
    return generalized_jsd(student_logits, teacher_logits, 0.0, temperature, banned)


def reverse_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0,
               banned: torch.Tensor | None = None) -> torch.Tensor:
    """Returns `KL(student || teacher)` at each position `(...)` (`generalized_jsd` at `beta=1`)."""
    return generalized_jsd(student_logits, teacher_logits, 1.0, temperature, banned)


def reverse_kl_advantages(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, token_mask: torch.Tensor,
                          reward_to_go: bool = False) -> torch.Tensor:
    """Returns the per-token advantages of the on-policy reverse KL `(N, T)`, constants (no grad), 0 outside
    `token_mask`: `-(log p_s(y_t) - log p_t(y_t))` at each of the student's own sampled tokens, or with
    `reward_to_go` the sum of that over positions `t' >= t`.

    With `reward_to_go` the policy-gradient loss over these advantages (`losses.policy_gradient_loss`) has the
    exact gradient of the sequence-level `KL(P_s || P_t)` as its expectation over samples from the student at
    temperature 1 (the tests enumerate a toy policy); without, each token's own log-ratio only (the form the
    on-policy distillation recipes use: the prefix's distribution is held fixed).

    Args:
        student_logprobs, teacher_logprobs (`torch.Tensor` of shape `(N, T)`): the two models' log-probs of the
            student's sampled tokens.
        token_mask (`torch.Tensor` of shape `(N, T)`): true up to and including each sample's EOS.
    """
    mask = token_mask.to(student_logprobs.dtype)
    gap = (student_logprobs.detach() - teacher_logprobs.detach().to(student_logprobs.dtype)) * mask
    if reward_to_go:
        gap = gap.flip(-1).cumsum(-1).flip(-1) * mask
    return -gap
