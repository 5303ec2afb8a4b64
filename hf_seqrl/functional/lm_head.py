"""The scoring pass's reductions over the vocabulary, computed from the decoder's hidden states a chunk of positions
at a time: the logits of a chunk are made by the output layer, reduced (token log-probs, entropy, KL, label
smoothing's sum) and freed, and the backward makes them again. No tensor of every position's logits ever exists.

Pure tensor code below `hf_seqrl.losses` (torch only); the same code runs on every device. What a model's forward
does after its output matrix (a bias, a soft cap, a scale) is held by `OutputLayer`; `hf_seqrl.models.heads` reads
it from a model. `Positions` also holds precomputed logits (a model whose output layer is not known), in which case
the chunks are slices of them.

Banned tokens are out of the distribution as in `hf_seqrl.functional.logprobs`: their logits are set to
`finfo(float32).min` in a chunk's own copy, so their probability is exactly 0 and `0 * log 0` stays 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F


# A chunk holds about this many logits (16 MiB in float32): a handful of its size is the pass's peak over the model.
CHUNK_ELEMENTS = 1 << 21


@dataclass(frozen=True)
class OutputLayer:
    """The map from a decoder's last hidden state to its logits: `cap * tanh((h W^T + b) * scale / cap)` (no tanh
    without `softcap`).

    Attributes:
        weight (`torch.Tensor` of shape `(V, d)`): the output matrix (tied to the embeddings or not).
        bias (`torch.Tensor` of shape `(V,)`, *optional*): added to the logits (Marian / BART `final_logits_bias`).
        scale (`float`): multiplies the logits (Cohere's `logit_scale`); 1 for most models.
        softcap (`float`, *optional*): Gemma 2 / 3's `final_logit_softcapping`.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    scale: float = 1.0
    softcap: float | None = None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """Returns the logits `(..., V)` of `hidden` `(..., d)`, in the weight's dtype."""
        return self.activate(self.linear(hidden))

    def linear(self, hidden: torch.Tensor) -> torch.Tensor:
        """Returns `h W^T + b` `(..., V)`."""
        return F.linear(hidden.to(self.weight.dtype), self.weight, self.bias)

    def activate(self, logits: torch.Tensor) -> torch.Tensor:
        """Returns what the forward makes of `h W^T + b`: scaled, soft-capped."""
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def frozen(self, copy: bool) -> "OutputLayer":
        """Returns this layer cut from the graph (a copy of its tensors with `copy`: what stays valid after a sharded
        model frees its gathered weights)."""
        take = (lambda x: x.detach().clone()) if copy else (lambda x: x.detach())
        return OutputLayer(take(self.weight), None if self.bias is None else take(self.bias), self.scale, self.softcap)


@dataclass
class Positions:
    """What a forward gave at `P` positions: the output layer's inputs `hidden` `(P, d)` and the `layer`, or (a model
    whose output layer is not known) the `logits` `(P, V)` themselves."""

    hidden: torch.Tensor | None = None
    layer: OutputLayer | None = None
    logits: torch.Tensor | None = None

    def __len__(self) -> int:
        return (self.hidden if self.logits is None else self.logits).shape[0]

    @property
    def vocab_size(self) -> int:
        return self.logits.shape[-1] if self.layer is None else self.layer.weight.shape[0]

    def take(self, index) -> "Positions":
        """Returns the positions `index` (a slice or an index tensor) of these."""
        if self.logits is not None:
            return Positions(logits=self.logits[index])
        return Positions(self.hidden[index], self.layer)


class PositionStats(NamedTuple):
    """What `position_stats` returns, each `(P,)` in float32 (float64 for float64 logits), None where not asked.

    logprobs: log-prob of each token at its temperature, banned tokens out of the softmax (with grad).
    entropy: entropy of the temperature-1 distribution, bans applied (with grad only when asked).
    kl: `KL(p || q)` at temperature 1 to the reference's distribution `q`, bans applied to both (with grad).
    plain_logprobs: log-prob of each token at temperature 1, bans applied (with grad).
    raw_logprobs / raw_logprob_sums: log-prob of each token and the sum of the log-probs over the vocabulary at
        temperature 1 with no bans (label smoothing's two terms, with grad).
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    plain_logprobs: torch.Tensor | None = None
    raw_logprobs: torch.Tensor | None = None
    raw_logprob_sums: torch.Tensor | None = None


def _wide(z: torch.Tensor) -> torch.Tensor:
    """Returns `z` in float32 (bf16 / fp16 logits would round once scaled), or float64 as it is."""
    return z.to(torch.promote_types(z.dtype, torch.float32))


def _banned(z: torch.Tensor, banned: torch.Tensor | None) -> torch.Tensor:
    return z if banned is None else z.masked_fill(banned, torch.finfo(z.dtype).min)


def _banned_zero(x: torch.Tensor, banned: torch.Tensor | None) -> torch.Tensor:
    return x if banned is None else x.masked_fill(banned, 0.0)


# The stats a chunk yields, in this order (`PositionStats`' fields; raw gives the last two).
STATS = ("logprobs", "entropy", "kl", "plain_logprobs", "raw_logprobs", "raw_logprob_sums")


def _chunk_stats(z, ref_z, token_ids, temperature, banned, need):
    """Returns the stats of one chunk (a list in `STATS` order, None where `need` says no) from its float32 logits `z`
    `(C, V)` and the reference's `ref_z`."""
    gathered = token_ids.unsqueeze(-1)
    out = [None] * len(STATS)
    zb = _banned(z, banned) if need[0] or need[1] or need[2] or need[3] else None
    if need[0]:
        scaled = z if isinstance(temperature, float) and temperature == 1.0 else z / temperature
        scaled_banned = zb if scaled is z else _banned(scaled, banned)
        out[0] = scaled.gather(-1, gathered).squeeze(-1) - torch.logsumexp(scaled_banned, dim=-1)
    if need[1] or need[2] or need[3]:
        logp = zb - torch.logsumexp(zb, dim=-1, keepdim=True)
        # 0 (not finfo.min) at banned entries where a log multiplies p: a gradient times finfo.min would overflow
        if need[1]:
            out[1] = -(logp.exp() * _banned_zero(logp, banned)).sum(dim=-1)
        if need[2]:
            ref_zb = _banned(ref_z, banned)
            logq = ref_zb - torch.logsumexp(ref_zb, dim=-1, keepdim=True)
            out[2] = (logp.exp() * _banned_zero(logp - logq, banned)).sum(dim=-1)
        if need[3]:
            out[3] = logp.gather(-1, gathered).squeeze(-1)
    if need[4] or need[5]:
        lse = torch.logsumexp(z, dim=-1)
        if need[4]:
            out[4] = z.gather(-1, gathered).squeeze(-1) - lse
        if need[5]:
            out[5] = z.sum(dim=-1) - z.shape[-1] * lse
    return out


def chunk_rows(vocab_size: int) -> int:
    """Returns how many positions one chunk holds at a vocabulary of `vocab_size`."""
    return max(1, CHUNK_ELEMENTS // max(vocab_size, 1))


def position_stats(
    inputs: Positions, token_ids: torch.Tensor, temperature: float | torch.Tensor = 1.0,
    banned: torch.Tensor | None = None, banned_rows: torch.Tensor | None = None, *,
    reference: Positions | None = None, entropy: bool = False, entropy_grad: bool = False, plain: bool = False,
    raw: bool = False,
) -> PositionStats:
    """Returns the scoring pass's reductions at `P` positions, a chunk of positions at a time (see the module).

    Under autograd the backward makes each chunk's logits again: the graph holds the hidden states and the output
    layer, never the logits.

    Args:
        inputs (`Positions` of `P` positions): the policy's hidden states and output layer (or logits).
        token_ids (`torch.LongTensor` of shape `(P,)`): the token scored at each position (negative read as 0).
        temperature (`float`, or `torch.Tensor` of shape `(P,)`): the temperature of `logprobs`, one or per position.
        banned (`torch.BoolTensor` of shape `(V,)` or `(K, V)`, *optional*): tokens out of the distribution, for
            every position or, with `banned_rows` `(P,)`, row `banned_rows[p]` of it at position `p`.
        reference (`Positions` of `P` positions, *optional*): a frozen model's at the same positions; gives `kl`.
        entropy (`bool`): compute `entropy`; with `entropy_grad` it carries grad, else it is detached.
        plain (`bool`): compute `plain_logprobs`. raw (`bool`): compute `raw_logprobs` and `raw_logprob_sums`.
    """
    count, vocab = len(inputs), inputs.vocab_size
    ids = token_ids.reshape(count).clamp(min=0)
    per_position = isinstance(temperature, torch.Tensor)
    source = inputs.hidden if inputs.logits is None else inputs.logits
    wide = torch.promote_types(source.dtype, torch.float32)
    temperature = temperature.reshape(count).to(wide) if per_position else float(temperature)
    if banned is not None:
        banned = banned.bool()
        if banned.dim() == 1:
            banned_rows = None
        elif banned_rows is None:
            raise ValueError("position_stats: a banned mask of shape (K, V) needs banned_rows (P,).")
    layer = inputs.layer
    ref_layer = None if reference is None else reference.layer
    ref_source = None if reference is None else (reference.hidden if reference.logits is None else reference.logits)

    def run(start, end, linear, need):
        # `linear`: the chunk's `h W^T + b` (or its logits, without a layer)
        z = _wide(linear if layer is None else layer.activate(linear))
        ref_z = None
        if need[2]:
            ref_hidden = ref_source[start:end]
            ref_z = _wide(ref_layer(ref_hidden) if ref_layer is not None else ref_hidden)
        mask = None if banned is None else (banned if banned_rows is None else banned[banned_rows[start:end]])
        t = temperature[start:end].unsqueeze(-1) if per_position else temperature
        return _chunk_stats(z, ref_z, ids[start:end], t, mask, need)

    weight, bias = (None, None) if layer is None else (layer.weight, layer.bias)
    step = chunk_rows(vocab)
    spans = [(start, min(start + step, count)) for start in range(0, max(count, 1), step)]
    need = (True, entropy, reference is not None, plain, raw, raw)
    wanted = tuple(i for i, n in enumerate(need) if n)
    detached = (wanted.index(1),) if entropy and not entropy_grad else ()
    values = dict(zip(wanted, _Chunked.apply(run, spans, wanted, detached, source, weight, bias)))
    return PositionStats(*(values.get(i) for i in range(len(STATS))))


def _linear(hidden, weight, bias):
    return hidden if weight is None else F.linear(hidden.to(weight.dtype), weight, bias)


class _Chunked(torch.autograd.Function):
    """`run(start, end, hidden W^T + bias, need)` over the chunks `spans` of the positions: the stats at indices
    `wanted` (of `STATS`), each concatenated over the chunks (without a `weight`, `source` holds the logits and `run`
    reads their slices).

    The forward keeps no graph. The backward makes each chunk's `h W^T + b` again, differentiates the stats that
    received a gradient (only those are made again) with respect to it, and adds that chunk's share to the gradients
    of the hidden states, the weight and the bias in place, so that a chunk's logits are all that exist at a time and
    each input gets one gradient (as DDP's hooks expect). The outputs at the positions `detached` carry no gradient."""

    @staticmethod
    def forward(ctx, run, spans, wanted, detached, source, weight, bias):
        need = tuple(i in wanted for i in range(len(STATS)))
        with torch.no_grad():
            parts = [[run(start, end, _linear(source[start:end], weight, bias), need)[i] for i in wanted]
                     for start, end in spans]
        outputs = tuple(torch.cat(column) for column in zip(*parts))
        ctx.run, ctx.spans, ctx.wanted, ctx.detached = run, spans, wanted, detached
        ctx.save_for_backward(source, weight, bias)
        ctx.mark_non_differentiable(*(outputs[i] for i in detached))
        ctx.set_materialize_grads(False)
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        source, weight, bias = ctx.saved_tensors
        need_source, need_weight, need_bias = ctx.needs_input_grad[4:]
        grad_source = torch.zeros_like(source) if need_source else None
        grad_weight = torch.zeros_like(weight) if need_weight and weight is not None else None
        grad_bias = torch.zeros_like(bias) if need_bias and bias is not None else None
        graded = {stat: grad for position, (stat, grad) in enumerate(zip(ctx.wanted, grads))
                  if grad is not None and position not in ctx.detached}
        need = tuple(i in graded for i in range(len(STATS)))
        if not graded:
            return None, None, None, None, grad_source, grad_weight, grad_bias
        for start, end in ctx.spans:
            hidden = source[start:end]
            with torch.no_grad():
                linear = _linear(hidden, weight, bias)
            with torch.enable_grad():
                linear = linear.detach().requires_grad_()
                stats = ctx.run(start, end, linear, need)
                (grad_linear,) = torch.autograd.grad([stats[i] for i in graded], [linear],
                                                     [grad[start:end] for grad in graded.values()])
            if weight is None:
                if grad_source is not None:
                    grad_source[start:end] = grad_linear
                continue
            if grad_source is not None:
                grad_source[start:end] = (grad_linear @ weight).to(source.dtype)
            if grad_weight is not None:
                grad_weight.addmm_(grad_linear.T, hidden.to(weight.dtype))
            if grad_bias is not None:
                grad_bias.add_(grad_linear.sum(dim=0).to(bias.dtype))
        return None, None, None, None, grad_source, grad_weight, grad_bias
