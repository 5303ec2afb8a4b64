"""The empirical Jacobian: how much a small error in the decoder's input at one position grows downstream.

Teacher forcing trains the one-step error and leaves the amplification of earlier errors unconstrained: with
`e_{k+1} ≈ J e_k + δ`, a model whose `J` exceeds 1 turns a small early mistake into a large late one. This measures
`J` empirically on the model's own greedy output: the decoder input embedding at position `k` gets a perturbation
`ε` of norm `epsilon · ‖embedding_k‖` (a random direction), the decoder re-runs on the same tokens, and
`divergence(h) = ‖Δ hidden_{k+h}‖ / ‖ε‖` is taken on its last hidden states for `h = 0 … horizon` (as long as the
output runs). The per-step growth factor is the geometric mean of `divergence(h) / divergence(h − 1)` over every
step of every (example, k): above 1 an error grows as decoding goes on, below 1 it fades.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..models import family_for


def growth_factor(log_divergence: torch.Tensor, valid: torch.Tensor) -> float | None:
    """Returns the geometric mean of `divergence(h) / divergence(h − 1)` over consecutive valid steps, or None.

    Args:
        log_divergence (`torch.Tensor` of shape `(N, H + 1)`): log divergence at offsets `h = 0 … H` of N curves.
        valid (`torch.Tensor` of shape `(N, H + 1)`, bool): where a curve has a value.
    """
    steps = valid[:, 1:] & valid[:, :-1]
    if not steps.any():
        return None
    ratios = (log_divergence[:, 1:] - log_divergence[:, :-1])[steps]
    return math.exp(float(ratios.double().mean()))


def perturbation_directions(shape: tuple[int, ...], generator: torch.Generator | None = None) -> torch.Tensor:
    """Returns random unit vectors of shape `shape` (normalised over the last dimension)."""
    directions = torch.randn(shape, generator=generator, dtype=torch.float64)
    return directions / directions.norm(dim=-1, keepdim=True)


class JacobianTotals:
    """Log divergence curves of every (example, position k), gathered over batches and summarised by `report`."""

    def __init__(self, positions: Sequence[int], horizon: int, epsilon: float):
        self.positions, self.horizon, self.epsilon = list(positions), horizon, epsilon
        self.curves: list[torch.Tensor] = []  # (N, H + 1) log divergence
        self.valid: list[torch.Tensor] = []  # (N, H + 1)

    def add(self, log_divergence: torch.Tensor, valid: torch.Tensor) -> None:
        """Adds the curves of a batch (shapes as `growth_factor`)."""
        self.curves.append(log_divergence.double().cpu())
        self.valid.append(valid.cpu())

    def report(self) -> dict:
        """Returns the `jacobian` section: settings, mean divergence per offset `h`, and the growth factor."""
        section = dict(epsilon=self.epsilon, positions=self.positions, horizon=self.horizon, curve=[],
                       growth_factor=None)
        if not self.curves:
            return section
        curves, valid = torch.cat(self.curves), torch.cat(self.valid)
        for h in range(curves.shape[1]):
            count = int(valid[:, h].sum())
            if count:
                mean = float(curves[:, h][valid[:, h]].exp().mean())
                section["curve"].append(dict(h=h, count=count, divergence=mean))
        section["growth_factor"] = growth_factor(curves, valid)
        return section


@torch.no_grad()
def jacobian_curves(model, enc: dict, encoded, tokens: torch.Tensor, lengths: torch.Tensor, positions: Sequence[int],
                    horizon: int, epsilon: float, generator: torch.Generator | None = None):
    """Returns `(log_divergence, valid)` of shape `(B * K, horizon + 1)`, rows ordered source-major over the `K`
    positions: the log of `‖Δ hidden_{k+h}‖ / ‖ε‖` when the decoder input embedding at position `k` is perturbed.

    Args:
        model: a `PreTrainedModel` in eval mode; `encoded` its family's `encode` of `enc`.
        tokens (`torch.LongTensor` of shape `(B, T)`): the model's own greedy output (decoder start stripped).
        lengths (`torch.LongTensor` of shape `(B,)`): tokens of each output, EOS included.
        positions: decoder input positions `k` to perturb (0 is the decoder start token, or the last prompt token of
            a causal model; `k` reads output token `k - 1`).
        horizon (`int`): offsets `h = 0 … horizon` after `k` measured.
        epsilon (`float`): norm of the perturbation as a fraction of the embedding's norm at `k`.
    """
    batch, length = tokens.shape
    k_count = len(positions)
    family = family_for(model)
    embeddings = family.input_embeddings(model)
    offset = family.target_offset(encoded)  # where target position 0's input sits in the embedded rows
    captured = {}

    def capture(module, args, output):
        captured["clean"] = output

    handle = embeddings.register_forward_hook(capture)
    try:
        clean = family.target_forward(model, encoded, tokens, output_hidden_states=True).hidden_states.double()
    finally:
        handle.remove()
    at = torch.tensor(positions, device=tokens.device).clamp(max=length - 1)
    base = captured["clean"][:, offset:offset + length].double()  # (B, T, d) as the decoder reads them
    norms = base[:, at].norm(dim=-1)  # (B, K)
    delta = torch.zeros(batch, k_count, length, base.shape[-1], dtype=torch.float64, device=tokens.device)
    directions = perturbation_directions((batch, k_count, base.shape[-1]), generator).to(tokens.device)
    eps_norm = epsilon * norms  # (B, K)
    delta[:, torch.arange(k_count), at] = directions * eps_norm.unsqueeze(-1)

    def perturb(module, args, output):
        shift = torch.nn.functional.pad(delta.flatten(0, 1), (0, 0, offset, output.shape[1] - offset - length))
        return output + shift.to(output.dtype)

    handle = embeddings.register_forward_hook(perturb)
    try:
        perturbed = family.target_forward(model, encoded, tokens.repeat_interleave(k_count, dim=0), group=k_count,
                                          output_hidden_states=True).hidden_states.double()
    finally:
        handle.remove()
    offsets = at.view(1, k_count, 1) + torch.arange(horizon + 1, device=tokens.device).view(1, 1, -1)  # (1, K, H+1)
    index = offsets.clamp(max=length - 1).expand(batch, -1, -1)
    diff = (perturbed.view(batch, k_count, length, -1) - clean.unsqueeze(1)).norm(dim=-1)  # (B, K, T)
    divergence = diff.gather(2, index) / eps_norm.unsqueeze(-1).clamp(min=1e-300)
    inside = torch.tensor(positions, device=tokens.device).view(1, k_count, 1) < length
    valid = (offsets < lengths.view(batch, 1, 1)) & inside & (eps_norm.unsqueeze(-1) > 0) & (divergence > 0)
    return divergence.clamp(min=1e-300).log().flatten(0, 1), valid.flatten(0, 1)
