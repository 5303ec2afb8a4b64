"""The rewarded trainers: each picks an objective (`hf_seqrl.objectives`) for `RolloutTrainer` to run, and keeps the
name, constructor and config users know it by. Their defaults (config, baseline, dropout, whether they need rewards
or a teacher, the model families) are the objective's record."""

from __future__ import annotations

from ..objectives.best_of_n import BestOfN
from ..objectives.distillation import Distillation
from ..objectives.minimum_risk import MinimumRisk
from ..objectives.mixer import Mixer
from ..objectives.policy_gradient import REINFORCE, SCST, PolicyGradient
from .rollout import RolloutTrainer


class SeqRLTrainer(RolloutTrainer):
    """The policy gradient (`objectives.policy_gradient.PolicyGradient`) with any baseline of `SeqRLConfig` (default
    greedy): SCST, REINFORCE, leave-one-out (`baseline="mean"`), clipped multi-update steps (`num_iterations > 1`),
    GSPO (`importance_sampling_level="sequence"`). Same constructor as `Seq2SeqTrainer` plus `reward_funcs`; logs
    and cards name the algorithm its baseline makes of it."""

    objective_class = PolicyGradient


class SCSTTrainer(RolloutTrainer):
    """Self-critical sequence training (Rennie et al., 2017).

    Loss: the policy gradient `-mean_i (r_i - b_i) * log p(y_i | x_i)` over sampled sequences, mixed with
    cross-entropy by `rl_weight`. Baseline: `b_i` is the reward of the greedy decode of the sample's source.
    `SeqRLConfig.baseline="mean"` with `num_samples >= 2` gives the leave-one-out mean-of-samples baseline instead
    (Kool et al., 2019; the "new self-critical" baseline of Luo, 2020), which logs and cards name as such.
    """

    objective_class, defaults = PolicyGradient, SCST


class ReinforceTrainer(RolloutTrainer):
    """REINFORCE on sampled sequences (Williams, 1992).

    Loss: the policy gradient `-mean_i (r_i - b) * log p(y_i | x_i)`, mixed with cross-entropy by `rl_weight`
    (Ranzato et al., 2016; Paulus et al., 2017). Baseline: `SeqRLConfig.baseline`, by default `"moving_average"`,
    an exponential moving average of past batch rewards.
    """

    objective_class, defaults = PolicyGradient, REINFORCE


class MRTTrainer(RolloutTrainer):
    """Minimum risk training (Shen et al., 2016; Edunov et al., 2018).

    Loss: the expected cost `1 - reward` under `Q ∝ p(y|x)^α`, renormalized over a candidate set per source
    (samples, optionally the greedy decode and the reference; duplicates counted once), mixed with cross-entropy by
    `rl_weight`. Baseline: none (the renormalization over candidates plays its part).

    `args` is an `MRTConfig`. Logs `mrt/risk`, `mrt/q_entropy`, `mrt/distinct_candidates` and the `rl/*` metrics of
    the samples (reward, length, entropy, KL, cross-entropy).
    """

    objective_class = MinimumRisk


class MixerTrainer(RolloutTrainer):
    """MIXER (Ranzato et al., 2016): cross-entropy on the first `T - Δ` gold tokens of each target and REINFORCE on
    the model's continuation of that prefix, rewarded as a whole sequence; Δ grows by `mixer_delta` every
    `mixer_increment_steps` optimizer steps. Any baseline of `BaselineConfig` (default: moving average); with Δ at
    least the target length the loss is exactly `ReinforceTrainer`'s. Logs `mixer/delta` and
    `mixer/prefix_fraction` (the teacher-forced share of the targets) next to the `rl/*` metrics.
    """

    objective_class = Mixer


class DistillationTrainer(RolloutTrainer):
    """On-policy distillation and knowledge distillation from a teacher with the student's tokenizer.

    Loss: the divergence `beta` selects between the student's and the teacher's next-token distributions, averaged
    over the counted tokens of the student's samples (on-policy steps) or of the gold / teacher targets, mixed with
    cross-entropy by `rl_weight`; with `reward_funcs` the policy gradient of that reward is added (its baseline from
    `baseline`). `teacher_model` (a model, a Hub id or a folder of the student's family) is required and
    `reward_funcs` optional. `args` is a `DistillationConfig`. Logs `distill/divergence`, `distill/on_policy`, the
    student's samples' `rl/sample_length`, `rl/frac_truncated` (and the other `rl/*` metrics of `sample_metrics`) on
    on-policy steps and, with the sampled estimator, `rl/teacher_logprob` and `distill/reverse_kl`; with
    `log_completions`, the sample log holds the student's samples (with their rewards when a reward is given).
    """

    objective_class = Distillation


class BestOfNTrainer(RolloutTrainer):
    """Best-of-n self-training (RAFT, Dong et al., 2023; ReST, Gulcehre et al., 2023): each source's `num_samples`
    samples ranked by the reward (QE fine-tuning with a reference-free one) or by MBR's expected utility, the best
    trained on by cross-entropy, above `best_of_n_threshold` when set. `args` is a `BestOfNConfig`."""

    objective_class = BestOfN
