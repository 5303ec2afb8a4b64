"""Trainers of hf-seqrl (all `transformers.Seq2SeqTrainer` subclasses): `base` (shared orchestration),
`cross_entropy` (`CrossEntropyTrainer`: plain cross-entropy), `rollout` (`RolloutTrainer`: the one rewarded trainer,
running an objective of `hf_seqrl.objectives`), `rewarded` (SCST, REINFORCE, MRT, MIXER, distillation, best-of-n: each
a trainer that picks an objective), `input_schedules` and `scheduled_sampling`, `professor_forcing`; `services/`
holds what they use besides their losses."""

from .base import SeqRLBaseTrainer
from .cross_entropy import CrossEntropyTrainer
from .input_schedules import KStepRolloutTrainer, PrefixCorruptionTrainer
from .professor_forcing import ProfessorForcingTrainer
from .rewarded import (BestOfNTrainer, DistillationTrainer, MixerTrainer, MRTTrainer, ReinforceTrainer, SCSTTrainer,
                       SeqRLTrainer)
from .rollout import RolloutTrainer
from .scheduled_sampling import ScheduledSamplingTrainer

# Every trainer `hf-seqrl train --algorithm` runs, by its `algorithm_id`.
TRAINER_CLASSES = (SCSTTrainer, ReinforceTrainer, MRTTrainer, MixerTrainer, DistillationTrainer, BestOfNTrainer,
                   CrossEntropyTrainer, ScheduledSamplingTrainer, PrefixCorruptionTrainer, KStepRolloutTrainer,
                   ProfessorForcingTrainer)

__all__ = ["TRAINER_CLASSES", "BestOfNTrainer", "CrossEntropyTrainer", "DistillationTrainer", "KStepRolloutTrainer", "MRTTrainer", "MixerTrainer", "PrefixCorruptionTrainer",
           "ProfessorForcingTrainer", "ReinforceTrainer", "RolloutTrainer", "SCSTTrainer", "ScheduledSamplingTrainer", "SeqRLBaseTrainer",
           "SeqRLTrainer"]
