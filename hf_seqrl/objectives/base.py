"""What an objective is, and what it is given: the contract between `RolloutTrainer`'s step and one algorithm.

An `Objective` owns the part of a step between the shared head and tail (docs/architecture.md, "One RL step"):
what it decodes (`rollout`, with `rollout_plan` saying how), how rewards become the weights of its loss (`weigh`),
what its scoring pass needs (`score`) and its loss (`loss`), over batches of its own type. It declares its
defaults once, in `Defaults`. The trainer hands every stage a `StepContext` (the micro-batch, its slot, whether
the step is on-policy, the scoring pass's random state) and itself as the `Runner`: the services a stage may call
(decoding, rewards, the scoring pass, frozen models). The math stays in `hf_seqrl.losses` and `functional`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol

import torch

from ..papers import Method
from ..types import BatchText, Rollout, RolloutBatch, RewardValues, ScoredRollout


class RolloutPlan(NamedTuple):
    """How a training step after the warm-up rolls out."""

    from_source: bool  # the samples are decoded from the source alone (`Runner.take_rollout`; decodable ahead)
    greedy: bool  # each source's greedy decode comes with its samples


class StepLoss(NamedTuple):
    """What an objective's loss returns."""

    loss: torch.Tensor
    token_mask: torch.Tensor  # (N, T): the tokens the entropy bonus and the KL term count
    metrics: dict


@dataclass
class StepContext:
    """What one micro-batch's stages share, passed to each instead of kept on the trainer.

    Attributes:
        inputs (`dict`): the micro-batch's model inputs (labels included when the dataset has them).
        text (`BatchText`): its text columns, references filled from the labels when the dataset has none.
        unwrapped: the policy, unwrapped from DDP / ZeRO / FSDP (for decoding).
        step (`int`): the optimizer step being trained (0 for the first).
        slot (`int`): the micro-batch's place within the optimizer step (`generation.RolloutSource`).
        on_policy (`bool`): whether the step trains on the policy's own samples (`Objective.on_policy`).
        policy_rng (`tuple` or None): the random state of the policy's scoring pass, written by that pass
            (`Runner.score_policy`) and replayed by the KL reference's pass and by a reused rollout's later passes.
    """

    inputs: dict
    text: BatchText
    unwrapped: Any
    step: int
    slot: int
    on_policy: bool = True
    policy_rng: tuple | None = None


@dataclass(frozen=True)
class Defaults:
    """An objective's defaults, declared once (the trainers, the CLI, the card and the docs read them here).

    Attributes:
        algorithm_id (`str`): its name for machines (`hf-seqrl train --algorithm`, results files).
        config_class (`type`): the config its trainer takes.
        baseline (`str` or None): the baseline of a `BaselineConfig` that leaves it to the trainer
            (`baseline=None`); None for an objective without one.
        disable_dropout (`bool`): what `disable_dropout=None` means (docs/math.md, "Dropout and the estimator").
        needs_rewards (`bool`): whether it refuses `reward_funcs=None`.
        needs_teacher (`bool`): whether it refuses `teacher_model=None`.
        model_families (`tuple[str, ...]`): the `hf_seqrl.models` families it trains.
        reads_targets (`str` or None): why it reads the gold targets whatever its settings (a dataset of sources
            alone is then refused naming it), None when sources may do (`services.references`).
    """

    algorithm_id: str
    config_class: type
    baseline: str | None = None
    disable_dropout: bool = False
    needs_rewards: bool = True
    needs_teacher: bool = False
    model_families: tuple[str, ...] = ("seq2seq", "causal")
    reads_targets: str | None = None


class Runner(Protocol):
    """What a `RolloutTrainer` offers an objective's stages (the objective never imports the trainer)."""

    args: Any  # the trainer's config (a `RolloutConfig`)
    family: Any  # the model's family (`hf_seqrl.models`)
    processing_class: Any  # the tokenizer
    rewards: Any  # `services.reward_scorer.RewardScorer`, or None without `reward_funcs`
    reward_label: str
    frozen_models: dict  # `services.frozen.FrozenModel`s by name: "reference", "teacher"
    completions: Any  # `services.completions.CompletionLog`, or None without `log_completions`
    rollout_keys: Any  # `services.generation.RolloutKeys`
    rollout_config: Any  # the rollouts' generation config
    label_smoother: Any  # the Trainer's `LabelSmoother`, or None
    accelerator: Any
    model: Any  # the policy as the Trainer wraps it

    def unrewarded_batch(self, rollout: Rollout, ctx: StepContext,
                         predictions: list[str] | None = None) -> RolloutBatch: ...

    def take_rollout(self, ctx: StepContext) -> Rollout: ...

    def sample_advantages(self, rollout: Rollout, ctx: StepContext) -> RolloutBatch: ...

    def reward_values(self, token_ids: torch.Tensor, text: BatchText, token_mask=None) -> RewardValues: ...

    def record_completions(self, ctx: StepContext, samples: RewardValues, sample_cut, baselines=None,
                           advantages=None, greedy_ids=None) -> None: ...

    def gold_labels(self, inputs) -> torch.Tensor | None: ...

    def score_policy(self, model, ctx: StepContext, token_ids, group: int, gold_labels=None,
                     temperature: float | None = None, plain: bool = False, divergence=None) -> ScoredRollout: ...

    def score_frozen(self, name: str, inputs, token_ids, group: int, temperature: float = 1.0) -> ScoredRollout: ...

    def gold_cross_entropy(self, scored: ScoredRollout, labels) -> torch.Tensor | None: ...

    def cross_entropy_of(self, logprobs, labels, raw_logprobs=None, raw_logprob_sums=None,
                         vocab_size: int = 0) -> torch.Tensor: ...

    def decoding(self, unwrapped): ...


class Objective:
    """One algorithm's stages between the shared head and tail of a step; a trainer builds one per run
    (`objective_class(args, baseline)`) and calls its stages in order (`RolloutTrainer.rl_loss`). The defaults here
    are the policy gradient's shape: samples from the source, rewards turned into advantages over a baseline, one
    scoring pass with the gold rows of the cross-entropy term. An objective overrides the stages it changes.

    Args:
        args: the trainer's config (`defaults.config_class`).
        baseline (`str` or None): the baseline that runs (`args.baseline`, else `defaults.baseline`).
    """

    defaults: ClassVar[Defaults]
    reuses_rollouts: ClassVar[bool] = False  # whether `num_iterations > 1` keeps rollouts for later steps
    reports_teacher: ClassVar[bool] = True  # the tail scores a teacher's view of the samples (`rl/teacher_*`)

    def __init__(self, args, baseline: str | None):
        self.args, self.baseline = args, baseline

    @property
    def method(self) -> Method:
        """What logs and cards say of the objective as configured (name, tag, description, papers)."""
        raise NotImplementedError

    # ---- checks: before the Trainer is set up, and once the models are loaded ----------------------

    @classmethod
    def check_arguments(cls, reward_funcs, teacher_model, args) -> None:
        """Raises a ValueError naming the fix when the trainer's arguments cannot run the objective."""

    def check_models(self, runner: Runner) -> None:
        """Raises (or warns) once the policy, the frozen models and the rewards are loaded."""

    @classmethod
    def rewards_read_references(cls, args) -> bool:
        """Returns whether, with `args`, the reward scores the samples against the dataset's references (then a
        reward that reads them needs a dataset with targets; `trainers.services.references`). An objective that uses
        its reward otherwise (MBR: the samples against each other) says False."""
        return True

    # ---- the stages, in the order a step runs them ---------------------------------------------------

    def on_policy(self, step: int) -> bool:
        """Returns whether optimizer step `step` trains on the policy's own samples."""
        return True

    def rollout_plan(self, step: int) -> RolloutPlan:
        """Returns how optimizer step `step` rolls out (when a rollout reaches the loss at all)."""
        return RolloutPlan(from_source=True, greedy=self.baseline == "greedy")

    def rollout(self, runner: Runner, ctx: StepContext) -> Any:
        """Returns what the micro-batch decodes (by default its samples, decoded ahead or now)."""
        return runner.take_rollout(ctx)

    def weigh(self, runner: Runner, rollout: Any, ctx: StepContext) -> RolloutBatch:
        """Returns the rollout as the loss reads it: by default rewards → baseline → advantages
        (`functional.advantages.sample_advantages`, through `Runner.sample_advantages`)."""
        return runner.sample_advantages(rollout, ctx)

    def score(self, runner: Runner, model, batch: RolloutBatch, ctx: StepContext) -> ScoredRollout:
        """Returns the scoring pass of the batch's rows under the policy (with the gold rows of the cross-entropy
        term when `rl_weight < 1`)."""
        return runner.score_policy(model, ctx, batch.sample_ids, batch.group, self.gold_labels(runner, ctx))

    def loss(self, scored: ScoredRollout, batch: RolloutBatch, ctx: StepContext) -> StepLoss:
        """Returns the objective's loss of the scored batch, the tokens its entropy and KL terms count, and its
        metrics (over `hf_seqrl.losses`)."""
        raise NotImplementedError

    def gold_labels(self, runner: Runner, ctx: StepContext) -> torch.Tensor | None:
        """Returns the gold rows the scoring pass adds for the cross-entropy term (`rl_weight < 1`), else None."""
        return runner.gold_labels(ctx.inputs)

    def cross_entropy(self, runner: Runner, scored: ScoredRollout, batch: RolloutBatch,
                      ctx: StepContext) -> torch.Tensor | None:
        """Returns the cross-entropy the loss mixes in (`rl_weight < 1`), else None."""
        return runner.gold_cross_entropy(scored, self.gold_labels(runner, ctx))
