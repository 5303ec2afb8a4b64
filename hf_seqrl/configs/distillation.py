"""`DistillationConfig`: the arguments of `DistillationTrainer` (a student trained toward a teacher's next-token
distributions, on its own samples or on given targets), on top of `BaselineConfig` (a sequence reward may join)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .base import Range, check_choice
from .rollout import BaselineConfig

ESTIMATORS = ("full", "sampled")


@dataclass
class DistillationConfig(BaselineConfig):
    r"""
    Arguments of [`DistillationTrainer`], on top of [`BaselineConfig`] (the baselines apply to a sequence reward given
    with `reward_funcs`; without one they are unused). TRL's names where TRL has the concept. The teacher itself is a
    trainer argument, `teacher_model` (loaded with `teacher_model_init_kwargs`, a [`RolloutConfig`] field).

    lmbda (`float`, *optional*, defaults to `1.0`):
        The share of optimizer steps that train on the student's own samples (on-policy; GKD's λ). The other steps
        train on the gold targets, or with `seq_kd` on the teacher's decodes. Each optimizer step draws once, from the
        seed and the step (every process draws alike, a resumed run draws what the uninterrupted run drew).
        1: fully on-policy; 0: word-level knowledge distillation on gold prefixes (with `beta=0`).
    beta (`float`, *optional*, defaults to `1.0`):
        The divergence between the student's and the teacher's next-token distributions at each position: 0 the
        forward `KL(teacher || student)`, 1 the reverse `KL(student || teacher)`, between the generalized
        Jensen-Shannon divergence with mixture `(1 - beta) p_student + beta p_teacher` (TRL's convention;
        `hf_seqrl.functional.divergences.generalized_jsd`). Both distributions are taken at `temperature` (the
        rollouts' too).
    seq_kd (`bool`, *optional*, defaults to `False`):
        Off-policy steps train on the teacher's beam decodes (`seq_kd_num_beams`) instead of the gold targets
        (sequence-level knowledge distillation, Kim & Rush, 2016).
    seq_kd_num_beams (`int`, *optional*, defaults to `4`):
        Beam width of the teacher's decodes with `seq_kd`.
    divergence_estimator (`str`, *optional*, defaults to `"full"`):
        `"full"`: the divergence summed over the whole vocabulary at each position (GKD), from the output layer a
        slice of the vocabulary at a time. `"sampled"`: the reverse KL estimated at the student's own sampled tokens,
        as a policy gradient whose per-token advantage is `-(log p_student - log p_teacher)`
        (`hf_seqrl.functional.divergences.reverse_kl_advantages`; the on-policy distillation recipes' form); needs
        `beta=1` and `lmbda=1` (it is unbiased on the student's own samples only).
    token_reward_to_go (`bool`, *optional*, defaults to `False`, a [`BaselineConfig`] field):
        With `divergence_estimator="sampled"`, each token's advantage sums the log-ratios from it to the end of the
        sample: its expectation is then the exact gradient of the sequence-level reverse KL. `False` keeps each
        token's own log-ratio (the prefixes' distribution held fixed; lower variance).

    The loss is `rl_weight * D + (1 - rl_weight) * XE` with `D` the mean divergence per counted token (plus, with
    `reward_funcs`, the policy gradient of the sequence reward), minus the entropy bonus and plus the KL to the
    initial model as [`RolloutConfig`] sets them. Word-level KD mixed with cross-entropy (Kim & Rush, 2016):
    `lmbda=0, beta=0, rl_weight=0.5`.
    """

    lmbda: float = field(default=1.0, metadata={"help": "Share of optimizer steps on the student's own samples."})
    beta: float = field(default=1.0, metadata={"help": "0 forward KL, 1 reverse KL, between: generalized JSD."})
    seq_kd: bool = field(default=False, metadata={"help": "Off-policy steps train on the teacher's beam decodes."})
    seq_kd_num_beams: int = field(default=4, metadata={"help": "Beam width of the teacher's decodes (seq_kd)."})
    divergence_estimator: str = field(default="full", metadata={
        "help": "full (over the vocabulary) | sampled (reverse KL at the sampled tokens, as a policy gradient)."})

    FIELD_RANGES = {"lmbda": Range(0, 1), "beta": Range(0, 1), "seq_kd_num_beams": Range(1)}

    def __post_init__(self):
        super().__post_init__()
        name = type(self).__name__
        check_choice(self, "divergence_estimator", ESTIMATORS)
        if self.divergence_estimator == "sampled" and (self.beta != 1.0 or self.lmbda != 1.0):
            raise ValueError(
                f"{name}.divergence_estimator='sampled' estimates the reverse KL at the student's own samples: it "
                f"needs beta=1.0 and lmbda=1.0 (got beta={self.beta}, lmbda={self.lmbda}). Use "
                "divergence_estimator='full' for other divergences or off-policy steps.")
        if self.seq_kd and self.lmbda == 1.0:
            raise ValueError(f"{name}.seq_kd=True trains the off-policy steps on the teacher's decodes, but "
                             "lmbda=1.0 leaves none: lower lmbda (0 for sequence-level KD alone).")
