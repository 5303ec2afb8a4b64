"""The quality benchmark (`python benchmarks/quality.py`, protocol in its docstring), and what the other benchmarks
reuse of it: the settings, the tasks' data, tokenizers and models, checkpoint C, the arm units, a model's decodings
side by side (`decodes`) and the wall-clock record of a benchmark's stages (`stages`).

`settings` < `task` < `metrics` < `checkpoint` < `units` < `report`, `pool` < `decodes`, `command`: no module imports
a later one; `stages` imports none of them.
"""

from .checkpoint import c_folder, checkpoint_c, teacher_checkpoint, teacher_dir, teacher_settings, train_stage
from .command import main
from .metrics import BERTSCORE_LAYER, arm_reward, evaluate, flagged_changes, score
from .report import summarize, training_means, write_dev_results, write_json
from .settings import (C_FIELDS, DEFAULT_DATA, SETTINGS, Settings, apply_overrides, default_work_dir, rollout_tokens,
                       run_tag)
from .task import build_model, build_tokenizer, load_model, load_task, task_data, to_dataset
from .units import ARM_TRAINERS, DecoderPositions, arm_trainer, run_arm, teacher_outputs, train_arm

__all__ = ["ARM_TRAINERS", "BERTSCORE_LAYER", "C_FIELDS", "DEFAULT_DATA", "SETTINGS", "DecoderPositions", "Settings",
           "apply_overrides", "arm_reward", "arm_trainer", "build_model", "build_tokenizer", "c_folder",
           "checkpoint_c", "default_work_dir", "evaluate", "flagged_changes", "load_model", "load_task", "main",
           "run_arm", "run_tag", "score", "summarize", "task_data", "teacher_checkpoint", "teacher_dir",
           "teacher_outputs", "teacher_settings", "to_dataset", "train_arm", "train_stage", "training_means",
           "write_dev_results", "write_json"]
