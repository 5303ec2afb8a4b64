"""Token log-probs, entropy and KL over the vocabulary of a logits tensor one has: one pass over the logits, block by
block on CPU (the diagnostics, and the losses' helpers). The scoring pass does not make a logits tensor: it reduces
the decoder's hidden states chunk by chunk (`hf_seqrl.functional.lm_head`).

Pure tensor kernels below `hf_seqrl.losses` (torch only). On CPU, forward and backward run over the logits in
place, a block of rows at a time, so that a block stays in cache from one pass to the next.

Banned tokens. Each kernel takes an optional `banned` bool mask broadcastable to the logits (e.g. `(V,)`, or `(T, V)`
when the bans depend on the position): the distribution is then the softmax over the other entries (renormalized),
the banned logits set to `torch.finfo(dtype).min` (not -inf: their probability is exactly 0 and `0 * log 0` stays 0,
so that entropy, KL and gradients hold no NaN). The mask is applied to a block copy or a computed tensor, never to
the logits in place.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F


# On CPU the passes over the vocabulary run block by block, each block about 2^18 logits (1 MiB in float32), so
# that a block stays in cache from one pass to the next instead of every pass reading the whole logits tensor
# from memory. On other devices each function makes its passes over the whole tensor.
CPU_BLOCK_ELEMENTS = 1 << 18
BLOCKWISE_DEVICES = ("cpu",)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for bf16/fp16/float32 logits (the scaled values would round in half precision), else `x`'s."""
    return torch.promote_types(x.dtype, torch.float32)


def _row_blocks(x: torch.Tensor):
    """Yields `(key, block)` with `block = x[key]`, a `(rows, V)` piece of `x` `(..., T, V)`; the keys cover `x`.

    Indexing never copies, whatever `x`'s strides (a slice of a larger logits tensor stays a view).
    """
    rows = max(1, CPU_BLOCK_ELEMENTS // x.shape[-1])
    for index in itertools.product(*map(range, x.shape[:-2])):
        for start in range(0, x.shape[-2], rows):
            key = index + (slice(start, start + rows),)
            yield key, x[key]


def _ban(z: torch.Tensor, banned: torch.Tensor | None, key=None) -> torch.Tensor:
    """Returns a copy of `z` with `finfo.min` at its banned entries (`banned[key]` with a key; `banned` expanded to
    the logits' shape), or `z` itself when nothing is banned."""
    if banned is None:
        return z
    return z.masked_fill(banned if key is None else banned[key], torch.finfo(z.dtype).min)


def _scale(z: torch.Tensor, temperature, key=None) -> torch.Tensor:
    """Returns `z / temperature` for a float or a per-position temperature tensor (`temperature[key]` with a key);
    `z` itself at the float temperature 1."""
    if isinstance(temperature, torch.Tensor):
        return z / (temperature if key is None else temperature[key]).unsqueeze(-1)
    return z if temperature == 1.0 else z / temperature


class _BlockwiseTokenLogprobs(torch.autograd.Function):
    """`z_y - logsumexp(z')` with `z = logits / temperature` and `z'` = `z` with its banned entries at `finfo.min`
    (`z' = z` when `banned` is None), block by block, forward and backward.

    Backward: d/dz (z_y - logsumexp(z')) = onehot(y) - softmax(z'), times the incoming gradient, divided by
    `temperature`; softmax(z') (0 at banned entries) is recomputed per block from the saved logsumexp.
    """

    @staticmethod
    def forward(ctx, logits, token_ids, temperature, banned):
        dtype = _compute_dtype(logits)
        out = torch.empty(logits.shape[:-1], dtype=dtype, device=logits.device)
        lse = torch.empty_like(out)
        for key, block in _row_blocks(logits):
            z = _scale(block.to(dtype), temperature, key)  # at temperature 1, float32 logits: the logits' own block
            lse[key] = torch.logsumexp(_ban(z, banned, key), dim=-1)
            out[key] = z.gather(-1, token_ids[key].unsqueeze(-1)).squeeze(-1) - lse[key]
        ctx.save_for_backward(logits, token_ids, lse, banned)
        ctx.temperature = temperature
        return out

    @staticmethod
    def backward(ctx, grad_out):
        logits, token_ids, lse, banned = ctx.saved_tensors
        temperature = ctx.temperature
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        for key, block in _row_blocks(logits):
            z = _ban(_scale(block.to(lse.dtype), temperature, key), banned, key)
            g = grad_out[key].unsqueeze(-1)
            scores = (z - lse[key].unsqueeze(-1)).exp_().mul_(-g)  # -g * softmax(z'), a new tensor: logits untouched
            scores.scatter_add_(-1, token_ids[key].unsqueeze(-1), g)
            grad[key] = _scale(scores, temperature, key)
        return grad, None, None, None


def token_logprobs_from_logits(
    logits: torch.Tensor, token_ids: torch.Tensor, temperature: float | torch.Tensor = 1.0,
    banned: torch.Tensor | None = None,
) -> torch.Tensor:
    """Returns `log softmax(logits / temperature)` at `token_ids`, without materializing the log-softmax.

    Computed in float32 (or float64 for float64 logits). On CPU, forward and backward run block by block over the
    logits in place, whatever their strides: a slice of a larger logits tensor is not copied.

    Args:
        logits (`torch.Tensor` of shape `(..., T, V)`, e.g. `(N, T, V)`): decoder logits.
        token_ids (`torch.Tensor` of any shape with one entry per position of `logits`, in the same order, e.g.
            `(N, T)`): tokens whose log-probs are wanted (any value where masked).
        temperature (`float`, or `torch.Tensor` broadcastable to `logits.shape[:-1]`): one temperature for every
            position, or one per position (e.g. `(N, 1)`: one per row).
        banned (`torch.BoolTensor` broadcastable to `logits.shape`, e.g. `(V,)` or `(T, V)`, *optional*): entries
            outside the distribution. The log-probs are then those of the softmax over the other entries
            (renormalized), and banned logits get no gradient. A banned token's own value is its scaled logit
            minus that normalizer: finite (no sampled token is banned; a pad after EOS may be, and stays harmless).

    Returns: `torch.Tensor` of the shape of `token_ids`.
    """
    positions = logits.shape[:-1]
    ids = token_ids.clamp(min=0).reshape(positions)
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.to(device=logits.device, dtype=_compute_dtype(logits)).expand(positions)
    if banned is not None:
        banned = banned.to(device=logits.device, dtype=torch.bool).expand(logits.shape)  # a view: no copy
    if logits.device.type in BLOCKWISE_DEVICES:
        return _BlockwiseTokenLogprobs.apply(logits, ids, temperature, banned).view(token_ids.shape)
    z = _scale(logits.to(_compute_dtype(logits)), temperature)  # float32 first: bf16/fp16 would round z / t
    chosen = z.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return (chosen - torch.logsumexp(_ban(z, banned), dim=-1)).view(token_ids.shape)


def token_entropy(logits: torch.Tensor, banned: torch.Tensor | None = None) -> torch.Tensor:
    """Returns the entropy `-sum_v p_v log p_v` of the next-token distribution at each position.

    Without autograd on CPU it runs block by block (see `token_logprobs_from_logits`).

    Args:
        logits (`torch.Tensor` of shape `(..., T, V)`, e.g. `(N, T, V)`): decoder logits.
        banned (`torch.BoolTensor` broadcastable to `logits.shape`, *optional*): entries outside the distribution
            (`p = 0` there, the others renormalized), as in `token_logprobs_from_logits`.

    Returns: `torch.Tensor` of shape `logits.shape[:-1]`, e.g. `(N, T)`.
    """
    dtype = _compute_dtype(logits)
    if banned is not None:
        banned = banned.to(device=logits.device, dtype=torch.bool).expand(logits.shape)
    if logits.device.type not in BLOCKWISE_DEVICES or (torch.is_grad_enabled() and logits.requires_grad):
        logp = F.log_softmax(_ban(logits.to(dtype), banned), dim=-1)
        return -(logp.exp() * logp).sum(dim=-1)
    out = torch.empty(logits.shape[:-1], dtype=dtype, device=logits.device)
    for key, block in _row_blocks(logits):
        logp = F.log_softmax(_ban(block.to(dtype), banned, key), dim=-1)
        out[key] = -(logp.exp() * logp).sum(dim=-1)
    return out


def token_kl(logits: torch.Tensor, ref_logits: torch.Tensor, banned: torch.Tensor | None = None) -> torch.Tensor:
    """Returns `KL(p || q) = sum_v p_v (log p_v - log q_v)` at each position (exact, over the vocabulary).

    Args:
        logits (`torch.Tensor` of shape `(N, T, V)`): policy logits `p` (with grad).
        ref_logits (`torch.Tensor` of shape `(N, T, V)`): reference logits `q` (no grad).
        banned (`torch.BoolTensor` broadcastable to `logits.shape`, *optional*): entries outside both distributions
            (`p = q = 0` there, the others renormalized), as in `token_logprobs_from_logits`.

    Returns: `torch.Tensor` of shape `(N, T)`.
    """
    if banned is not None:
        banned = banned.to(device=logits.device, dtype=torch.bool)
    logp = F.log_softmax(_ban(logits.float(), banned), dim=-1)
    logq = F.log_softmax(_ban(ref_logits.float(), banned), dim=-1)
    return (logp.exp() * (logp - logq)).sum(dim=-1)
