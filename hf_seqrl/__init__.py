"""hf-seqrl: sequence-level reinforcement learning for Hugging Face encoder-decoder and decoder-only models.

Heavy modules (transformers, the trainers) are imported on first attribute access, so that
`import hf_seqrl` and `import hf_seqrl.losses` stay fast.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "SeqRLConfig": "configs",
    "SeqRLBaseConfig": "configs",
    "ScheduledSamplingConfig": "configs",
    "ProfessorForcingConfig": "configs",
    "ProfessorForcingTrainer": "trainers.professor_forcing",
    "MRTConfig": "configs",
    "MixerConfig": "configs",
    "MixerTrainer": "trainers.rewarded",
    "DistillationConfig": "configs",
    "DistillationTrainer": "trainers.rewarded",
    "TeacherLikelihoodReward": "rewards",
    "PrefixCorruptionConfig": "configs",
    "KStepRolloutConfig": "configs",
    "SeqRLTrainer": "trainers.rewarded",
    "RolloutTrainer": "trainers.rollout",
    "BestOfNTrainer": "trainers.rewarded",
    "BestOfNConfig": "objectives.best_of_n",
    "RolloutConfig": "configs",
    "SeqRLBaseTrainer": "trainers.base",
    "CrossEntropyTrainer": "trainers.cross_entropy",
    "ReinforceTrainer": "trainers.rewarded",
    "SCSTTrainer": "trainers.rewarded",
    "MRTTrainer": "trainers.rewarded",
    "ScheduledSamplingTrainer": "trainers.scheduled_sampling",
    "PrefixCorruptionTrainer": "trainers.input_schedules",
    "KStepRolloutTrainer": "trainers.input_schedules",
    "get_reward": "rewards",
    "build_reward": "rewards",
    "WeightedReward": "rewards",
    "SeqRLDataCollator": "data",
    "tokenize_pairs": "data",
    "tokenize_prompt_completion": "data",
    "family_for": "models",
    "strip_start_token": "data",
    "run_diagnostics": "diagnostics",
    "DiagnosticsCallback": "diagnostics",
    "Rollout": "types",
    "build_tiny_model": "models.tiny",
}

# Submodules reachable as attributes (`hf_seqrl.losses`).
_MODULES = {"losses", "rewards", "evaluation", "schedules", "data", "configs", "diagnostics", "hub", "models",
            "functional", "types", "objectives", "papers"}

__all__ = sorted(_LAZY) + ["losses", "rewards", "evaluation", "schedules", "__version__"]


def __getattr__(name):
    if name in _LAZY:
        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        value = getattr(module, name)
        globals()[name] = value
        return value
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'hf_seqrl' has no attribute {name!r}")
