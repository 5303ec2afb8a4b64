"""Whether a training run needs the gold targets: the one place that decides if a dataset of sources (or prompts)
alone can train a trainer, from the trainer's declared needs (`reads_targets`), its config and its rewards.

A run that reads no target trains from sources alone (docs/configuration.md, "Training data"); one that does names
each setting that reads them when the trainer is built (`prepare_datasets` raises with these reasons).
"""

from __future__ import annotations

from ...rewards import reference_rewards


def run_target_settings(trainer, args, compute_metrics=None) -> tuple[list[str], list[str]]:
    """Returns the settings that read the train split's targets (`target_settings`) and the evaluation splits'
    (`evaluation_target_settings`) of `trainer`, an instance being built (its class's `reads_targets`, the
    `reward_funcs` a rewarded trainer sets before the data checks)."""
    reward_funcs = getattr(trainer, "reward_funcs", None)
    return (target_settings(type(trainer), args, reward_funcs),
            evaluation_target_settings(args, compute_metrics, reward_funcs))


def target_settings(trainer: type, args, reward_funcs=None) -> list[str]:
    """Returns, for each setting of a run of `trainer` (a trainer class) with `args` and `reward_funcs` that reads the
    gold targets or references, what it is and how to do without them; an empty list when sources alone train it.

    The settings: the trainer itself (`reads_targets`, e.g. teacher forcing, MIXER's gold prefixes), a cross-entropy
    warm-up (`warmup_xe_steps > 0`), a cross-entropy term (`rl_weight < 1`), MRT's reference among the candidates
    (`mrt_include_reference`), distillation's off-policy steps on gold prefixes (`lmbda < 1` without `seq_kd`), and a
    reward that scores against references (`rewards.reference_rewards`), unless the trainer's objective uses it
    otherwise (`Objective.rewards_read_references`)."""
    name = type(args).__name__
    found = []
    if getattr(trainer, "reads_targets", None):
        found.append(f"{trainer.__name__} {trainer.reads_targets}")
    if getattr(args, "warmup_xe_steps", 0) > 0:
        found.append(f"{name}.warmup_xe_steps={args.warmup_xe_steps} trains on the targets first (set it to 0)")
    if not getattr(trainer, "reads_targets", None) and getattr(args, "rl_weight", 1.0) < 1:
        found.append(f"{name}.rl_weight={args.rl_weight} mixes in cross-entropy on the targets (set rl_weight=1.0)")
    if getattr(args, "mrt_include_reference", False):
        found.append(f"{name}.mrt_include_reference=True adds the reference to the candidates (set it to False)")
    if getattr(args, "lmbda", 1.0) < 1 and not getattr(args, "seq_kd", False):
        found.append(f"{name}.lmbda={args.lmbda} trains the off-policy steps on the gold targets (set lmbda=1.0, or "
                     "seq_kd=True to train them on the teacher's decodes)")
    objective = getattr(trainer, "objective_class", None)
    if objective is None or objective.rewards_read_references(args):
        found += reward_settings(reward_funcs, "scores the samples against references")
    return found


def evaluation_target_settings(args, compute_metrics=None, reward_funcs=None) -> list[str]:
    """Returns, for each setting that reads an evaluation split's targets, what it is and the fix (an empty list when
    a split of sources alone evaluates: it then reports no `eval_loss`, which needs targets): `compute_metrics`
    (it compares the outputs with the targets), `metric_for_best_model` naming the loss, and with
    `predict_with_generate` a reward that scores the outputs against references (`rl/reward`)."""
    name = type(args).__name__
    found = []
    if compute_metrics is not None:
        found.append("compute_metrics compares the outputs with the targets (leave it out)")
    if getattr(args, "metric_for_best_model", None) in ("loss", "eval_loss"):
        found.append(f"{name}.metric_for_best_model={args.metric_for_best_model!r} needs eval_loss, which needs the "
                     "targets (name another metric, or set load_best_model_at_end=False and leave it unset)")
    if getattr(args, "predict_with_generate", False):
        found += reward_settings(reward_funcs, "scores the evaluation outputs against references (rl/reward)")
    return found


def reward_settings(reward_funcs, what: str) -> list[str]:
    """Returns the reason a source-only dataset cannot serve `reward_funcs` (`what` they would do), or nothing."""
    names = [] if reward_funcs is None else reference_rewards(reward_funcs)
    if not names:
        return []
    return [f"reward_funcs {names} {what} (use a reference-free reward: a callable of the sources and predictions, "
            "TeacherLikelihoodReward, CometReward(..., use_references=False), MetricXReward(qe=True))"]
