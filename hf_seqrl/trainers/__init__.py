"""Trainers of hf-seqrl (all `transformers.Seq2SeqTrainer` subclasses)."""

from .base import SequenceRLTrainer
from .reinforce import ReinforceTrainer
from .scst import SCSTTrainer

__all__ = ["SequenceRLTrainer", "ReinforceTrainer", "SCSTTrainer"]
