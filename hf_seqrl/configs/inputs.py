"""The configs of the trainers that train with cross-entropy on changed decoder inputs (scheduled sampling, prefix
corruption and noise-level forcing, k-step rollout) and of professor forcing."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..schedules import SCHEDULES
from .base import MAX_NEW_TOKENS_RANGE, Range, SeqRLBaseConfig, check_choice, max_new_tokens_field

SAMPLING = ("argmax", "sample")
SCHEDULE_UNITS = ("step", "epoch")
REPLACEMENTS = ("random", "model")
ROLLOUT_CONTEXTS = ("exact", "shared_row")


@dataclass
class OwnTokensConfig(SeqRLBaseConfig):
    r"""
    How a trainer that feeds the model its own tokens picks them, on top of [`SeqRLBaseConfig`].

    sampling (`str`, *optional*, defaults to `"argmax"`):
        `"argmax"` (the model's likeliest token) or `"sample"` (a token drawn from its distribution).
    """

    sampling: str = field(default="argmax", metadata={"help": "argmax | sample: how the model's own tokens are "
                                                              "picked."})

    def __post_init__(self):
        super().__post_init__()
        check_choice(self, "sampling", SAMPLING)


@dataclass
class ScheduleConfig(OwnTokensConfig):
    r"""
    The schedule of a trainer's mixing rate over training, on top of [`OwnTokensConfig`]; each trainer says what its
    rate is.

    schedule (`str`, *optional*, defaults to `"linear"`):
        `"linear"`, `"exponential"`, `"inverse_sigmoid"` or `"constant"`: the teacher-forcing ratio ε(s) of
        `hf_seqrl.schedules.teacher_forcing_ratio`.
    schedule_k (`float`, *optional*, defaults to `1000.0`):
        Time constant k of the schedule, in `schedule_unit`s, counted after the warm-up.
    schedule_unit (`str`, *optional*, defaults to `"step"`):
        `"step"` (optimizer steps) or `"epoch"`.
    """

    schedule: str = field(default="linear", metadata={"help": "linear | exponential | inverse_sigmoid | constant"})
    schedule_k: float = field(default=1000.0, metadata={"help": "Time constant of the schedule."})
    schedule_unit: str = field(default="step", metadata={"help": "step | epoch"})

    FIELD_RANGES = {"schedule_k": Range(0, low_open=True)}

    def __post_init__(self):
        super().__post_init__()
        name = type(self).__name__
        check_choice(self, "schedule", SCHEDULES)
        if self.schedule == "inverse_sigmoid" and self.schedule_k < 1:
            raise ValueError(f"{name}.schedule_k must be >= 1 for the inverse_sigmoid schedule, got {self.schedule_k}.")
        check_choice(self, "schedule_unit", SCHEDULE_UNITS)


@dataclass
class ScheduledSamplingConfig(ScheduleConfig):
    r"""
    Arguments of [`ScheduledSamplingTrainer`]: [`ScheduleConfig`] (how the teacher-forcing ratio ε, the probability
    of feeding the gold token, decays) and [`OwnTokensConfig`] (how pass 1 picks the model's token), plus:

    min_teacher_forcing_ratio (`float`, *optional*, defaults to `0.5`):
        Lower bound of ε (the constant schedule's value).
    """

    min_teacher_forcing_ratio: float = field(default=0.5, metadata={"help": "Lower bound of the ratio."})

    FIELD_RANGES = {"min_teacher_forcing_ratio": Range(0, 1)}


@dataclass
class PrefixCorruptionConfig(ScheduleConfig):
    r"""
    Arguments of [`PrefixCorruptionTrainer`] (prefix corruption and noise-level forcing): [`ScheduleConfig`] and
    [`OwnTokensConfig`] (with `replacement="model"`, how the model's token is picked), plus the fields below.

    The loss is always the cross-entropy of the gold next token; only the decoder inputs are corrupted. The start
    token and padding are never corrupted. The corruption rate σ ramps up over time s as σ = corruption_rate ·
    (1 − ε(s)), ε being the schedule's teacher-forcing ratio with a lower bound of 0: `"constant"` (the default
    here): σ = corruption_rate; `"linear"`: σ = corruption_rate · min(1, s/k); `"exponential"`:
    σ = corruption_rate · (1 − e^(−s/k)); `"inverse_sigmoid"`: σ = corruption_rate · e^(s/k) / (k + e^(s/k)).

    corruption_rate (`float`, *optional*, defaults to `0.15`):
        σ_max in [0, 1]: the probability of corrupting each decoder input once the schedule has ramped up. With
        `per_token_levels`, the upper end of the per-token levels' range.
    replacement (`str`, *optional*, defaults to `"random"`):
        What a corrupted input becomes: `"random"` (a token drawn uniformly from the vocabulary minus pad, EOS, the
        decoder start token and the tokenizer's special tokens; one parallel pass) or `"model"` (the model's own
        prediction at that position from a no-grad teacher-forced pass; two passes, as in scheduled sampling).
    per_token_levels (`bool`, *optional*, defaults to `False`):
        Noise-level forcing: every position of every sequence draws its own level σ_t ~ U(0, σ), then is corrupted
        with probability σ_t (so each input with probability σ/2, independently). `False` corrupts every input with
        probability σ.
    """

    schedule: str = field(default="constant", metadata={"help": "constant | linear | exponential | inverse_sigmoid"})
    corruption_rate: float = field(default=0.15, metadata={"help": "σ: probability of corrupting a decoder input."})
    replacement: str = field(default="random", metadata={"help": "random | model"})
    per_token_levels: bool = field(default=False, metadata={"help": "Noise-level forcing: σ_t ~ U(0, σ) per token."})

    FIELD_RANGES = {"corruption_rate": Range(0, 1)}

    def __post_init__(self):
        super().__post_init__()
        check_choice(self, "replacement", REPLACEMENTS)


@dataclass
class KStepRolloutConfig(OwnTokensConfig):
    r"""
    Arguments of [`KStepRolloutTrainer`], on top of [`OwnTokensConfig`] (how the model's own tokens are picked).

    From anchors every k positions the decoder continues the gold prefix on its own tokens for k positions, each
    trained with the cross-entropy of the gold token, then re-anchors on the gold prefix.

    rollout_steps (`int`, *optional*, defaults to `4`):
        k ≥ 1: positions per anchor. The anchor position is predicted from the gold prefix, the next k − 1 after
        1 .. k − 1 of the model's own tokens. `1` is teacher forcing exactly.
    rollout_context (`str`, *optional*, defaults to `"exact"`):
        `"exact"`: every chunk sees the gold prefix up to its anchor, then its own tokens (one decoder row per
        anchor). `"shared_row"`: a cheaper approximation with one row per source, where a chunk also sees the
        model's tokens of the earlier chunks, and only anchor inputs are gold (see docs/math.md).
    """

    rollout_steps: int = field(default=4, metadata={"help": "k: positions per anchor (1 = teacher forcing)."})
    rollout_context: str = field(default="exact", metadata={"help": "exact | shared_row"})

    FIELD_RANGES = {"rollout_steps": Range(1)}

    def __post_init__(self):
        super().__post_init__()
        check_choice(self, "rollout_context", ROLLOUT_CONTEXTS)


@dataclass
class ProfessorForcingConfig(OwnTokensConfig):
    r"""
    Arguments of [`ProfessorForcingTrainer`]: [`OwnTokensConfig`] (how the model writes its free-running outputs),
    plus:

    max_new_tokens (`int`, *optional*, defaults to `None`):
        Length limit of the sequences the model writes during training; `None` takes `generation_max_length`, then
        the model's default.
    adversarial_weight (`float`, *optional*, defaults to `1.0`):
        The model's loss is `cross-entropy + adversarial_weight * adversarial loss` (Lamb et al., 2016).
    discriminator (`str`, *optional*, defaults to `"gru"`):
        `"gru"` (a bidirectional GRU) or `"transformer"` (one transformer encoder layer) over the decoder's last
        hidden states, mean-pooled over the positions of each sequence to one logit.
    discriminator_hidden_size (`int`, *optional*, defaults to `128`):
        Width of the discriminator.
    discriminator_learning_rate (`float`, *optional*, defaults to `1e-4`):
        Learning rate of the discriminator's own Adam optimizer (one update per training batch).
    """

    max_new_tokens: int | None = max_new_tokens_field()
    adversarial_weight: float = field(default=1.0, metadata={"help": "Weight of the adversarial loss."})
    discriminator: str = field(default="gru", metadata={"help": "gru | transformer"})
    discriminator_hidden_size: int = field(default=128, metadata={"help": "Width of the discriminator."})
    discriminator_learning_rate: float = field(default=1e-4, metadata={"help": "Discriminator learning rate."})

    FIELD_RANGES = {"adversarial_weight": Range(0), "discriminator_hidden_size": Range(1),
                    "discriminator_learning_rate": Range(0, low_open=True), **MAX_NEW_TOKENS_RANGE}

    def __post_init__(self):
        super().__post_init__()
        check_choice(self, "discriminator", ("gru", "transformer"))
