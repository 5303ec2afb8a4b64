"""Training arguments of the trainers, one module by family: `base` (what every trainer shares), `rollout` (what
every rewarded trainer shares, and the baselines the policy gradients share), `algorithms`
(`SeqRLConfig`, `MRTConfig`, `MixerConfig`), `distillation` (`DistillationConfig`), `inputs` (the input-schedule and professor-forcing configs).

Every dataclass extends `transformers.Seq2SeqTrainingArguments`, so every standard field (logging, `report_to`,
checkpoints, mixed precision, gradient accumulation, `push_to_hub`, ...) keeps working, and each field is declared
and documented once, in the class it belongs to. Rules that involve several fields are checked in `__post_init__`
with messages that name the field and the fix.
"""

from .algorithms import MixerConfig, MRTConfig, SeqRLConfig
from .base import SeqRLBaseConfig
from .distillation import DistillationConfig
from .inputs import KStepRolloutConfig, PrefixCorruptionConfig, ProfessorForcingConfig, ScheduledSamplingConfig
from .rollout import BaselineConfig, RolloutConfig

__all__ = ["BaselineConfig", "DistillationConfig", "KStepRolloutConfig", "MRTConfig", "MixerConfig", "PrefixCorruptionConfig",
           "ProfessorForcingConfig", "RolloutConfig", "ScheduledSamplingConfig", "SeqRLBaseConfig", "SeqRLConfig"]
