"""The quality benchmark's units: one arm from checkpoint C, for one seed, trained for a budget of decoder token
positions and evaluated. Each arm's trainer is built from an `ArmContext`."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

from hf_seqrl.demo import xe_trainer

from .checkpoint import training_args
from .metrics import arm_reward, evaluate, score
from .settings import CLIPPED_ARMS, RL_ARMS, SEQUENCE_ARMS, Settings, rollout_tokens
from .task import load_model

# Logged RL metrics kept per logging step: the baseline's reward against the samples' shows the advantages' offset.
CURVE_KEYS = ("step", "rl/reward", "rl/baseline_reward", "rl/advantage_abs", "rl/sample_length", "rl/entropy",
              "rl/pg_loss", "rl/clip_fraction", "rl/ratio_mean", "rl/ratio_min", "rl/ratio_max", "rl/frac_truncated",
              "rl/length_ratio", "mrt/risk", "mrt/q_entropy",
              "mrt/distinct_candidates", "loss")


class DecoderPositions:
    """Counts decoder token positions computed by `model` (teacher-forced and generated, padding included)."""

    def __init__(self, model):
        self.count = 0
        self._handle = model.get_decoder().register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        if ids is not None:
            self.count += int(ids.shape[0] * ids.shape[1])

    def remove(self) -> None:
        self._handle.remove()


def position_budget(counter: DecoderPositions, budget: int):
    """Returns a callback that stops training once `counter` has reached `budget` positions."""
    from transformers import TrainerCallback

    class PositionBudget(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if counter.count >= budget:
                control.should_training_stop = True

    return PositionBudget()


def _xe_arm(ctx: "ArmContext"):
    from transformers import Seq2SeqTrainingArguments

    return xe_trainer(ctx.model, ctx.tokenizer, ctx.dataset, ctx.args(Seq2SeqTrainingArguments))


def _ss_arm(ctx: "ArmContext"):
    from hf_seqrl.configs import ScheduledSamplingConfig
    from hf_seqrl.trainers.scheduled_sampling import ScheduledSamplingTrainer

    # Two decoder passes per step: ε reaches its floor halfway through the budget.
    steps = ctx.settings.budget_positions / (2 * ctx.settings.batch_size * ctx.mean_target_positions)
    args = ctx.args(ScheduledSamplingConfig, schedule="linear",
                    schedule_k=max(1.0, steps / 2 / (1 - ctx.settings.ss_min_ratio)),
                    min_teacher_forcing_ratio=ctx.settings.ss_min_ratio)
    return ScheduledSamplingTrainer(model=ctx.model, args=args, train_dataset=ctx.dataset,
                                    processing_class=ctx.tokenizer)


def _rl_arm(arm: str):
    def build(ctx: "ArmContext"):
        from hf_seqrl.configs import SeqRLConfig
        from hf_seqrl.trainers import SCSTTrainer

        settings = ctx.settings
        clipped = {"num_iterations": settings.clip_iterations, "epsilon": settings.clip_epsilon,
                   "epsilon_high": settings.clip_epsilon_high or settings.clip_epsilon,
                   "importance_sampling_level": settings.importance_sampling_level} if arm in CLIPPED_ARMS else {}
        args = ctx.args(SeqRLConfig, lr=settings.rl_lr or settings.arm_lr, rl_weight=settings.rl_weight,
                        max_new_tokens=rollout_tokens(settings), center_advantages=settings.center_advantages,
                        temperature=settings.rl_temperature, disable_dropout=settings.disable_dropout,
                        mask_truncated_completions=settings.mask_truncated_completions,
                        multi_objective_aggregation=settings.multi_objective_aggregation,
                        length_normalize=settings.length_normalize, **RL_ARMS[arm], **clipped)
        return SCSTTrainer(model=ctx.model, args=args, reward_funcs=arm_reward(settings), train_dataset=ctx.dataset,
                           processing_class=ctx.tokenizer)

    return build


def _mrt_arm(candidates: str):
    def build(ctx: "ArmContext"):
        from hf_seqrl.configs import MRTConfig
        from hf_seqrl.trainers.mrt import MRTTrainer

        # The candidates of a source: `mrt_samples` samples and the greedy decode, or the `mrt_samples`-best list of a
        # beam of width `mrt_beam_size`; no baseline, so center_advantages does not apply. The risk is mixed with
        # cross-entropy as the policy-gradient arms are.
        settings = ctx.settings
        args = ctx.args(MRTConfig, lr=settings.rl_lr or settings.arm_lr, rl_weight=settings.rl_weight,
                        max_new_tokens=rollout_tokens(settings), temperature=settings.rl_temperature,
                        num_samples=settings.mrt_samples, mrt_alpha=settings.mrt_alpha,
                        mrt_candidates=candidates, mrt_beam_size=settings.mrt_beam_size,
                        mrt_include_greedy=candidates == "sample", disable_dropout=settings.disable_dropout)
        return MRTTrainer(model=ctx.model, args=args, reward_funcs=arm_reward(settings), train_dataset=ctx.dataset,
                          processing_class=ctx.tokenizer)

    return build


def _mixer_arm(ctx: "ArmContext"):
    from hf_seqrl.configs import MixerConfig
    from hf_seqrl.trainers.mixer import MixerTrainer

    settings = ctx.settings
    # Δ grows by mixer_delta tokens every tenth of the budget's steps (one rollout + one scoring pass per step); the
    # sampled part is rewarded as the SCST arm's samples are (greedy baseline, the same cross-entropy mixing).
    steps = settings.budget_positions / (2 * settings.batch_size * ctx.mean_target_positions)
    args = ctx.args(MixerConfig, lr=settings.rl_lr or settings.arm_lr, max_new_tokens=rollout_tokens(settings),
                    temperature=settings.rl_temperature, rl_weight=settings.rl_weight,
                    center_advantages=settings.center_advantages, baseline="greedy", num_samples=1, mixer_delta=2,
                    mixer_increment_steps=max(1, int(steps / 10)))
    return MixerTrainer(model=ctx.model, args=args, reward_funcs=arm_reward(settings), train_dataset=ctx.dataset,
                        processing_class=ctx.tokenizer)


def _input_schedule_arm(config_name: str, trainer_name: str, **fields):
    def build(ctx: "ArmContext"):
        import hf_seqrl

        args = ctx.args(getattr(hf_seqrl, config_name), **fields)
        return getattr(hf_seqrl, trainer_name)(model=ctx.model, args=args, train_dataset=ctx.dataset,
                                               processing_class=ctx.tokenizer)

    return build


def _pf_arm(ctx: "ArmContext"):
    from hf_seqrl.configs import ProfessorForcingConfig
    from hf_seqrl.trainers.professor_forcing import ProfessorForcingTrainer

    args = ctx.args(ProfessorForcingConfig, max_new_tokens=ctx.settings.max_new_tokens,
                    adversarial_weight=ctx.settings.pf_adversarial_weight)
    return ProfessorForcingTrainer(model=ctx.model, args=args, train_dataset=ctx.dataset,
                                   processing_class=ctx.tokenizer)


@dataclass
class ArmContext:
    """What an arm's trainer is built from: checkpoint C's model, the data, and the shared training arguments."""

    model: object
    tokenizer: object
    dataset: object
    settings: Settings
    output_dir: str
    seed: int
    mean_target_positions: float

    def args(self, config_class, lr: float | None = None, **extra):
        """Returns `config_class` with the arguments every arm shares (learning rate, batch, data order)."""
        return training_args(config_class, self.settings, self.output_dir, self.seed,
                             self.settings.arm_lr if lr is None else lr, 10**6, **extra)


# Every arm a benchmark can run: name -> builder of its trainer from an `ArmContext`.
ARM_TRAINERS = {
    "xe": _xe_arm, "ss": _ss_arm, "scst": _rl_arm("scst"), "loo4": _rl_arm("loo4"),
    "scst_clip": _rl_arm("scst_clip"), "loo4_clip": _rl_arm("loo4_clip"), "mrt": _mrt_arm("sample"), "mrt_beam": _mrt_arm("beam"), "pf": _pf_arm,
    "mixer": _mixer_arm,
    "pc": _input_schedule_arm("PrefixCorruptionConfig", "PrefixCorruptionTrainer", corruption_rate=0.15),
    "noise": _input_schedule_arm("PrefixCorruptionConfig", "PrefixCorruptionTrainer", corruption_rate=0.3,
                                 per_token_levels=True),
    "kstep2": _input_schedule_arm("KStepRolloutConfig", "KStepRolloutTrainer", rollout_steps=2),
    "kstep4": _input_schedule_arm("KStepRolloutConfig", "KStepRolloutTrainer", rollout_steps=4),
}


def arm_trainer(arm: str, model, tokenizer, dataset, settings: Settings, output_dir: str, seed: int,
                mean_target_positions: float):
    """Returns the trainer of one arm, started from `model` (checkpoint C)."""
    return ARM_TRAINERS[arm](ArmContext(model, tokenizer, dataset, settings, output_dir, seed, mean_target_positions))


def train_arm(arm: str, seed: int, settings: Settings, tokenizer, dataset, work_dir: str, c_folder: str):
    """Trains one arm from C (in `c_folder`) for the position budget; returns the model and its training record."""
    from transformers import set_seed

    set_seed(seed)
    model = load_model(settings, c_folder)
    lengths = [len(x) for x in dataset["labels"]]
    trainer = arm_trainer(arm, model, tokenizer, dataset, settings, os.path.join(work_dir, "tmp"), seed,
                          statistics.mean(lengths))
    counter = DecoderPositions(model)
    trainer.add_callback(position_budget(counter, settings.budget_positions))
    clock = time.time()
    trainer.train()
    train_seconds = time.time() - clock
    counter.remove()
    history = trainer.state.log_history
    # The RL arms' logged sample reward and length over training (every `logging_steps` steps).
    curve = [{key: entry[key] for key in CURVE_KEYS if key in entry} for entry in history if "rl/reward" in entry]
    record = {"arm": arm, "seed": seed, "steps": trainer.state.global_step, "positions": counter.count,
              "train_seconds": round(train_seconds), "train_seconds_exact": round(train_seconds, 3),
              "first_logged_reward": curve[0]["rl/reward"] if curve else None,
              "last_logged_reward": curve[-1]["rl/reward"] if curve else None, "curve": curve}
    if arm in SEQUENCE_ARMS:  # what the trainer sampled with, as it read it
        record["sampling"] = sampling_record(trainer.args)
    return model, record


# What a sequence-level arm's config has no field for: MRT has no baseline, no advantages and no reused rollouts.
NO_SAMPLING_FIELD = {"baseline": None, "center_advantages": False, "num_iterations": 1}


def sampling_record(args) -> dict:
    """Returns how a sequence-level arm's trainer sampled and weighed its rollouts, as its config `args` reads."""
    return {"temperature": args.temperature, "num_samples": args.num_samples,
            **{name: getattr(args, name, absent) for name, absent in NO_SAMPLING_FIELD.items()}}


def run_arm(arm: str, seed: int, settings: Settings, splits: dict, tokenizer, dataset, work_dir: str,
            c_folder: str, dev_only: bool = False) -> dict:
    """Trains one arm from C (in `c_folder`) for the position budget and evaluates it (on dev only with
    `dev_only`); returns its record."""
    model, record = train_arm(arm, seed, settings, tokenizer, dataset, work_dir, c_folder)
    if dev_only:
        record["dev"] = score(model, tokenizer, splits["dev"], settings, 1, f"{arm} seed {seed}: dev")
    else:
        record.update(evaluate(model, tokenizer, splits, settings, f"{arm} seed {seed}"))
    return record
