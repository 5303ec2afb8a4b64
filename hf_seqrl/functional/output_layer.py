"""A model's output layer as a pure map from hidden states to logits (`OutputLayer`: the output matrix, a bias, a
scale, a soft cap), and what a forward hands the vocabulary kernels of `hf_seqrl.functional.lm_head` at a set of
positions (`Positions`: the output layer's inputs and the layer, or the logits themselves when the layer is not known).
`hf_seqrl.models.heads` reads a model's `OutputLayer`. Torch only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


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

    def narrowed(self, width: int | None) -> "Positions":
        """Returns these positions over the first `width` entries of the vocabulary (a wider output layer's padding
        rows left out); themselves for `width` None."""
        if width is None:
            return self
        if self.logits is not None:
            return Positions(logits=self.logits[:, :width])
        layer = self.layer
        return Positions(self.hidden, OutputLayer(layer.weight[:width], None if layer.bias is None else layer.bias[:width],
                                                  layer.scale, layer.softcap))
