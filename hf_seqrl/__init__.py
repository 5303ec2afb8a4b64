"""hf-seqrl: sequence-level reinforcement learning for Hugging Face encoder-decoder and decoder-only models.

Heavy modules (transformers, the trainers) are imported on first attribute access, so that
`import hf_seqrl` and `import hf_seqrl.losses` stay fast.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "SeqRLConfig": "configs",
    "ScheduledSamplingConfig": "configs",
    "ProfessorForcingConfig": "configs",
    "ProfessorForcingTrainer": "trainers.professor_forcing",
    "MRTConfig": "configs",
    "MixerConfig": "configs",
    "MixerTrainer": "trainers.mixer",
    "PrefixCorruptionConfig": "configs",
    "KStepRolloutConfig": "configs",
    "SeqRLTrainer": "trainers.base",
    "SeqRLBaseTrainer": "trainers.base",
    "ReinforceTrainer": "trainers.reinforce",
    "SCSTTrainer": "trainers.scst",
    "MRTTrainer": "trainers.mrt",
    "ScheduledSamplingTrainer": "trainers.scheduled_sampling",
    "PrefixCorruptionTrainer": "trainers.input_schedules",
    "KStepRolloutTrainer": "trainers.input_schedules",
    "get_reward": "rewards",
    "build_reward": "rewards",
    "WeightedReward": "rewards",
    "SeqRLDataCollator": "data",
    "tokenize_pairs": "data",
    "tokenize_prompt_completion": "data",
    "family_for": "families",
    "strip_start_token": "data",
    "run_diagnostics": "diagnostics",
    "DiagnosticsCallback": "diagnostics",
    "Rollout": "rollout",
    "sample_rollout": "rollout",
    "score_rollout": "rollout",
    "build_tiny_model": "tiny_models",
}

__all__ = sorted(_LAZY) + ["losses", "rewards", "metrics", "schedules", "decoder_inputs", "__version__"]


def __getattr__(name):
    if name in _LAZY:
        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        value = getattr(module, name)
        globals()[name] = value
        return value
    if name in ("losses", "rewards", "metrics", "schedules", "rollout", "data", "configs", "diagnostics", "hub",
                "decoder_inputs"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'hf_seqrl' has no attribute {name!r}")
