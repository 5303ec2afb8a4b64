"""Trainers of hf-seqrl (all `transformers.Seq2SeqTrainer` subclasses), by family of idea: `base` (shared
orchestration), `cross_entropy` (`CrossEntropyTrainer`: plain cross-entropy), `rollout` (`RolloutTrainer`: what every
rewarded trainer shares), `policy_gradient` (baselines and advantages; SCST, REINFORCE, leave-one-out; `reuse`:
clipped multi-update steps), `mrt`, `mixer`, `distillation` (`DistillationTrainer`: a student toward a teacher),
`input_schedules` and `scheduled_sampling`, `professor_forcing`."""

from .base import SeqRLBaseTrainer
from .cross_entropy import CrossEntropyTrainer
from .distillation import DistillationTrainer
from .input_schedules import KStepRolloutTrainer, PrefixCorruptionTrainer
from .mixer import MixerTrainer
from .mrt import MRTTrainer
from .policy_gradient import ReinforceTrainer, SCSTTrainer, SeqRLTrainer
from .professor_forcing import ProfessorForcingTrainer
from .rollout import RolloutTrainer
from .scheduled_sampling import ScheduledSamplingTrainer

# Every trainer `hf-seqrl train --algorithm` runs, by its `algorithm_id`.
TRAINER_CLASSES = (SCSTTrainer, ReinforceTrainer, MRTTrainer, MixerTrainer, DistillationTrainer, CrossEntropyTrainer,
                   ScheduledSamplingTrainer, PrefixCorruptionTrainer, KStepRolloutTrainer, ProfessorForcingTrainer)

__all__ = ["TRAINER_CLASSES", "CrossEntropyTrainer", "DistillationTrainer", "KStepRolloutTrainer", "MRTTrainer", "MixerTrainer", "PrefixCorruptionTrainer",
           "ProfessorForcingTrainer", "ReinforceTrainer", "RolloutTrainer", "SCSTTrainer", "ScheduledSamplingTrainer", "SeqRLBaseTrainer",
           "SeqRLTrainer"]
