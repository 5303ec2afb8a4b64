"""`ReinforceTrainer`: REINFORCE (Williams, 1992) with a moving-average baseline by default."""

from __future__ import annotations

from .base import SeqRLTrainer


class ReinforceTrainer(SeqRLTrainer):
    """REINFORCE on sampled sequences (Williams, 1992).

    Loss: the policy gradient `-mean_i (r_i - b) * log p(y_i | x_i)`, mixed with cross-entropy by `rl_weight`
    (Ranzato et al., 2016; Paulus et al., 2017). Baseline: `SeqRLConfig.baseline`, by default `"moving_average"`,
    an exponential moving average of past batch rewards.
    """

    default_baseline = "moving_average"
    algorithm = "REINFORCE"
    model_families = ("seq2seq", "causal")
