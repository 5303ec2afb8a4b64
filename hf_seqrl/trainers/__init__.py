"""Trainers of hf-seqrl (all `transformers.Seq2SeqTrainer` subclasses)."""

from .base import SeqRLTrainer
from .professor_forcing import ProfessorForcingTrainer
from .mixer import MixerTrainer
from .mrt import MRTTrainer
from .input_schedules import KStepRolloutTrainer, PrefixCorruptionTrainer
from .reinforce import ReinforceTrainer
from .scheduled_sampling import ScheduledSamplingTrainer
from .scst import SCSTTrainer

__all__ = ["SeqRLTrainer", "ProfessorForcingTrainer", "ReinforceTrainer", "SCSTTrainer", "MRTTrainer", "MixerTrainer",
           "ScheduledSamplingTrainer", "PrefixCorruptionTrainer", "KStepRolloutTrainer"]
