"""The scoring pass's reductions over the vocabulary, computed from the decoder's hidden states a chunk of the
vocabulary at a time: the logits of every position for a slice of the vocabulary are made by that slice of the output
layer, folded into running log-sum-exps and sums, and freed; the backward makes them again and writes each slice's
share of the gradients from closed forms. No tensor of every position's logits ever exists, and each pass reads the
output matrix once (a chunk of positions would read it once per chunk).

Pure tensor code below `hf_seqrl.losses` (torch only); the same code runs on every device. What a model's forward
does after its output matrix (a bias, a soft cap, a scale) is held by `hf_seqrl.functional.output_layer.OutputLayer`;
`hf_seqrl.models.heads` reads it from a model. `Positions` (same module) also holds precomputed logits (a model whose
output layer is not known), in which case the chunks are column slices of them.

Banned tokens are out of the distribution as in `hf_seqrl.functional.logprobs`: their logits are set to
`finfo(float32).min` in a chunk's own copy, so their probability is exactly 0 and `0 * log 0` stays 0.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .divergences import divergence_terms
from .output_layer import Positions


# A chunk holds about this many logits (8 MiB in float32): a handful of its size is the pass's peak over the model.
CHUNK_ELEMENTS = 1 << 21
# At most this many positions go through a chunk at once (more are taken in turns), so that a chunk keeps at least
# CHUNK_ELEMENTS / MAX_POSITIONS vocabulary columns.
MAX_POSITIONS = 4096


class PositionStats(NamedTuple):
    """What `position_stats` returns, each `(P,)` in float32 (float64 for float64 logits), None where not asked.

    logprobs: log-prob of each token at its temperature, banned tokens out of the softmax (with grad).
    entropy: entropy of the temperature-1 distribution, bans applied (with grad only when asked).
    kl: `KL(p || q)` at temperature 1 to the reference's distribution `q`, bans applied to both (with grad).
    plain_logprobs: log-prob of each token at temperature 1, bans applied (with grad).
    raw_logprobs / raw_logprob_sums: log-prob of each token and the sum of the log-probs over the vocabulary at
        temperature 1 with no bans (label smoothing's two terms, with grad).
    divergence: the divergence `beta` selects between this distribution and a teacher's (both at the divergence's
        temperature, bans applied to both; `hf_seqrl.functional.divergences.generalized_jsd`), with grad.
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    plain_logprobs: torch.Tensor | None = None
    raw_logprobs: torch.Tensor | None = None
    raw_logprob_sums: torch.Tensor | None = None
    divergence: torch.Tensor | None = None


def _wide(z: torch.Tensor) -> torch.Tensor:
    """Returns `z` in float32 (bf16 / fp16 logits would round once scaled), or float64 as it is."""
    return z.to(torch.promote_types(z.dtype, torch.float32))


def _banned(z: torch.Tensor, banned: torch.Tensor | None) -> torch.Tensor:
    return z if banned is None else z.masked_fill(banned, torch.finfo(z.dtype).min)


def _banned_zero(x: torch.Tensor, banned: torch.Tensor | None) -> torch.Tensor:
    return x if banned is None else x.masked_fill(banned, 0.0)


# The stats of `position_stats`, in this order (`PositionStats`' fields).
STATS = ("logprobs", "entropy", "kl", "plain_logprobs", "raw_logprobs", "raw_logprob_sums", "divergence")


class Divergence(NamedTuple):
    """The `divergence` stat's other side: a teacher's output-layer inputs (or logits) at the same positions, the
    interpolation `beta` (0 forward KL, 1 reverse KL, between: the generalized JSD) and the temperature of both."""

    teacher: "Positions"
    beta: float = 1.0
    temperature: float = 1.0


class _LogSumExp:
    """A running `logsumexp` over the columns of chunks `(P, C)`, chunk by chunk."""

    def __init__(self, count: int, like: torch.Tensor):
        self.max = like.new_full((count,), torch.finfo(like.dtype).min)
        self.sum = like.new_zeros(count)

    def add(self, z: torch.Tensor) -> None:
        top = torch.maximum(self.max, z.max(dim=-1).values)
        self.sum = self.sum * (self.max - top).exp() + (z - top.unsqueeze(-1)).exp().sum(dim=-1)
        self.max = top

    def value(self) -> torch.Tensor:
        return self.max + self.sum.log()


class _Problem:
    """What one `position_stats` call reads, sliced per block of positions and chunk of the vocabulary."""

    def __init__(self, inputs, ids, temperature, banned, banned_rows, reference, need, divergence=None):
        self.inputs, self.ids, self.temperature, self.reference, self.need = inputs, ids, temperature, reference, need
        self.divergence = divergence
        self.banned, self.banned_rows = banned, banned_rows
        self.layer = inputs.layer
        self.vocab = inputs.vocab_size
        self.count = len(inputs)

    def linear(self, rows: slice, cols: slice, source, weight, bias) -> torch.Tensor:
        """Returns `h W^T + b` (the logits without a layer) of positions `rows`, vocabulary columns `cols`."""
        if weight is None:
            return source[rows, cols]
        return F.linear(source[rows].to(weight.dtype), weight[cols], None if bias is None else bias[cols])

    def activated(self, linear: torch.Tensor) -> torch.Tensor:
        return _wide(linear if self.layer is None else self.layer.activate(linear))

    def reference_logits(self, rows: slice, cols: slice, ref: Positions | None = None) -> torch.Tensor:
        """Returns a frozen model's logits (the KL reference's, or `ref`'s) at positions `rows`, columns `cols`."""
        ref = self.reference if ref is None else ref
        if ref.layer is None:
            return _wide(ref.logits[rows, cols])
        layer = ref.layer
        z = F.linear(ref.hidden[rows].to(layer.weight.dtype), layer.weight[cols],
                     None if layer.bias is None else layer.bias[cols])
        return _wide(layer.activate(z))

    def mask(self, rows: slice, cols: slice) -> torch.Tensor | None:
        if self.banned is None:
            return None
        if self.banned_rows is None:
            return self.banned[cols]
        return self.banned[:, cols][self.banned_rows[rows]]

    def scale(self, rows: slice):
        """Returns the temperature of positions `rows`: a float, or `(R, 1)`."""
        t = self.temperature
        return t if isinstance(t, float) else t[rows].unsqueeze(-1)

    def token_columns(self, rows: slice, cols: slice):
        """Returns `(inside (R,), column (R, 1))`: which of the positions' tokens fall in `cols`, and where."""
        ids = self.ids[rows]
        inside = (ids >= cols.start) & (ids < cols.stop)
        return inside, (ids - cols.start).clamp(0, cols.stop - cols.start - 1).unsqueeze(-1)

    def blocks(self):
        step = min(max(self.count, 1), MAX_POSITIONS)
        width = max(1, CHUNK_ELEMENTS // step)
        for start in range(0, max(self.count, 1), step):
            rows = slice(start, min(start + step, self.count))
            yield rows, [slice(v, min(v + width, self.vocab)) for v in range(0, self.vocab, width)]

    def divergence_logprobs(self, rows: slice, cols: slice, z, banned, lse_div, lse_teacher):
        """Returns the student's and the teacher's log-probs `(R, C)` at the divergence's temperature, from the
        student's logits `z` `(R, C)` and both normalizers `(R,)` at positions `rows`, columns `cols`."""
        div = self.divergence
        log_s = _banned(z / div.temperature, banned) - lse_div.unsqueeze(-1)
        zt = self.reference_logits(rows, cols, div.teacher) / div.temperature
        return log_s, _banned(zt, banned) - lse_teacher.unsqueeze(-1)


def _forward(problem: _Problem, source, weight, bias) -> tuple[list, dict]:
    """Returns the stats (a list in `STATS` order, None where not needed) and the per-position values the backward
    reads (log-sum-exps, entropy, KL)."""
    need = problem.need
    parts, saved_parts = [], []
    for rows, chunks in problem.blocks():
        count = rows.stop - rows.start
        probe = source.new_zeros(1, dtype=torch.promote_types(source.dtype, torch.float32))
        t = problem.scale(rows)
        plain_t = isinstance(t, float) and t == 1.0
        lse1, lse_t, lse_raw, lse_ref, lse_div, lse_teacher = (_LogSumExp(count, probe) for _ in range(6))
        div = problem.divergence
        plain_div = div is None or div.temperature == 1.0
        token = probe.new_zeros(count)
        total = probe.new_zeros(count)
        for cols in chunks:  # pass 1: normalizers, the tokens' logits, the sum of the logits
            z = problem.activated(problem.linear(rows, cols, source, weight, bias))
            banned = problem.mask(rows, cols)
            zb = _banned(z, banned)
            lse1.add(zb)
            if not plain_t:
                lse_t.add(_banned(z / t, banned))
            if need[4] or need[5]:
                lse_raw.add(z)
                total += z.sum(dim=-1)
            if need[2]:
                lse_ref.add(_banned(problem.reference_logits(rows, cols), banned))
            if need[6]:
                if not plain_div:
                    lse_div.add(_banned(z / div.temperature, banned))
                lse_teacher.add(_banned(problem.reference_logits(rows, cols, div.teacher) / div.temperature, banned))
            inside, column = problem.token_columns(rows, cols)
            token += torch.where(inside, z.gather(-1, column).squeeze(-1), 0.0)
        lse1 = lse1.value()
        lse_t = lse1 if plain_t else lse_t.value()
        lse_raw = lse_raw.value() if need[4] or need[5] else None
        lse_ref = lse_ref.value() if need[2] else None
        div_saved = {"lse_div": lse1 if plain_div else lse_div.value(), "lse_teacher": lse_teacher.value()} \
            if need[6] else {}
        p_z, kl, divergence, div_aux = (probe.new_zeros(count) for _ in range(4))
        if need[6]:  # pass 2 of the divergence: both normalizers known
            for cols in chunks:
                z = problem.activated(problem.linear(rows, cols, source, weight, bias))
                banned = problem.mask(rows, cols)
                log_s, log_t = problem.divergence_logprobs(rows, cols, z, banned, div_saved["lse_div"],
                                                           div_saved["lse_teacher"])
                value, aux, _ = divergence_terms(div.beta, log_s, log_t, banned)
                divergence += value
                div_aux += aux
        if need[1] or need[2]:  # pass 2: expectations under p
            for cols in chunks:
                z = problem.activated(problem.linear(rows, cols, source, weight, bias))
                banned = problem.mask(rows, cols)
                logp = _banned(z, banned) - lse1.unsqueeze(-1)
                p = logp.exp()
                p_z += (p * _banned_zero(z, banned)).sum(dim=-1)
                if need[2]:  # sum p (log p - log q) term by term: exactly 0 where the reference is the policy
                    logq = problem.reference_logits(rows, cols) - lse_ref.unsqueeze(-1)
                    kl += (p * _banned_zero(logp - logq, banned)).sum(dim=-1)
        scaled_token = token if plain_t else token / (t if isinstance(t, float) else t.squeeze(-1))
        stats = [scaled_token - lse_t, lse1 - p_z if need[1] else None,
                 kl if need[2] else None, token - lse1 if need[3] else None,
                 token - lse_raw if need[4] else None,
                 total - problem.vocab * lse_raw if need[5] else None, divergence if need[6] else None]
        parts.append(stats)
        saved_parts.append({"lse1": lse1, "lse_t": lse_t, "lse_raw": lse_raw, "lse_ref": lse_ref,
                            "entropy": stats[1], "kl": stats[2], "lse_div": div_saved.get("lse_div"),
                            "lse_teacher": div_saved.get("lse_teacher"), "divergence": stats[6],
                            "div_aux": div_aux if need[6] else None})
    stats = [None if parts[0][i] is None else torch.cat([part[i] for part in parts]) for i in range(len(STATS))]
    saved = {key: None if saved_parts[0][key] is None else torch.cat([part[key] for part in saved_parts])
             for key in saved_parts[0]}
    return stats, saved


def _logits_gradient(problem: _Problem, rows: slice, cols: slice, z, grads: dict, saved: dict):
    """Returns `d(sum_k g_k . stat_k) / dz` on the chunk `z` `(R, C)` of positions `rows`, columns `cols`, from the
    closed forms (`p = softmax` over the allowed tokens, `p_T` at the temperature, `p_raw` with no bans):
    log-prob `(onehot - p_T) / T`, plain log-prob `onehot - p`, entropy `-p (log p + H)`, KL
    `p (log p - log q - KL)`, raw log-prob `onehot - p_raw`, raw sum `1 - V p_raw`; the divergence at temperature
    `tau` (`p_s`, `p_t` at `tau`): forward KL `(p_s - p_t) / tau`, reverse KL `p_s (log p_s - log p_t - D) / tau`,
    generalized JSD `(1 - beta) p_s (log p_s - log m - KL(p_s || m)) / tau`."""
    banned = problem.mask(rows, cols)
    at = lambda key: saved[key][rows].unsqueeze(-1)  # noqa: E731
    g = {k: v[rows].unsqueeze(-1) for k, v in grads.items()}
    t = problem.scale(rows)
    gradient = torch.zeros_like(z)
    onehot = z.new_zeros(z.shape[0], 1)  # the coefficient of the token's own column
    if "logprobs" in g:
        p_t = (_banned(z / t, banned) - at("lse_t")).exp()
        gradient -= g["logprobs"] * p_t / t
        onehot = onehot + g["logprobs"] / t
    if any(k in g for k in ("plain_logprobs", "entropy", "kl")):
        logp = _banned(z, banned) - at("lse1")
        p = logp.exp()
        if "plain_logprobs" in g:
            gradient -= g["plain_logprobs"] * p
            onehot = onehot + g["plain_logprobs"]
        if "entropy" in g:
            gradient -= g["entropy"] * p * (_banned_zero(logp, banned) + at("entropy"))
        if "kl" in g:
            logq = _banned(problem.reference_logits(rows, cols), banned) - at("lse_ref")
            gradient += g["kl"] * p * (_banned_zero(logp - logq, banned) - at("kl"))
    if "divergence" in g:
        div = problem.divergence
        log_s, log_t = problem.divergence_logprobs(rows, cols, z, banned, saved["lse_div"][rows],
                                                   saved["lse_teacher"][rows])
        ps = log_s.exp()
        if div.beta == 0.0:
            share = ps - log_t.exp()
        elif div.beta == 1.0:
            share = ps * (_banned_zero(log_s - log_t, banned) - at("divergence"))
        else:
            log_m = torch.logaddexp(log_s + math.log(1 - div.beta), log_t + math.log(div.beta))
            share = (1 - div.beta) * ps * (_banned_zero(log_s - log_m, banned) - at("div_aux"))
        gradient += g["divergence"] * share / div.temperature
    if "raw_logprobs" in g or "raw_logprob_sums" in g:
        p_raw = (z - at("lse_raw")).exp()
        if "raw_logprobs" in g:
            gradient -= g["raw_logprobs"] * p_raw
            onehot = onehot + g["raw_logprobs"]
        if "raw_logprob_sums" in g:
            gradient += g["raw_logprob_sums"] * (1 - problem.vocab * p_raw)
    inside, column = problem.token_columns(rows, cols)
    gradient.scatter_add_(-1, column, torch.where(inside.unsqueeze(-1), onehot, 0.0))
    return gradient


class _VocabularyChunks(torch.autograd.Function):
    """The stats at indices `wanted` (of `STATS`) of a `_Problem`, a chunk of the vocabulary at a time (see the module).

    The forward keeps no graph, only per-position values (log-sum-exps, entropy, KL). The backward makes each chunk's
    logits again, takes their gradient from the closed forms (`_logits_gradient`), carries it through what the forward
    does after the output matrix (scale, soft cap), and writes the chunk's columns of the weight's and the bias's
    gradients and adds its share of the hidden states' gradient: each input gets one gradient (as DDP's hooks expect).
    The outputs at the positions `detached` carry no gradient."""

    @staticmethod
    def forward(ctx, problem, wanted, detached, source, weight, bias):
        with torch.no_grad():
            stats, saved = _forward(problem, source, weight, bias)
        outputs = tuple(stats[i] for i in wanted)
        ctx.problem, ctx.wanted, ctx.detached, ctx.saved = problem, wanted, detached, saved
        ctx.save_for_backward(source, weight, bias)
        ctx.mark_non_differentiable(*(outputs[i] for i in detached))
        ctx.set_materialize_grads(False)
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        source, weight, bias = ctx.saved_tensors
        problem = ctx.problem
        need_source, need_weight, need_bias = ctx.needs_input_grad[3:]
        grad_source = torch.zeros_like(source) if need_source else None
        grad_weight = torch.zeros_like(weight) if need_weight and weight is not None else None
        grad_bias = torch.zeros_like(bias) if need_bias and bias is not None else None
        graded = {STATS[stat]: grad for position, (stat, grad) in enumerate(zip(ctx.wanted, grads))
                  if grad is not None and position not in ctx.detached}
        if not graded or not any((need_source, need_weight, need_bias)):
            return None, None, None, grad_source, grad_weight, grad_bias
        for rows, chunks in problem.blocks():
            hidden = source[rows]
            for cols in chunks:
                with torch.no_grad():
                    linear = problem.linear(rows, cols, source, weight, bias)
                with torch.enable_grad():
                    linear = linear.detach().requires_grad_()
                    z = problem.activated(linear)
                    with torch.no_grad():
                        gradient = _logits_gradient(problem, rows, cols, z, graded, ctx.saved)
                    (grad_linear,) = torch.autograd.grad(z, linear, gradient)
                if weight is None:
                    if grad_source is not None:
                        grad_source[rows, cols] = grad_linear.to(source.dtype)
                    continue
                if grad_source is not None:
                    grad_source[rows] += (grad_linear @ weight[cols]).to(source.dtype)
                if grad_weight is not None:
                    grad_weight[cols] += grad_linear.T @ hidden.to(weight.dtype)
                if grad_bias is not None:
                    grad_bias[cols] += grad_linear.sum(dim=0).to(bias.dtype)
        return None, None, None, grad_source, grad_weight, grad_bias


def position_stats(
    inputs: Positions, token_ids: torch.Tensor, temperature: float | torch.Tensor = 1.0,
    banned: torch.Tensor | None = None, banned_rows: torch.Tensor | None = None, *,
    reference: Positions | None = None, entropy: bool = False, entropy_grad: bool = False, plain: bool = False,
    raw: bool = False, divergence: Divergence | None = None,
) -> PositionStats:
    """Returns the scoring pass's reductions at `P` positions, a chunk of the vocabulary at a time (see the module).

    Under autograd the backward makes each chunk's logits again: the graph holds the hidden states, the output layer
    and a few numbers per position, never the logits.

    Args:
        inputs (`Positions` of `P` positions): the policy's hidden states and output layer (or logits).
        token_ids (`torch.LongTensor` of shape `(P,)`): the token scored at each position (negative read as 0).
        temperature (`float`, or `torch.Tensor` of shape `(P,)`): the temperature of `logprobs`, one or per position.
        banned (`torch.BoolTensor` of shape `(V,)` or `(K, V)`, *optional*): tokens out of the distribution, for
            every position or, with `banned_rows` `(P,)`, row `banned_rows[p]` of it at position `p`.
        reference (`Positions` of `P` positions, *optional*): a frozen model's at the same positions; gives `kl`.
        entropy (`bool`): compute `entropy`; with `entropy_grad` it carries grad, else it is detached.
        plain (`bool`): compute `plain_logprobs`. raw (`bool`): compute `raw_logprobs` and `raw_logprob_sums`.
        divergence (`Divergence`, *optional*): a teacher at the same positions; gives `divergence`.
    """
    count = len(inputs)
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
    weight, bias = (None, None) if layer is None else (layer.weight, layer.bias)
    need = (True, entropy, reference is not None, plain, raw, raw, divergence is not None)
    wanted = tuple(i for i, n in enumerate(need) if n)
    detached = (wanted.index(1),) if entropy and not entropy_grad else ()
    problem = _Problem(inputs, ids, temperature, banned, banned_rows, reference, need, divergence)
    values = dict(zip(wanted, _VocabularyChunks.apply(problem, wanted, detached, source, weight, bias)))
    return PositionStats(*(values.get(i) for i in range(len(STATS))))
