"""`SCSTTrainer`: self-critical sequence training (Rennie et al., 2017)."""

from __future__ import annotations

from .base import SeqRLTrainer


class SCSTTrainer(SeqRLTrainer):
    """Self-critical sequence training (Rennie et al., 2017).

    Loss: the policy gradient `-mean_i (r_i - b_i) * log p(y_i | x_i)` over sampled sequences, mixed with
    cross-entropy by `rl_weight`. Baseline: `b_i` is the reward of the greedy decode of the sample's source.
    `SeqRLConfig.baseline="mean"` with `num_samples >= 2` gives the leave-one-out mean-of-samples baseline instead
    (Kool et al., 2019; the "new self-critical" baseline of Luo, 2020), which logs and cards name as such.
    """

    default_baseline = "greedy"
    algorithm = "SCST"
    model_families = ("seq2seq", "causal")
