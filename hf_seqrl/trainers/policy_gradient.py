"""The policy-gradient trainers: `SeqRLTrainer` (their base), `SCSTTrainer` and `ReinforceTrainer`.

One RL step follows the diagram of DESIGN.md: rollout → rewards → baseline → advantages → log-probs →
policy-gradient loss mixed with cross-entropy (+ KL, − entropy). The math lives in `hf_seqrl.losses`, decoding and
scoring in the model family (`hf_seqrl.models`); these classes orchestrate and log. With `num_iterations > 1` a
rollout serves several clipped updates (`reuse`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import torch

from .. import losses
from ..configs import SeqRLConfig
from ..hub import Method, Paper
from ..models.base import ended_with_eos, eos_ids, replayed_rng, rng_state
from ..types import Rollout
from ..rewards import (PooledReward, build_reward, call_reward_parts, check_finite, check_reward_spec, combine_parts,
                       model_rewards, place_on, reward_name)
from .adapters import add_reference_adapter, is_peft_model, reference_of
from .base import SeqRLBaseTrainer
from .completions import CompletionLog, completion_rows
from .generation import RolloutKeys, RolloutsAhead, model_inputs
from .inputs import BatchText, RewardValues, repeat_rows
from .reuse import RolloutBatch, RolloutReuse

RENNIE_2017 = Paper(key="rennie2017scst", cite="Rennie et al., 2017", url="https://arxiv.org/abs/1612.00563",
                    title="Self-critical Sequence Training for Image Captioning", citation="""\
@inproceedings{rennie2017scst,
  title     = {Self-critical Sequence Training for Image Captioning},
  author    = {Rennie, Steven J. and Marcheret, Etienne and Mroueh, Youssef and Ross, Jerret and Goel, Vaibhava},
  booktitle = {IEEE Conference on Computer Vision and Pattern Recognition (CVPR)},
  year      = {2017},
  url       = {https://arxiv.org/abs/1612.00563}
}""")


WILLIAMS_1992 = Paper(key="williams1992reinforce", cite="Williams, 1992", url="https://doi.org/10.1007/BF00992696",
                      title="Simple statistical gradient-following algorithms for connectionist reinforcement learning", citation="""\
@article{williams1992reinforce,
  title   = {Simple statistical gradient-following algorithms for connectionist reinforcement learning},
  author  = {Williams, Ronald J.},
  journal = {Machine Learning},
  volume  = {8},
  pages   = {229--256},
  year    = {1992},
  doi     = {10.1007/BF00992696}
}""")


KOOL_2019 = Paper(key="kool2019buy4", cite="Kool, van Hoof & Welling, 2019", url="https://openreview.net/forum?id=r1lgTGL5DE",
                  title="Buy 4 REINFORCE Samples, Get a Baseline for Free!", citation="""\
@inproceedings{kool2019buy4,
  title     = {Buy 4 {REINFORCE} Samples, Get a Baseline for Free!},
  author    = {Kool, Wouter and van Hoof, Herke and Welling, Max},
  booktitle = {ICLR 2019 Workshop on Deep Reinforcement Learning Meets Structured Prediction},
  year      = {2019},
  url       = {https://openreview.net/forum?id=r1lgTGL5DE}
}""")


# What each baseline makes of a policy gradient; the baseline, not the trainer class, decides which algorithm ran.
BASELINE_METHODS = {
    "greedy": Method("SCST", "scst", "self-critical sequence training: policy gradient with the greedy decode's "
                     "reward as baseline", (RENNIE_2017,)),
    "mean": Method("REINFORCE with leave-one-out baseline", "rloo", "policy gradient over several samples per source; "
                   "each sample's baseline is the mean reward of the other samples of its source",
                   (WILLIAMS_1992, KOOL_2019)),
    "moving_average": Method("REINFORCE with a moving-average baseline", "reinforce", "policy gradient; the baseline "
                             "is an exponential moving average of the batch-mean reward", (WILLIAMS_1992,)),
    "none": Method("REINFORCE without baseline", "reinforce", "policy gradient on the raw sequence rewards",
                   (WILLIAMS_1992,)),
}


class SeqRLTrainer(SeqRLBaseTrainer):
    """Base of the sequence-level trainers; same constructor as `Seq2SeqTrainer`, `args` a `SeqRLConfig`."""

    default_baseline = "greedy"
    algorithm = "Sequence-level RL"
    algorithm_id = "policy_gradient"
    config_class = SeqRLConfig
    method = None  # named by the baseline that runs (`BASELINE_METHODS`) unless a subclass names its own

    @classmethod
    def method_for(cls, baseline: str | None = None) -> Method:
        """Returns the policy gradient that `baseline` (default: the trainer's) makes of this trainer: the SCST trainer
        with the leave-one-out baseline is REINFORCE with leave-one-out baseline, and any policy gradient with the
        greedy baseline is SCST. A subclass with a `method` of its own (MRT, MIXER) is named by it."""
        if cls.method is not None:
            return cls.method
        baseline = baseline if baseline not in (None, "", "None") else cls.default_baseline
        method = BASELINE_METHODS.get(baseline) or Method(
            f"REINFORCE with a {baseline} baseline", "reinforce", f"policy gradient with the `{baseline}` baseline",
            (WILLIAMS_1992,))
        return dataclasses.replace(method, baseline=baseline)

    def run_method(self) -> Method:
        return self.method_for(self.baseline)

    def __init__(self, model=None, args: SeqRLConfig | None = None, data_collator=None, train_dataset=None,
                 eval_dataset=None, processing_class=None, reward_funcs=None, **kwargs):
        if reward_funcs is None:
            raise ValueError(
                f"{type(self).__name__} needs reward_funcs=: a built-in name ('bleu', 'chrf', 'rouge1', 'rouge2', "
                "'rougeL', 'rougeLsum'), a 'module:function' path, a callable f(predictions, references, sources, "
                "**columns) -> list[float], an evaluate.EvaluationModule, or a list of these.")
        # Checked before the (slow) Trainer set-up, so that a typo fails at once.
        check_reward_spec(reward_funcs, args.reward_weights if isinstance(args, SeqRLConfig) else None)
        RolloutReuse.check_dataset(train_dataset, getattr(args, "num_iterations", 1))
        super().__init__(model=model, args=args, data_collator=data_collator, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, **kwargs)
        self.baseline = self.args.baseline or self.default_baseline
        self.reward_funcs = reward_funcs
        workers = self.args.reward_workers
        self.reward_fn = (PooledReward(reward_funcs, self.args.reward_weights, workers) if workers >= 2
                          else build_reward(reward_funcs, self.args.reward_weights))
        # A model reward runs on this process's device, outside the model that DDP / ZeRO / FSDP wrap.
        local = getattr(self.reward_fn, "local", self.reward_fn)
        if workers >= 2 and model_rewards(local):
            raise ValueError(
                f"SeqRLConfig.reward_workers={workers} scores rewards in worker processes, but reward_funcs holds a "
                "model reward, which runs batched on the trainer's device: set reward_workers=0.")
        place_on(local, self.args.device)
        self.reward_label = reward_name(self.reward_fn)
        self.baseline_ema: float | None = None
        self.ref_model, self.reference_adapter = None, None
        if self.args.kl_coef > 0:
            unwrapped = self.accelerator.unwrap_model(self.model)
            if is_peft_model(unwrapped):  # the same network with its adapter off (or a frozen copy): no second copy
                self.reference_adapter = add_reference_adapter(unwrapped)
            else:
                self.ref_model = self._build_ref_model()
        self._rollout_config = None
        self._policy_rng = None  # the RNG state of the last policy scoring pass, replayed by the reference pass
        self.reuse = RolloutReuse(self.args.num_iterations) if self.args.num_iterations > 1 else None
        self.rollout_keys = RolloutKeys(self.args.seed, self.args.process_index)
        self.rollouts_ahead = RolloutsAhead()
        self.completions = CompletionLog() if self.args.log_completions else None

    # ---- set-up helpers -------------------------------------------------------------------------

    def _build_ref_model(self):
        ref = copy.deepcopy(self.accelerator.unwrap_model(self.model)).to(self.args.device)
        ref.requires_grad_(False)
        return ref

    @contextlib.contextmanager
    def reference(self):
        """Within the context, yields the KL reference model: the frozen copy, or the policy itself with its adapter
        off (or its frozen reference adapter active)."""
        if self.ref_model is not None:
            yield self.ref_model
            return
        with reference_of(self.accelerator.unwrap_model(self.model), self.reference_adapter) as reference:
            yield reference

    def score_policy(self, model, inputs, token_ids, group: int, gold_labels=None, temperature: float | None = None):
        """Returns the family's scoring pass of `token_ids` under the policy (with grad; at `temperature`, default the
        rollout's), remembering its random state so that the reference pass draws the same dropout masks."""
        self._policy_rng = rng_state(self.args.device)
        temperature = self.args.temperature if temperature is None else temperature
        return self.family.score(model, inputs, token_ids, group, gold_labels, temperature)

    @property
    def rollout_config(self):
        if self._rollout_config is None:
            model = self.accelerator.unwrap_model(self.model)
            self._rollout_config = self.family.generation_config(
                model, self.args.max_new_tokens, self.args.temperature, self.args.top_k, self.args.top_p,
                max_length=self.args.generation_max_length,
            )
        return self._rollout_config

    @property
    def uses_rollouts(self) -> bool:
        """Whether a step after the warm-up decodes at all (not when nothing a rollout gives would reach the loss)."""
        args = self.args
        return not (args.rl_weight == 0 and args.kl_coef == 0 and args.entropy_coef == 0)

    def rollout_with_greedy(self) -> bool:
        """Returns whether a rollout decodes each source's greedy row beside its samples."""
        return self.baseline == "greedy"

    @property
    def decodes_rollouts(self) -> bool:
        """Whether a step after the warm-up draws its samples through `take_rollout` (what `steps_per_generation`
        decodes ahead)."""
        return self.uses_rollouts

    def _get_train_sampler(self, train_dataset=None):
        if self.reuse is None:
            return super()._get_train_sampler(train_dataset)
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return self.reuse.sampler(dataset, self.args, lambda: self.state.global_step)

    # ---- the loss -------------------------------------------------------------------------------

    def sequence_loss(self, model, inputs, text: BatchText, num_items_in_batch):
        args = self.args
        if not self.uses_rollouts:
            # Nothing a rollout produces would reach the loss: skip decoding and train as Seq2SeqTrainer does.
            self._record("train", {"rl/phase": 1.0})
            return self.per_batch_mean_loss(model, inputs)
        self.loss_is_scaled_for_ga = False  # per-batch mean: the Trainer divides by accumulation steps
        if args.rl_weight < 1 and inputs.get("labels") is None:
            raise ValueError(
                f"SeqRLConfig.rl_weight={args.rl_weight} mixes in cross-entropy, which needs tokenized 'labels' in the "
                "dataset: add them (tokenizer(text_target=...)) or set rl_weight=1.0 for pure RL on 'references'."
            )
        if text.references is None:
            text = text._replace(references=self._decode_labels(inputs.get("labels")))
        return self.rl_loss(model, inputs, text)

    def rl_loss(self, model, inputs, text: BatchText):
        """Returns the RL loss of a batch and records the `rl/*` metrics."""
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
            clip = (batch.old_token_logprobs, mask, adv, args.epsilon, args.epsilon_high)
            pg_loss = losses.clipped_policy_loss(scored.token_logprobs, *clip, args.length_normalize,
                                                 args.loss_normalization)
            clip_fraction, ratio_mean = losses.clip_statistics(scored.token_logprobs, *clip)
            metrics.update({"rl/clip_fraction": clip_fraction.item(), "rl/ratio_mean": ratio_mean.item()})
        xe_loss = None if labels is None else self._xe_from_logits(scored.gold_logits, labels, scored.gold_logprobs)
        loss = losses.mix_losses(pg_loss, xe_loss, args.rl_weight)
        loss = self.add_regularizers(loss, inputs, batch.sample_ids, n, scored.sample_logits, batch.sample_mask,
                                     metrics, scored.banned)
        metrics["rl/pg_loss"] = pg_loss.item()
        if xe_loss is not None:
            metrics["rl/xe_loss"] = xe_loss.item()
        self._record("train", metrics)
        return loss

    def roll_out(self, unwrapped, inputs, text: BatchText) -> RolloutBatch:
        """Returns the samples of a batch, their advantages and what the rollout measured (no grad)."""
        return self.rollout_batch(self.take_rollout(unwrapped, inputs), text, unwrapped, inputs)

    # ---- rollouts: one decode per micro-batch, or per `steps_per_generation` micro-batches ---------------------

    def take_rollout(self, unwrapped, inputs) -> Rollout:
        """Returns the rollout of a micro-batch: the one decoded ahead with other micro-batches of its optimizer step
        (`steps_per_generation > 1`), else one decoded now."""
        rollout = self.rollouts_ahead.take(inputs["input_ids"])
        return rollout if rollout is not None else self.decode_rollouts(unwrapped, [inputs])[0]

    def decode_rollouts(self, unwrapped, batches: list[dict]) -> list[Rollout]:
        """Returns the rollouts of `batches` (micro-batches of the current optimizer step, in order) from one decode,
        every sample row drawing from its own key (`RolloutKeys`)."""
        sizes = [batch["input_ids"].shape[0] for batch in batches]
        joined = batches[0] if len(batches) == 1 else self.family.join_prompts(unwrapped, batches)
        n = self.args.num_samples
        keys = self.rollout_keys.next(self.state.global_step, sum(sizes), n, joined["input_ids"].device)
        rollout = self.family.sample(unwrapped, joined, self.rollout_config, n, with_greedy=self.rollout_with_greedy(),
                                     keys=keys)
        return [rollout] if len(batches) == 1 else rollout.split(sizes)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """`Trainer.get_batch_samples` (the micro-batches of one optimizer step); with `steps_per_generation > 1`, also
        decodes their rollouts, `steps_per_generation` micro-batches per decode, before the first of them trains."""
        batches, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        steps = self.args.generation_steps
        ahead = []
        if steps > 1 and self.phase == "rl" and self.decodes_rollouts and not (
                self.reuse is not None and self.reuse.holds(self.state.global_step)):
            unwrapped = self.accelerator.unwrap_model(self.model)
            inputs = [model_inputs(batch, self.args.device) for batch in batches]
            for start in range(0, len(inputs), steps):
                group = inputs[start:start + steps]
                ahead += [(batch["input_ids"], rollout)
                          for batch, rollout in zip(group, self.decode_rollouts(unwrapped, group))]
        self.rollouts_ahead.reset(ahead)
        return batches, num_items_in_batch

    def rollout_batch(self, rollout, text: BatchText, unwrapped, inputs=None) -> RolloutBatch:
        """Returns the rewards, baseline and advantages of `rollout`'s samples and what they measure (no grad);
        keeps their rows for the sample log (`log_completions`; `inputs` gives the source texts). A sample left out
        (no reward applies, a dropped non-finite one, or its source's greedy reward is missing) gets no advantage
        and no row in the loss, and counts in no other sample's baseline or scale."""
        args, n = self.args, rollout.num_samples
        samples = self.reward_values(rollout.sample_ids, repeat_rows(text, n))
        sample_rewards, bad = samples.rewards, samples.left_out
        baseline_rewards, bad = self.baseline_rewards(sample_rewards, bad, rollout, text)
        adv = losses.advantages(sample_rewards, baseline_rewards).masked_fill(bad, 0.0)
        if args.center_advantages:
            adv = losses.center_advantages(adv, ~bad)
        if args.scale_rewards == "group":
            adv = losses.scale_advantages(adv, losses.group_std(adv, n, ~bad))
        elif args.scale_rewards == "batch":
            adv = losses.scale_advantages(adv, self.batch_std(adv, ~bad))
        metrics = self.sample_metrics(samples, bad, rollout.sample_ids, rollout.sample_mask, unwrapped)
        kept = ~bad
        if kept.any():  # what the loss sees: the samples left out have no baseline or advantage
            metrics.update({
                "rl/baseline_reward": baseline_rewards[kept].mean().item(),
                "rl/advantage_abs": adv[kept].abs().mean().item(),
                "rl/advantage_mean": adv[kept].mean().item(),
                "rl/frac_zero_advantage": (adv[kept].abs() < 1e-8).float().mean().item(),
            })
        if self.completions is not None:
            self.record_completions(inputs, text, samples, rollout.sample_ids, rollout.sample_mask, unwrapped,
                                    baseline_rewards, adv, rollout.greedy_ids)
        return RolloutBatch(rollout.sample_ids, rollout.sample_mask, adv, metrics, kept=~bad)

    def batch_std(self, adv, keep):
        """Returns the standard deviation of the kept advantages `(B*n,)` of this micro-batch on every process
        together (their moments added up over processes; NaN with fewer than 2)."""
        totals = losses.moments(adv, keep)
        if self.accelerator.num_processes > 1:
            totals = self.accelerator.reduce(totals, reduction="sum")
        return losses.std_from_moments(totals)

    def sample_metrics(self, samples: RewardValues, left_out, sample_ids, sample_mask, unwrapped) -> dict[str, float]:
        """Returns the `rl/*` metrics of the sampled sequences: reward over the samples not `left_out` (`(N,)` bool),
        each reward function's mean and std over the samples it gave a value (`RewardValues.part_rewards`), length,
        degenerate shares, and the counts of missing (None) and dropped non-finite rewards."""
        kept = samples.rewards[~left_out]
        metrics = {
            "rl/phase": 1.0,
            "rl/sample_length": sample_mask.sum(dim=1).float().mean().item(),
            # Degenerate rollouts are logged, not fatal: samples that are only EOS, or hit the length limit.
            "rl/frac_empty": (sample_mask.sum(dim=1) <= 1).float().mean().item(),
            "rl/frac_truncated": (~ended_with_eos(sample_ids, sample_mask, eos_ids(unwrapped))).float().mean().item(),
        }
        if kept.numel():
            metrics["rl/reward"] = kept.mean().item()
            metrics["rl/reward_std"] = kept.std().item() if kept.numel() > 1 else 0.0
        for name, values in samples.part_rewards().items():
            values = values[torch.isfinite(values)]
            if values.numel():
                metrics[f"rl/rewards/{name}/mean"] = values.mean().item()
                metrics[f"rl/rewards/{name}/std"] = values.std().item() if values.numel() > 1 else 0.0
        missing = samples.missing()
        metrics["rl/missing_rewards"] = float(missing)
        if self.args.nonfinite_rewards == "drop":
            metrics["rl/nonfinite_rewards"] = float(samples.left_out.sum().item() - missing)
        return metrics

    def add_regularizers(self, loss, inputs, token_ids, group: int, logits, token_mask, metrics: dict, banned=None):
        """Returns `loss - entropy_coef * entropy (+ kl_coef * KL)` over the counted tokens; records both. Both are
        those of the rollout distribution: `banned` (`ScoredRollout.banned`) entries excluded."""
        args = self.args
        with torch.set_grad_enabled(args.entropy_coef > 0):
            entropy = losses.masked_mean(losses.token_entropy(logits, banned).flatten(), token_mask.flatten(), 0)
        if args.entropy_coef > 0:
            loss = loss - args.entropy_coef * entropy
        if args.kl_coef > 0:
            kl = self._kl(inputs, token_ids, group, logits, token_mask, banned)
            loss = loss + args.kl_coef * kl
            metrics["rl/kl"] = kl.item()
        metrics["rl/entropy"] = entropy.item()
        return loss

    def compute_rewards(self, token_ids, text: BatchText):
        """Returns `(rewards, left_out)`: rewards of decoded `token_ids` (float tensor `(N,)`, 0 where left out) and
        a bool mask of the sequences without a usable reward (see `reward_values`).

        `text` holds one row per sequence of `token_ids` (see `repeat_rows`).
        """
        scored = self.reward_values(token_ids, text)
        return scored.rewards, scored.left_out

    def reward_values(self, token_ids, text: BatchText) -> RewardValues:
        """Returns the decoded `token_ids` `(N, T)`, their rewards and each reward function's values (scored once;
        the rewards are the parts' weighted sum). `text` holds one row per sequence (see `repeat_rows`). A sequence
        no reward applies to (`None`) is left out, and so is a non-finite reward with `nonfinite_rewards="drop"`."""
        predictions = self.processing_class.batch_decode(token_ids, skip_special_tokens=True)
        parts = call_reward_parts(self.reward_fn, predictions, text.references, text.sources, text.columns,
                                  name=self.reward_label, batch_index=self.state.global_step)
        values = combine_parts(self.reward_fn, parts)
        if self.args.nonfinite_rewards == "error":
            check_finite(values, self.reward_label)
        numbers = [float("nan") if value is None else value for value in values]
        rewards = torch.tensor(numbers, dtype=torch.float32, device=token_ids.device)
        left_out = ~torch.isfinite(rewards)
        return RewardValues(predictions, values, parts, rewards.masked_fill(left_out, 0.0), left_out)

    def record_completions(self, inputs, text: BatchText, samples: RewardValues, sample_ids, sample_mask, unwrapped,
                           baselines=None, advantages=None, greedy_ids=None) -> None:
        """Keeps the rows of a micro-batch's samples for the sample log (`hf_seqrl.trainers.completions`).

        Args:
            text: the batch's `B` rows; samples: the `B*n` samples' `RewardValues`.
            sample_ids, sample_mask (`(B*n, T)`): the samples, for the length-limit flag.
            baselines, advantages (`torch.Tensor` of shape `(B*n,)`, *optional*); greedy_ids (`(B, T')`, *optional*).
        """
        n = sample_ids.shape[0] // len(text.references)
        decode = self.processing_class.batch_decode
        sources = text.sources
        if sources is None and inputs is not None:  # no `sources` column: the model's own input, decoded
            sources = decode(self.family.prompts(unwrapped, inputs)[0], skip_special_tokens=True)
        greedy = None if greedy_ids is None else decode(greedy_ids, skip_special_tokens=True)
        per_sample = repeat_rows(text._replace(sources=sources), n)
        truncated = ~ended_with_eos(sample_ids, sample_mask, eos_ids(unwrapped))
        rows = completion_rows(
            self.state.global_step + 1, self.args.process_index, n, samples.predictions, per_sample.references,
            samples.parts, samples.values, per_sample.sources,
            None if greedy is None else [g for g in greedy for _ in range(n)],
            None if baselines is None else baselines.tolist(), None if advantages is None else advantages.tolist(),
            truncated.tolist(), per_sample.columns)
        self.completions.add(self.state.global_step, rows)

    def baseline_rewards(self, sample_rewards, bad, rollout, text: BatchText):
        """Returns `(baseline (B*n,), left-out mask (B*n,))` for the configured baseline: the samples left out are out
        of their siblings' leave-one-out means, and a source whose greedy reward is missing leaves its samples out."""
        n = rollout.num_samples
        if self.baseline == "greedy":
            greedy, greedy_bad = self.compute_rewards(rollout.greedy_ids, text)
            return greedy.repeat_interleave(n), bad | greedy_bad.repeat_interleave(n)
        if self.baseline == "mean":
            return losses.leave_one_out_baseline(sample_rewards, n, ~bad), bad
        if self.baseline == "moving_average":
            good = sample_rewards[~bad]
            if not good.numel():  # no reward in this batch: nothing to average in, and no advantage to give
                return torch.full_like(sample_rewards, self.baseline_ema or 0.0), bad
            batch_mean = good.mean().item()
            current = self.baseline_ema if self.baseline_ema is not None else batch_mean
            self.baseline_ema = losses.moving_average(self.baseline_ema, batch_mean, self.args.baseline_ema_decay)
            return torch.full_like(sample_rewards, current), bad
        return torch.zeros_like(sample_rewards), bad

    def _kl(self, inputs, token_ids, group: int, logits, token_mask, banned=None):
        """Returns the mean per-token KL(policy || frozen reference) over the counted positions of `token_ids`.

        The reference runs in the policy's mode (train or eval) and replays the policy pass's random draws: with
        dropout on, both passes thin the same units, so the KL measures the weights' difference only."""
        # The frozen copy was never prepared by Accelerate, so its forward is not autocast as the policy's is.
        with self.reference() as reference, torch.no_grad(), self.accelerator.autocast(), \
                replayed_rng(self._policy_rng, self.args.device):
            reference.train(self.model.training)
            ref = self.family.score(reference, inputs, token_ids, group, temperature=self.args.temperature)
        kl = losses.token_kl(logits, ref.sample_logits, banned)
        return losses.masked_mean(kl.flatten(), token_mask.flatten(), 0)

    def _decode_labels(self, labels):
        if labels is None:
            raise ValueError(
                "The batch has neither 'references' nor 'labels': rewards need references. Add a 'references' "
                "column (string or list of strings per row) or tokenized 'labels'."
            )
        ids = labels.masked_fill(labels == -100, self.processing_class.pad_token_id)
        texts = self.processing_class.batch_decode(ids, skip_special_tokens=True)
        for i, text in enumerate(texts):
            if not text.strip():
                raise ValueError(
                    f"Row {i} of the batch has no reference: its labels are all -100/padding. Fix or drop that row."
                )
        return [[t] for t in texts]

    # ---- sample logs ------------------------------------------------------------------------------

    def log(self, logs, start_time=None):
        """`SeqRLBaseTrainer.log`; with `log_completions`, a periodic training log first publishes the samples of
        the last rollout (evaluation logs and the end-of-training summary carry `*_runtime` keys and do not)."""
        if self.completions is not None and not any(key.endswith("_runtime") for key in logs):
            self.completions.publish(self)
        super().log(logs, start_time)

    # ---- evaluation: greedy/beam reward next to the usual metrics ---------------------------------

    def on_generated(self, generated, inputs, text: BatchText) -> None:
        """Records `rl/reward` of the evaluation outputs (greedy or beam, as configured for generation)."""
        if text.references is None and inputs.get("labels") is not None:
            text = text._replace(references=self._decode_labels(inputs["labels"]))
        if text.references is not None:
            ids = generated.masked_fill(generated < 0, self.processing_class.pad_token_id)
            rewards, left_out = self.compute_rewards(ids, text)
            # One entry per example, so the logged mean weighs every example alike whatever the batch sizes.
            self._metrics["eval"]["rl/reward"].extend(rewards[~left_out].tolist())

    # ---- checkpoints ------------------------------------------------------------------------------

    def extra_state(self) -> dict:
        # The seed of the rollouts' keys goes with the run: resumed with another `seed`, it samples what it sampled.
        return {"baseline_ema": self.baseline_ema, "baseline": self.baseline, "rollout_seed": self.rollout_keys.seed}

    def load_extra_state(self, state: dict) -> None:
        self.baseline_ema = state.get("baseline_ema")
        if state.get("rollout_seed") is not None:
            self.rollout_keys.seed = state["rollout_seed"]

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
