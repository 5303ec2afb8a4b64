"""`RolloutTrainer`: what every rewarded trainer (SCST, REINFORCE, MRT, MIXER) shares.

The rewards and their metrics, the rollout decode (one per micro-batch, or one per `steps_per_generation`
micro-batches decoded ahead, or a rollout kept for reuse), the scoring pass under the policy and the KL reference, and
the sample logs. `rl_loss` runs one RL step as stages in order: this file holds the head (the rollout, its rewards and
advantages, the scoring pass), an algorithm's file its loss (`algorithm_loss`) and the stages it changes, and
`loss_tail` the tail (the cross-entropy term, the mix with entropy and KL). An algorithm says whether a step rolls
out (`rollout_plan`); the math lives in `hf_seqrl.losses` and `hf_seqrl.functional`.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import NamedTuple

import torch

from ..configs import BaselineConfig, RolloutConfig
from ..configs.rollout import check_aggregation
from ..functional import advantages as functional_advantages
from ..models.base import replayed_rng, rng_state
from ..models.scoring import ScoreOptions
from ..rewards import RewardError, reference_rewards
from ..rewards.convention import check_reward_spec
from ..types import BatchText, Rollout, RolloutBatch, RewardValues, ScoredRollout, repeat_rows
from . import loss_tail
from .base import SeqRLBaseTrainer
from .services.checkpoints import checkpoint_on_error
from .services.completions import CompletionLog
from .services.frozen import FrozenModel
from .services.generation import RolloutKeys, RolloutSource, model_inputs
from .services.inputs import load_model
from .services.reward_scorer import RewardScorer, batch_references


class RolloutPlan(NamedTuple):
    """How a training step after the warm-up rolls out (see `RolloutTrainer.rollout_plan`)."""

    from_source: bool  # the samples are decoded from the source alone, through `take_rollout` (decodable ahead)
    greedy: bool  # each source's greedy decode comes with its samples


class StepLoss(NamedTuple):
    """What an algorithm's loss stage returns (`RolloutTrainer.algorithm_loss`)."""

    loss: torch.Tensor
    token_mask: torch.Tensor  # (N, T): the tokens the entropy bonus and the KL term count
    metrics: dict


class RolloutTrainer(SeqRLBaseTrainer):
    """Base of the rewarded trainers; same constructor as `Seq2SeqTrainer` plus `reward_funcs`, `args` a
    `RolloutConfig`. One RL step is `rl_loss`, a stage per call: `stored_batch` or `rollout` → `rollout_batch`
    (rewards → advantages; a trainer whose config is a `BaselineConfig` weighs its samples by advantages over a
    baseline) → `score_batch` → `algorithm_loss` → `cross_entropy_term` → `finish_loss`. Subclasses implement
    `algorithm_loss`, override the other stages they change, and say in `rollout_plan` whether a step rolls out."""

    config_class = RolloutConfig
    # Dropout off: the scoring pass scores the distribution the rollouts came from. Minimum risk training keeps this
    # (measured with dropout kept: benchmarks/README.md, MRT's candidate sets); the policy gradients keep dropout.
    default_disable_dropout = True
    default_baseline: str | None = None  # the baseline of a `BaselineConfig` that leaves it to the trainer

    # False for a trainer whose loss needs no reward (it then takes `reward_funcs=None`).
    needs_rewards = True
    reads_targets = None  # sources alone train it, unless its settings or rewards read targets (`target_settings`)

    def __init__(self, model=None, args: RolloutConfig | None = None, data_collator=None, train_dataset=None,
                 eval_dataset=None, processing_class=None, reward_funcs=None, teacher_model=None, **kwargs):
        if reward_funcs is None and self.needs_rewards:
            raise ValueError(
                f"{type(self).__name__} needs reward_funcs=: a built-in name ('bleu', 'chrf', 'rouge1', 'rouge2', "
                "'rougeL', 'rougeLsum'), a 'module:function' path, a callable f(predictions, references, sources, "
                "**columns) -> list[float], an evaluate.EvaluationModule, or a list of these.")
        # Checked before the (slow) Trainer set-up, so that a typo fails at once.
        if reward_funcs is not None:
            weights = args.reward_weights if isinstance(args, RolloutConfig) else None
            check_reward_spec(reward_funcs, weights, f"{type(args).__name__}.reward_weights")
        if isinstance(args, BaselineConfig):
            check_aggregation(args, args.baseline or self.default_baseline)
        self.reward_funcs = reward_funcs  # read by the dataset checks of `SeqRLBaseTrainer.__init__`
        super().__init__(model=model, args=args, data_collator=data_collator, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, **kwargs)
        self.rewards = None if reward_funcs is None else RewardScorer(reward_funcs, self.args)
        # Whether a reward scores against references (`rewards.reference_rewards`); the others score rows without any.
        self.rewards_read_references = bool(reward_funcs is not None and reference_rewards(reward_funcs))
        unwrapped = self.accelerator.unwrap_model(self.model)
        # Models scored on the policy's tokens without training (`hf_seqrl.trainers.services.frozen`), by name.
        self.frozen_models: dict[str, FrozenModel] = {}
        if self.args.kl_coef > 0:
            self.frozen_models["reference"] = FrozenModel.reference_of(
                unwrapped, self.args.device, lambda: self.accelerator.unwrap_model(self.model))
        if teacher_model is not None:
            teacher = load_model(teacher_model, self.args, "teacher_model_init_kwargs")
            self.frozen_models["teacher"] = FrozenModel.teacher(
                teacher, self.args.device, unwrapped, tokenizer=self.processing_class,
                hub_arguments=self.args.teacher_model_init_kwargs or {})
        self.baseline = (self.args.baseline or self.default_baseline) if isinstance(self.args, BaselineConfig) else None
        self.baseline_ema: float | None = None  # the moving-average baseline's state
        self._rollout_config = None
        self._policy_rng = None  # the RNG state of the last policy scoring pass, replayed by the reference pass
        self.rollout_keys = RolloutKeys(self.args.seed, self.args.process_index)
        self.rollout_source = RolloutSource()
        self.slot = 0  # the slot of the micro-batch in training (`RolloutSource`)
        self.reuse = None  # the rollouts kept for later steps of a cycle (`SeqRLTrainer`, `num_iterations > 1`)
        self.completions = CompletionLog() if self.args.log_completions else None

    @property
    def reward_fn(self):
        """The reward as built (`RewardScorer.fn`: a combined or pooled reward), None without `reward_funcs`."""
        return getattr(self.rewards, "fn", None)

    @property
    def reward_label(self) -> str:
        return "none" if self.rewards is None else self.rewards.label

    @property
    def ref_model(self):
        """The KL reference when a model of its own (TRL's name), else None (the policy with its adapter off, or none)."""
        return getattr(self.frozen_models.get("reference"), "model", None)

    def card_reward(self) -> str | None:
        """Returns the reward as the model card names it: the names the user gave in `reward_funcs`, with weights."""
        return None if self.rewards is None else self.rewards.card_label()

    def card_teacher(self) -> str | None:
        return getattr(self.frozen_models.get("teacher"), "card_name", None)

    def rollout_plan(self) -> RolloutPlan | None:
        """Returns how the current training step (after the warm-up) rolls out, or None when it decodes nothing:
        nothing a rollout gives would reach the loss (`rl_weight`, `kl_coef` and `entropy_coef` all 0), and the step
        trains as `Seq2SeqTrainer` does. Subclasses refine the plan of this base: samples decoded from the source, with
        each source's greedy row for the greedy baseline."""
        args = self.args
        if args.rl_weight == 0 and args.kl_coef == 0 and args.entropy_coef == 0:
            return None
        return RolloutPlan(from_source=True, greedy=self.baseline == "greedy")

    def own_loss_off(self) -> str | None:
        if self.rollout_plan() is None:
            return "rl_weight=0, kl_coef=0 and entropy_coef=0 leave nothing of a rollout in the loss"
        return None

    @property
    def rollout_config(self):
        """Returns the generation config of the rollouts (length limit, temperature, top-k, top-p)."""
        if self._rollout_config is None:
            model = self.accelerator.unwrap_model(self.model)
            self._rollout_config = self.family.generation_config(
                model, self.args.max_new_tokens, self.args.temperature, self.args.top_k, self.args.top_p,
                max_length=self.args.generation_max_length,
            )
        return self._rollout_config

    def take_rollout(self, unwrapped, inputs) -> Rollout:
        """Returns the rollout of the micro-batch in training (`slot`): the one decoded ahead with the other
        micro-batches of its optimizer step (`steps_per_generation > 1`), else one decoded now."""
        rollout = self.rollout_source.take(self.state.global_step, self.slot)
        return rollout if rollout is not None else self.decode_rollouts(unwrapped, [inputs])[0]

    def decode_rollouts(self, unwrapped, batches: list[dict]) -> list[Rollout]:
        """Returns the rollouts of `batches` (micro-batches of the current optimizer step, in order) from one decode,
        every sample row drawing from its own key (`RolloutKeys`)."""
        sizes = [batch["input_ids"].shape[0] for batch in batches]
        joined = batches[0] if len(batches) == 1 else self.family.join_prompts(unwrapped, batches)
        n = self.args.num_samples
        keys = self.rollout_keys.next(self.state.global_step, sum(sizes), n, joined["input_ids"].device)
        with self.decoding(unwrapped):
            rollout = self.family.sample(unwrapped, joined, self.rollout_config, n,
                                         with_greedy=self.rollout_plan().greedy, keys=keys)
        return [rollout] if len(batches) == 1 else rollout.split(sizes)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """`Trainer.get_batch_samples` (the micro-batches of one optimizer step); with `steps_per_generation > 1`, also
        decodes their rollouts, `steps_per_generation` micro-batches per decode, before the first of them trains."""
        batches, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        steps = self.args.generation_steps
        plan = self.rollout_plan() if steps > 1 and self.phase == "rl" else None
        ahead = []
        if plan is not None and plan.from_source:
            unwrapped = self.accelerator.unwrap_model(self.model)
            inputs = [model_inputs(batch, self.args.device) for batch in batches]
            for start in range(0, len(inputs), steps):
                ahead += self.decode_rollouts(unwrapped, inputs[start:start + steps])
        self.rollout_source.hold(self.state.global_step, ahead)
        return batches, num_items_in_batch

    # ---- the loss -------------------------------------------------------------------------------

    def sequence_loss(self, model, inputs, text: BatchText, num_items_in_batch):
        args = self.args
        if self.rollout_plan() is None:
            # Nothing a rollout produces would reach the loss: skip decoding and train as Seq2SeqTrainer does.
            self._record("train", {"rl/phase": 1.0})
            return self.per_batch_mean_loss(model, inputs)
        self.loss_is_scaled_for_ga = False  # per-batch mean: the Trainer divides by accumulation steps
        if args.rl_weight < 1 and inputs.get("labels") is None:
            raise ValueError(
                f"{type(args).__name__}.rl_weight={args.rl_weight} mixes in cross-entropy, which needs tokenized "
                "'labels' in the dataset: add them (tokenizer(text_target=...)) or set rl_weight=1.0 for pure RL on "
                "'references'.")
        if text.references is None:
            text = text._replace(references=batch_references(inputs, self.processing_class))
        self.slot = self.rollout_source.next_slot(self.state.global_step)
        return self.rl_loss(model, inputs, text)

    def rl_loss(self, model, inputs, text: BatchText):
        """Returns the loss of a micro-batch after the warm-up and records its metrics: one stage per call, in order
        (docs/architecture.md, "One RL step"). An algorithm overrides the stages it changes."""
        unwrapped = self.accelerator.unwrap_model(model)
        batch = self.stored_batch()  # a rollout an earlier step of the cycle scored (num_iterations > 1)
        if batch is None:
            rollout = self.rollout(unwrapped, inputs)  # decoded ahead or now (`RolloutSource`)
            batch = self.rollout_batch(rollout, text, unwrapped, inputs)  # rewards (`RewardScorer`) → advantages
        scored = self.score_batch(model, inputs, batch)  # the scoring pass: the KL reference, then the policy
        step = self.algorithm_loss(scored, batch, inputs)  # the algorithm's loss (`hf_seqrl.losses`)
        xe_loss = self.cross_entropy_term(scored, batch, inputs)
        return self.finish_loss(step.loss, xe_loss, inputs, scored, batch.sample_ids, batch.group, step.token_mask,
                                step.metrics)  # mixed with cross-entropy, − entropy, + KL

    def stored_batch(self) -> RolloutBatch | None:
        """Returns the rollout kept for this micro-batch's slot in the current reuse cycle (`reuse`, a `RolloutReuse`
        that `SeqRLTrainer` sets with `num_iterations > 1`), or None when the micro-batch rolls out."""
        return None if self.reuse is None else self.reuse.take(self.state.global_step, self.slot)

    def rollout(self, unwrapped, inputs):
        """Returns this micro-batch's rollout (`take_rollout`: its samples, and greedy rows for the greedy baseline);
        an algorithm that rolls out otherwise returns what its `rollout_batch` reads."""
        return self.take_rollout(unwrapped, inputs)

    def rollout_batch(self, rollout: Rollout, text: BatchText, unwrapped, inputs=None) -> RolloutBatch:
        """Returns the rewards, baseline and advantages of `rollout`'s samples and what they measure (no grad);
        keeps their rows for the sample log (`log_completions`; `inputs` gives the source texts). The advantages are
        `hf_seqrl.functional.advantages.sample_advantages`: a sample left out (no reward applies, a dropped non-finite
        one, or its source's greedy reward is missing) gets no advantage and no row in the loss, and counts in no
        other sample's baseline or scale. This trainer keeps the moving average and sums the batch's moments over
        processes."""
        args, n = self.args, rollout.num_samples
        samples = self.reward_values(rollout.sample_ids, repeat_rows(text, n), rollout.sample_mask)
        greedy = self.reward_values(rollout.greedy_ids, text) if self.baseline == "greedy" else None
        settings = args.advantage_settings(self.baseline)
        parts = greedy_parts = weights = None
        if settings.aggregation == "normalize_then_sum":
            parts, weights = self.rewards.part_tensors(samples)
            greedy_parts = None if greedy is None else self.rewards.part_tensors(greedy)[0]
        adv, baselines, kept = functional_advantages.sample_advantages(
            samples.rewards, samples.left_out, n, settings, truncated=rollout.sample_cut,
            greedy=None if greedy is None else greedy.rewards,
            greedy_left_out=None if greedy is None else greedy.left_out,
            parts=parts, greedy_parts=greedy_parts, weights=weights, moving_average=self.baseline_ema,
            add_up=self.add_up_over_processes)
        if self.baseline == "moving_average" and kept.any():
            self.baseline_ema = functional_advantages.moving_average(
                self.baseline_ema, samples.rewards[kept].mean().item(), args.baseline_ema_decay)
        metrics = self.rewards.metrics(samples, ~kept, rollout.sample_mask, rollout.sample_cut, repeat_rows(text, n))
        metrics.update(functional_advantages.advantage_metrics(adv, baselines, kept))  # the left-out have none
        if self.completions is not None:
            self.record_completions(inputs, text, samples, rollout.sample_cut, unwrapped, baselines, adv,
                                    rollout.greedy_ids)
        if samples.token_values is not None:  # token-level rewards: each token's value beside the sentence's
            adv = functional_advantages.token_level_advantages(adv, samples.token_values, rollout.sample_mask,
                                                               args.token_reward_to_go)
        return RolloutBatch(rollout.sample_ids, rollout.sample_mask, adv, metrics, kept=kept, group=n,
                            rewards=samples.rewards)

    def gold_labels(self, inputs):
        """Returns the gold labels the cross-entropy term needs (`rl_weight < 1`), else None."""
        return inputs.get("labels") if self.args.rl_weight < 1 else None

    def score_batch(self, model, inputs, batch: RolloutBatch) -> ScoredRollout:
        """Returns the scoring pass of the batch's samples (and gold rows for the cross-entropy term). A reused
        rollout replays the random draws of its first pass (with dropout on, the ratios then move with the weights
        only: exactly 1 at learning rate 0), and the first pass of a rollout kept for reuse records its log-probs as
        `p_old`."""
        replay = replayed_rng(batch.rng_state, self.args.device) if batch.rng_state is not None else nullcontext()
        with replay:
            scored = self.score_policy(model, inputs, batch.sample_ids, batch.group, self.gold_labels(inputs))
        if self.reuse is not None and batch.old_token_logprobs is None:
            # The rollout's first forward gives p_old: this step's ratios are 1, the cycle's later ones are not.
            batch.old_token_logprobs, batch.rng_state = scored.token_logprobs.detach(), self._policy_rng
            self.reuse.keep(self.state.global_step, self.slot, batch)
        return scored

    def algorithm_loss(self, scored: ScoredRollout, batch: RolloutBatch, inputs) -> StepLoss:
        """Returns the algorithm's loss of the scored batch, the tokens its entropy and KL terms count, and its
        metrics (implemented by each algorithm, over `hf_seqrl.losses`)."""
        raise NotImplementedError

    # The step's tail (`loss_tail`): the cross-entropy term, then the mix with − entropy and + KL.
    cross_entropy_term = loss_tail.cross_entropy_term
    finish_loss = loss_tail.finish_loss
    gold_cross_entropy = loss_tail.gold_cross_entropy
    add_regularizers = loss_tail.add_regularizers
    teacher_metrics = loss_tail.teacher_metrics

    # ---- the scoring pass's helpers -----------------------------------------------------------------

    def score_policy(self, model, inputs, token_ids, group: int, gold_labels=None, temperature: float | None = None,
                     plain: bool = False, divergence=None) -> ScoredRollout:
        """Returns the family's scoring pass of `token_ids` under the policy (with grad; at `temperature`, default the
        rollout's; the samples' temperature-1 log-probs too with `plain`; the divergence to a teacher with
        `divergence`, a `functional.lm_head.Divergence`), remembering its random state.

        With `kl_coef > 0` the KL reference runs first, on the same tokens and with the random draws the policy pass
        then makes (with dropout on, both passes thin the same units, so the KL measures the weights' difference only),
        and the policy pass reduces the KL chunk by chunk beside its log-probs."""
        args = self.args
        self._policy_rng = rng_state(args.device)
        reference = self.reference_positions(inputs, token_ids, group) if args.kl_coef > 0 else None
        options = ScoreOptions(reference, entropy_grad=args.entropy_coef > 0, plain=plain,
                               raw=self.label_smoother is not None, divergence=divergence)
        temperature = args.temperature if temperature is None else temperature
        return self.family.score(model, inputs, token_ids, group, gold_labels, temperature, options)

    def reference_positions(self, inputs, token_ids, group: int):
        """Returns the KL reference's output-layer inputs at the positions of `token_ids` (frozen), from a pass in the
        policy's mode (train or eval) that makes the draws the next policy pass makes."""
        with self.frozen_models["reference"].running(self.accelerator, self.model.training, self._policy_rng,
                                                     self.args.device) as reference:
            return self.family.reference_positions(reference, inputs, token_ids, group)

    def score_frozen(self, name: str, inputs, token_ids, group: int, temperature: float = 1.0) -> ScoredRollout:
        """Returns the scoring pass of `token_ids` `(B*n, T)` under the frozen model `name` (`frozen_models`; no
        grad): its log-probs of the policy's tokens at `temperature` and its entropy, per token."""
        with self.frozen_models[name].running(self.accelerator, self.model.training) as model:
            return self.family.score(model, inputs, token_ids, group, None, temperature)

    # ---- rewards --------------------------------------------------------------------------------

    def reward_values(self, token_ids, text: BatchText, token_mask=None) -> RewardValues:
        """Returns the rewards of the decoded `token_ids` `(N, T)` (`RewardScorer.score`; `text` holds one row per
        sequence; with `token_mask`, token-level values too); a failing reward first saves a checkpoint of the steps
        done (`save_on_error`)."""
        try:
            return self.rewards.score(token_ids, text, self.processing_class, self.state.global_step + 1, token_mask)
        except RewardError as error:
            raise self.checkpoint_on_error(error) from error.__cause__

    def checkpoint_on_error(self, error: RewardError) -> RewardError:
        """Returns `error` with what `save_on_error` did (`checkpoints.checkpoint_on_error`)."""
        return checkpoint_on_error(error, self.args, self.state.global_step, self.model.training,
                                   lambda: self._save_checkpoint(self.model, trial=None))

    def add_up_over_processes(self, totals: torch.Tensor) -> torch.Tensor:
        """Returns `totals` summed over the processes (the moments of `scale_rewards="batch"`)."""
        return self.accelerator.reduce(totals, reduction="sum") if self.accelerator.num_processes > 1 else totals

    def record_completions(self, inputs, text: BatchText, samples: RewardValues, sample_cut, unwrapped,
                           baselines=None, advantages=None, greedy_ids=None) -> None:
        """Keeps the rows of a micro-batch's samples for the sample log (`CompletionLog.add_samples`); without a
        `sources` column, the model's own input, decoded, is the source."""
        prompts = self.family.prompts(unwrapped, inputs)[0] if text.sources is None and inputs is not None else None
        self.completions.add_samples(self.state.global_step, self.args.process_index, self.processing_class, text,
                                     samples, sample_cut, prompts, baselines, advantages, greedy_ids)

    def log(self, logs, start_time=None):
        """`SeqRLBaseTrainer.log`; with `log_completions`, a periodic training log first publishes the samples of
        the last rollout (evaluation logs and the end-of-training summary carry `*_runtime` keys and do not)."""
        if self.completions is not None and not any(key.endswith("_runtime") for key in logs):
            self.completions.publish(self)
        super().log(logs, start_time)

    # ---- evaluation: greedy/beam reward next to the usual metrics ---------------------------------

    def on_generated(self, generated, inputs, text: BatchText) -> None:
        """Records `rl/reward` of the evaluation outputs (greedy or beam, as configured for generation)."""
        if text.references is None and (inputs.get("labels") is not None or not self.rewards_read_references):
            text = text._replace(references=batch_references(inputs, self.processing_class))
        if text.references is not None and self.rewards is not None:
            ids = generated.masked_fill(generated < 0, self.processing_class.pad_token_id)
            scored = self.reward_values(ids, text)
            # One entry per example, so the logged mean weighs every example alike whatever the batch sizes.
            self._record("eval", {"rl/reward": scored.rewards[~scored.left_out].tolist()})

    # ---- checkpoints ------------------------------------------------------------------------------

    def extra_state(self) -> dict:
        # The seed of the rollouts' keys goes with the run: resumed with another `seed`, it samples what it sampled.
        return {"rollout_seed": self.rollout_keys.seed, "baseline_ema": self.baseline_ema, "baseline": self.baseline}

    def load_extra_state(self, state: dict) -> None:
        if state.get("rollout_seed") is not None:
            self.rollout_keys.seed = state["rollout_seed"]
        self.baseline_ema = state.get("baseline_ema")
