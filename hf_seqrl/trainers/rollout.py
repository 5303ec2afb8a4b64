"""`RolloutTrainer`: the one rewarded trainer. It runs an objective (`hf_seqrl.objectives`): the algorithm picks its
objective class, and one step (`rl_loss`) reads top to bottom in one function: the rollout, or the one kept from an
earlier step of a reuse cycle → rewards → advantages (or the objective's own weights) → the scoring pass → the
objective's loss → the mix with cross-entropy, entropy and KL. Besides the step it holds the services an objective's
stages call (`objectives.base.Runner`): the rollout decode (one per micro-batch, or one per `steps_per_generation`
micro-batches decoded ahead), the rewards, the scoring pass under the policy and the KL reference, frozen models and
the sample logs. The math lives in `hf_seqrl.losses` and `hf_seqrl.functional`.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from .. import losses
from ..configs import BaselineConfig, RolloutConfig
from ..configs.rollout import check_aggregation
from ..functional import advantages as functional_advantages
from ..models.base import replayed_rng, rng_state
from ..models.languages import decode_texts
from ..models.scoring import ScoreOptions
from ..objectives.base import Defaults, Objective, RolloutPlan, StepContext
from ..papers import Method
from ..rewards import RewardError, reference_rewards
from ..rewards.convention import check_reward_spec
from ..types import BatchText, Rollout, RolloutBatch, RewardValues, ScoredRollout, repeat_rows
from .base import SeqRLBaseTrainer
from .services.checkpoints import checkpoint_on_error
from .services.completions import CompletionLog
from .services.frozen import FrozenModel
from .services.generation import RolloutKeys, RolloutSource, model_inputs
from .services.inputs import load_model
from .services.reuse import RolloutReuse
from .services.reward_scorer import RewardScorer, batch_references, sample_metrics


class RolloutTrainer(SeqRLBaseTrainer):
    """The rewarded trainer: same constructor as `Seq2SeqTrainer` plus `reward_funcs` (and `teacher_model`), `args`
    the objective's config. A subclass picks its objective (`objective_class`, an `objectives.base.Objective`) and,
    where it differs from the objective's, its `defaults` record; its trainer-level names (`config_class`,
    `algorithm_id`, `model_families`, what `disable_dropout=None` means, ...) are read from that record.

    SCSTTrainer, ReinforceTrainer, MRTTrainer, MixerTrainer, DistillationTrainer and BestOfNTrainer
    (`hf_seqrl.trainers.rewarded`) are each a few lines that pick one."""

    config_class = RolloutConfig
    objective_class: type[Objective] | None = None
    defaults: Defaults | None = None

    def __init_subclass__(cls, **kwargs):
        """Reads a subclass's trainer-level names from its objective's defaults, declared once there."""
        super().__init_subclass__(**kwargs)
        if cls.objective_class is not None:
            # A class that picks another objective without a record of its own takes the objective's.
            own_objective = "objective_class" in cls.__dict__ and "defaults" not in cls.__dict__
            defaults = cls.objective_class.defaults if own_objective or cls.defaults is None else cls.defaults
            cls.defaults, cls.config_class, cls.algorithm_id = defaults, defaults.config_class, defaults.algorithm_id
            cls.model_families, cls.default_disable_dropout = defaults.model_families, defaults.disable_dropout
            cls.default_baseline, cls.needs_rewards = defaults.baseline, defaults.needs_rewards
            cls.reads_targets = defaults.reads_targets

    default_baseline: str | None = None
    needs_rewards = True
    reads_targets = None  # sources alone train it, unless its settings or rewards read targets (`target_settings`)

    def __init__(self, model=None, args: RolloutConfig | None = None, data_collator=None, train_dataset=None,
                 eval_dataset=None, processing_class=None, reward_funcs=None, teacher_model=None, **kwargs):
        if self.objective_class is None:
            raise TypeError("RolloutTrainer runs an objective: use a trainer that picks one (SCSTTrainer, "
                            "MRTTrainer, ...) or subclass RolloutTrainer with `objective_class = YourObjective`.")
        if reward_funcs is None and self.needs_rewards:
            raise ValueError(
                f"{type(self).__name__} needs reward_funcs=: a built-in name ('bleu', 'chrf', 'rouge1', 'rouge2', "
                "'rougeL', 'rougeLsum'), a 'module:function' path, a callable f(predictions, references, sources, "
                "**columns) -> list[float], an evaluate.EvaluationModule, or a list of these.")
        # Checked before the (slow) Trainer set-up, so that a typo fails at once.
        self.objective_class.check_arguments(reward_funcs, teacher_model, args)
        if reward_funcs is not None:
            weights = args.reward_weights if isinstance(args, RolloutConfig) else None
            check_reward_spec(reward_funcs, weights, f"{type(args).__name__}.reward_weights")
        if isinstance(args, BaselineConfig):
            check_aggregation(args, args.baseline or self.default_baseline)
        num_iterations = getattr(args, "num_iterations", 1) if self.objective_class.reuses_rollouts else 1
        RolloutReuse.check_dataset(train_dataset, num_iterations)
        self.reward_funcs = reward_funcs  # read by the dataset checks of `SeqRLBaseTrainer.__init__`
        super().__init__(model=model, args=args, data_collator=data_collator, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, **kwargs)
        self.rewards = None if reward_funcs is None else RewardScorer(reward_funcs, self.args)
        # Whether a reward scores against references (`rewards.reference_rewards`); the others score rows without any.
        self.rewards_read_references = bool(reward_funcs is not None and reference_rewards(reward_funcs))
        unwrapped = self.accelerator.unwrap_model(self.model)
        # Models scored on the policy's tokens without training (`services.frozen`), by name.
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
        self.objective: Objective = self.objective_class(self.args, self.baseline)
        self.baseline_ema: float | None = None  # the moving-average baseline's state
        self._rollout_config = None
        self.rollout_keys = RolloutKeys(self.args.seed, self.args.process_index)
        self.rollout_source = RolloutSource()
        # The rollouts kept for the later steps of a cycle (clipped multi-update steps, `num_iterations > 1`).
        self.reuse = RolloutReuse(num_iterations) if num_iterations > 1 else None
        self.completions = CompletionLog() if self.args.log_completions else None
        self.objective.check_models(self)

    @property
    def method(self) -> Method:
        """What logs and cards say of the objective as configured (`Objective.method`)."""
        return self.objective.method

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
        """Returns how the current training step (after the warm-up) rolls out (`Objective.rollout_plan`), or None
        when it decodes nothing: nothing a rollout gives would reach the loss (`rl_weight`, `kl_coef` and
        `entropy_coef` all 0), and the step trains as `Seq2SeqTrainer` does. A step whose rollouts an earlier step of
        its reuse cycle kept decodes nothing from the source."""
        args, step = self.args, self.state.global_step
        if args.rl_weight == 0 and args.kl_coef == 0 and args.entropy_coef == 0:
            return None
        plan = self.objective.rollout_plan(step)
        return plan._replace(from_source=False) if self.reuse is not None and self.reuse.holds(step) else plan

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
                epsilon_cutoff=self.args.epsilon_cutoff,
                max_length=self.args.generation_max_length,
            )
        return self._rollout_config

    def take_rollout(self, ctx: StepContext) -> Rollout:
        """Returns the rollout of the micro-batch in training (`ctx.slot`): the one decoded ahead with the other
        micro-batches of its optimizer step (`steps_per_generation > 1`), else one decoded now."""
        rollout = self.rollout_source.take(ctx.step, ctx.slot)
        return rollout if rollout is not None else self.decode_rollouts(ctx.unwrapped, [ctx.inputs])[0]

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

    # ---- the step ---------------------------------------------------------------------------------

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
        return self.rl_loss(model, inputs, text)

    def rl_loss(self, model, inputs, text: BatchText):
        """Returns the loss of a micro-batch after the warm-up and records its metrics: the whole step, in order
        (docs/architecture.md, "One RL step"); the objective's stages are the calls on `objective`."""
        args, objective, step = self.args, self.objective, self.state.global_step
        ctx = StepContext(inputs, text, self.accelerator.unwrap_model(model), step,
                          self.rollout_source.next_slot(step), objective.on_policy(step))
        # 1. The rollout: kept from the first step of its reuse cycle (`num_iterations > 1`), or decoded (ahead with
        #    the other micro-batches of the optimizer step, or now), then rewards → advantages or the objective's
        #    own weights.
        batch = self.reuse.take(step, ctx.slot) if self.reuse is not None else None
        if batch is None:
            rollout = objective.rollout(self, ctx)
            batch = objective.weigh(self, rollout, ctx)
        # 2. The scoring pass: the KL reference first, then the policy. A reused rollout replays the random draws of
        #    its first pass (with dropout on, the ratios then move with the weights only), whose log-probs are p_old.
        replay = replayed_rng(batch.rng_state, args.device) if batch.rng_state is not None else nullcontext()
        with replay:
            scored = objective.score(self, model, batch, ctx)
        if self.reuse is not None and batch.old_token_logprobs is None:
            batch.old_token_logprobs, batch.rng_state = scored.token_logprobs.detach(), ctx.policy_rng
            self.reuse.keep(step, ctx.slot, batch)
        # 3. The objective's loss, and the tokens its entropy and KL terms count.
        loss, token_mask, metrics = objective.loss(scored, batch, ctx)
        # 4. Mixed with cross-entropy by `rl_weight`, minus `entropy_coef` x entropy, plus `kl_coef` x KL.
        xe_loss = objective.cross_entropy(self, scored, batch, ctx)
        loss = losses.mix_losses(loss, xe_loss, args.rl_weight)
        terms = losses.regularize(loss, scored.entropy, token_mask, args.entropy_coef, scored.kl, args.kl_coef)
        if bool(token_mask.any()):
            metrics["rl/entropy"] = terms.entropy.item()
            if terms.kl is not None:
                metrics["rl/kl"] = terms.kl.item()
        if objective.reports_teacher and "teacher" in self.frozen_models:
            metrics.update(self.teacher_metrics(inputs, scored, batch.sample_ids, batch.group, token_mask))
        if xe_loss is not None:
            metrics["rl/xe_loss"] = xe_loss.item()
        self._record("train", metrics)
        return terms.loss

    # ---- the services an objective's stages call (`objectives.base.Runner`) -----------------------------

    def sample_advantages(self, rollout: Rollout, ctx: StepContext) -> RolloutBatch:
        """Returns the rewards, baseline and advantages of `rollout`'s samples and what they measure (no grad);
        keeps their rows for the sample log (`log_completions`). The advantages are
        `hf_seqrl.functional.advantages.sample_advantages`: a sample left out (no reward applies, a dropped non-finite
        one, or its source's greedy reward is missing) gets no advantage and no row in the loss, and counts in no
        other sample's baseline or scale. This trainer keeps the moving average and sums the batch's moments over
        processes."""
        args, n, text = self.args, rollout.num_samples, ctx.text
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
            self.record_completions(ctx, samples, rollout.sample_cut, baselines, adv, rollout.greedy_ids)
        if samples.token_values is not None:  # token-level rewards: each token's value beside the sentence's
            adv = functional_advantages.token_level_advantages(adv, samples.token_values, rollout.sample_mask,
                                                               args.token_reward_to_go)
        return RolloutBatch(rollout.sample_ids, rollout.sample_mask, adv, metrics, kept=kept, group=n,
                            rewards=samples.rewards)

    def unrewarded_batch(self, rollout: Rollout, ctx: StepContext,
                         predictions: list[str] | None = None) -> RolloutBatch:
        """Returns the samples without a reward: their length and truncation metrics (`sample_metrics`) and, with
        `log_completions`, their rows for the sample log, with no reward, baseline or advantage. `predictions`: the
        samples decoded, when the caller has them (else decoded here)."""
        n = rollout.num_samples
        if predictions is None:
            predictions = decode_texts(self.processing_class, rollout.sample_ids)
        metrics = sample_metrics(predictions, rollout.sample_mask, rollout.sample_cut, repeat_rows(ctx.text, n))
        if self.completions is not None:
            none = torch.ones(len(predictions), dtype=torch.bool)
            samples = RewardValues(predictions, [None] * len(predictions), {}, torch.zeros(len(predictions)), none)
            self.record_completions(ctx, samples, rollout.sample_cut)
        return RolloutBatch(rollout.sample_ids, rollout.sample_mask, None, metrics, group=n)

    def gold_labels(self, inputs):
        """Returns the gold labels the cross-entropy term needs (`rl_weight < 1`), else None."""
        return inputs.get("labels") if self.args.rl_weight < 1 else None

    def gold_cross_entropy(self, scored: ScoredRollout, labels):
        """Returns the cross-entropy of the gold `labels` from the scoring pass `scored`, or None without labels."""
        if labels is None:
            return None
        return self.cross_entropy_of(scored.gold_logprobs, labels, scored.raw_logprobs, scored.raw_logprob_sums,
                                     scored.vocab_size)

    def score_policy(self, model, ctx: StepContext, token_ids, group: int, gold_labels=None,
                     temperature: float | None = None, plain: bool = False, divergence=None) -> ScoredRollout:
        """Returns the family's scoring pass of `token_ids` under the policy (with grad; at `temperature`, default the
        rollout's; the samples' temperature-1 log-probs too with `plain`; the divergence to a teacher with
        `divergence`, a `functional.lm_head.Divergence`), its random state kept in `ctx.policy_rng`.

        With `kl_coef > 0` the KL reference runs first, on the same tokens and with the random draws the policy pass
        then makes (with dropout on, both passes thin the same units, so the KL measures the weights' difference only),
        and the policy pass reduces the KL chunk by chunk beside its log-probs."""
        args = self.args
        ctx.policy_rng = rng_state(args.device)
        reference = self.reference_positions(ctx, token_ids, group) if args.kl_coef > 0 else None
        options = ScoreOptions(reference, entropy_grad=args.entropy_coef > 0, plain=plain,
                               raw=self.label_smoother is not None, divergence=divergence)
        temperature = args.temperature if temperature is None else temperature
        return self.family.score(model, ctx.inputs, token_ids, group, gold_labels, temperature, options)

    def reference_positions(self, ctx: StepContext, token_ids, group: int):
        """Returns the KL reference's output-layer inputs at the positions of `token_ids` (frozen), from a pass in the
        policy's mode (train or eval) that makes the draws the next policy pass makes (`ctx.policy_rng`)."""
        with self.frozen_models["reference"].running(self.accelerator, self.model.training, ctx.policy_rng,
                                                     self.args.device) as reference:
            return self.family.reference_positions(reference, ctx.inputs, token_ids, group)

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

    def teacher_metrics(self, inputs, scored: ScoredRollout, token_ids, group: int, token_mask) -> dict[str, float]:
        """Returns what the frozen `teacher` says of the samples `token_ids` over the counted tokens `token_mask`:
        `rl/teacher_logprob`, its mean log-prob of the policy's tokens, and at temperature 1 `rl/teacher_kl`
        (`losses.sampled_kl`)."""
        if not bool(token_mask.any()):
            return {}
        teacher = self.score_frozen("teacher", inputs, token_ids, group).token_logprobs
        metrics = {"rl/teacher_logprob": losses.masked_mean(teacher.flatten(), token_mask.flatten(), 0).item()}
        if self.args.temperature == 1.0:
            metrics["rl/teacher_kl"] = losses.sampled_kl(scored.token_logprobs, teacher, token_mask).item()
        return metrics

    def record_completions(self, ctx: StepContext, samples: RewardValues, sample_cut, baselines=None,
                           advantages=None, greedy_ids=None) -> None:
        """Keeps the rows of a micro-batch's samples for the sample log (`CompletionLog.add_samples`); without a
        `sources` column, the model's own input, decoded, is the source."""
        text = ctx.text
        prompts = self.family.prompts(ctx.unwrapped, ctx.inputs)[0] if text.sources is None else None
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

    # ---- rollouts kept for reuse: the sampler that repeats a step's rows, their checkpoint files -----------

    def _get_train_sampler(self, train_dataset=None):
        if self.reuse is None:
            return super()._get_train_sampler(train_dataset)
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return self.reuse.sampler(dataset, self.args, lambda: self.state.global_step)

    def save_process_state(self, folder: str) -> None:
        if self.reuse is not None:
            self.reuse.save(folder, self.args.process_index)
            self.accelerator.wait_for_everyone()  # every rollout file is on disk before the state file marks completion

    def load_process_state(self, folder: str) -> None:
        if self.reuse is not None:
            self.reuse.load(folder, self.args.process_index, self.args.device)

    # ---- checkpoints ------------------------------------------------------------------------------

    def extra_state(self) -> dict:
        # The seed of the rollouts' keys goes with the run: resumed with another `seed`, it samples what it sampled.
        return {"rollout_seed": self.rollout_keys.seed, "baseline_ema": self.baseline_ema, "baseline": self.baseline}

    def load_extra_state(self, state: dict) -> None:
        if state.get("rollout_seed") is not None:
            self.rollout_keys.seed = state["rollout_seed"]
        self.baseline_ema = state.get("baseline_ema")
