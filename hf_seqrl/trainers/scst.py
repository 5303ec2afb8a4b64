"""`SCSTTrainer`: self-critical sequence training (Rennie et al., 2017)."""

from __future__ import annotations

from .base import SeqRLTrainer


class SCSTTrainer(SeqRLTrainer):
    """Self-critical sequence training: the baseline of a sample is the reward of the greedy decode of its source.

    `SeqRLConfig.baseline="mean"` with `num_samples >= 2` gives the leave-one-out mean-of-samples variant
    (Kool et al., 2019; the "new self-critical" baseline of Luo, 2020).
    """

    default_baseline = "greedy"
    algorithm = "SCST"
    model_families = ("seq2seq", "causal")
