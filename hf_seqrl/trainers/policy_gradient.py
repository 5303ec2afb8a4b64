"""The policy-gradient trainers: `SeqRLTrainer` (their base), `SCSTTrainer` and `ReinforceTrainer`.

One RL step follows the diagram of DESIGN.md: rollout → rewards → baseline → advantages (`BaselineTrainer`) →
log-probs → policy-gradient loss mixed with cross-entropy (+ KL, − entropy; `RolloutTrainer.finish_loss`). The math
lives in `hf_seqrl.losses`, decoding and scoring in the model family (`hf_seqrl.models`). With
`num_iterations > 1` a rollout serves several clipped updates (`reuse`).
"""

from __future__ import annotations

from .. import losses
from ..configs import SeqRLConfig
from ..types import BatchText, RolloutBatch
from .baselines import BaselineTrainer
from .reuse import RolloutReuse
from .rollout import RolloutPlan


class SeqRLTrainer(BaselineTrainer):
    """Base of the policy-gradient trainers; same constructor as `Seq2SeqTrainer` plus `reward_funcs`, `args` a
    `SeqRLConfig`."""

    algorithm = "Sequence-level RL"
    algorithm_id = "policy_gradient"
    config_class = SeqRLConfig

    def __init__(self, model=None, args: SeqRLConfig | None = None, data_collator=None, train_dataset=None,
                 eval_dataset=None, processing_class=None, reward_funcs=None, **kwargs):
        if isinstance(args, SeqRLConfig):  # checked before the (slow) Trainer set-up
            RolloutReuse.check_dataset(train_dataset, args.num_iterations)
        super().__init__(model=model, args=args, data_collator=data_collator, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, reward_funcs=reward_funcs,
                         **kwargs)
        self.reuse = RolloutReuse(self.args.num_iterations) if self.args.num_iterations > 1 else None

    def rollout_plan(self) -> RolloutPlan | None:
        plan = super().rollout_plan()
        if plan is not None and self.reuse is not None and self.reuse.holds(self.state.global_step):
            return plan._replace(from_source=False)  # this step trains on rollouts an earlier step decoded
        return plan

    def _get_train_sampler(self, train_dataset=None):
        if self.reuse is None:
            return super()._get_train_sampler(train_dataset)
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return self.reuse.sampler(dataset, self.args, lambda: self.state.global_step)

    def rl_loss(self, model, inputs, text: BatchText):
        """Returns the policy-gradient loss of a batch (clipped on reused rollouts) and records the `rl/*` metrics."""
        args, n = self.args, self.args.num_samples
        unwrapped = self.accelerator.unwrap_model(model)
        step, batch, slot = self.state.global_step, None, None
        if self.reuse is not None:
            batch, slot = self.reuse.take(step, inputs["input_ids"])
        if batch is None:
            batch = self.roll_out(unwrapped, inputs, text)
        labels = inputs.get("labels") if args.rl_weight < 1 else None
        scored = self.score_policy(model, inputs, batch.sample_ids, n, labels)
        mask, adv, metrics = batch.loss_mask, batch.advantages, dict(batch.metrics)
        if self.reuse is None:
            pg_loss = losses.policy_gradient_loss(scored.token_logprobs, mask, adv, args.length_normalize,
                                                  args.loss_normalization)
        else:
            if batch.old_token_logprobs is None:
                # The rollout's first forward gives p_old: this step's ratios are 1, the cycle's later ones are not.
                batch.old_token_logprobs = scored.token_logprobs.detach()
                self.reuse.keep(step, slot, inputs["input_ids"], batch)
            clipped = losses.clipped_policy_objective(
                scored.token_logprobs, batch.old_token_logprobs, mask, adv, args.epsilon, args.epsilon_high,
                args.length_normalize, args.loss_normalization)
            pg_loss = clipped.loss
            metrics.update({"rl/clip_fraction": clipped.clip_fraction.item(), "rl/ratio_mean": clipped.ratio_mean.item()})
        metrics["rl/pg_loss"] = pg_loss.item()
        return self.finish_loss(pg_loss, self.gold_cross_entropy(scored, labels), inputs, scored, batch.sample_ids, n,
                                batch.sample_mask, metrics)

    def roll_out(self, unwrapped, inputs, text: BatchText) -> RolloutBatch:
        """Returns the samples of a batch, their advantages and what the rollout measured (no grad)."""
        return self.rollout_batch(self.take_rollout(unwrapped, inputs), text, unwrapped, inputs)

    # ---- checkpoints: rollouts kept for reuse -------------------------------------------------------

    def save_process_state(self, folder: str) -> None:
        if self.reuse is not None:
            self.reuse.save(folder, self.args.process_index)
            self.accelerator.wait_for_everyone()  # every rollout file is on disk before the state file marks completion

    def load_process_state(self, folder: str) -> None:
        if self.reuse is not None:
            self.reuse.load(folder, self.args.process_index, self.args.device)


class SCSTTrainer(SeqRLTrainer):
    """Self-critical sequence training (Rennie et al., 2017).

    Loss: the policy gradient `-mean_i (r_i - b_i) * log p(y_i | x_i)` over sampled sequences, mixed with
    cross-entropy by `rl_weight`. Baseline: `b_i` is the reward of the greedy decode of the sample's source.
    `SeqRLConfig.baseline="mean"` with `num_samples >= 2` gives the leave-one-out mean-of-samples baseline instead
    (Kool et al., 2019; the "new self-critical" baseline of Luo, 2020), which logs and cards name as such.
    """

    default_baseline = "greedy"
    algorithm = "SCST"
    algorithm_id = "scst"
    model_families = ("seq2seq", "causal")


class ReinforceTrainer(SeqRLTrainer):
    """REINFORCE on sampled sequences (Williams, 1992).

    Loss: the policy gradient `-mean_i (r_i - b) * log p(y_i | x_i)`, mixed with cross-entropy by `rl_weight`
    (Ranzato et al., 2016; Paulus et al., 2017). Baseline: `SeqRLConfig.baseline`, by default `"moving_average"`,
    an exponential moving average of past batch rewards.
    """

    default_baseline = "moving_average"
    algorithm = "REINFORCE"
    algorithm_id = "reinforce"
    model_families = ("seq2seq", "causal")
