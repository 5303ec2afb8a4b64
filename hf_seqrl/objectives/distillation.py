"""Distillation: a student trained toward a frozen teacher's next-token distributions (on-policy
distillation, Agarwal et al., 2024; word- and sequence-level knowledge distillation, Kim & Rush, 2016).

One step, as every objective's (`RolloutTrainer.rl_loss`): the tokens to train on (the student's own samples
on the optimizer steps drawn on-policy, `lmbda` of them; else the gold targets, or with `seq_kd` the teacher's beam
decodes) → rewards and advantages when a sequence reward is given → the scoring pass, the teacher's output-layer
inputs at the same positions handed to the student's pass, which reduces the divergence slice by slice over the
vocabulary → the divergence per counted token (`functional.divergences.generalized_jsd`'s math), or the sampled
reverse KL as a policy gradient with per-token advantages (`functional.divergences.reverse_kl_advantages`) → the
shared tail.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from transformers.utils import logging

from .. import losses
from ..configs.distillation import DistillationConfig
from ..functional.divergences import reverse_kl_advantages
from ..functional.lm_head import Divergence
from ..models import family_for
from ..models.base import decode_budget
from ..models.tokens import pad_id
from ..papers import Method, Paper
from ..types import Rollout, RolloutBatch, ScoredRollout
from .base import Defaults, Objective, RolloutPlan, Runner, StepContext, StepLoss

logger = logging.get_logger(__name__)

AGARWAL_2024 = Paper(key="agarwal2024gkd", cite="Agarwal et al., 2024", url="https://openreview.net/forum?id=3zKtaqxLhW",
                     title="On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes",
                     citation="""\
@inproceedings{agarwal2024gkd,
  title     = {On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes},
  author    = {Agarwal, Rishabh and Vieillard, Nino and Zhou, Yongchao and Stanczyk, Piotr and Garea, Sabela Ramos and
               Geist, Matthieu and Bachem, Olivier},
  booktitle = {The Twelfth International Conference on Learning Representations},
  year      = {2024},
  url       = {https://openreview.net/forum?id=3zKtaqxLhW}
}""")
KIM_RUSH_2016 = Paper(key="kim2016sequence", cite="Kim & Rush, 2016", url="https://aclanthology.org/D16-1139/",
                      title="Sequence-Level Knowledge Distillation", citation="""\
@inproceedings{kim2016sequence,
  title     = {Sequence-Level Knowledge Distillation},
  author    = {Kim, Yoon and Rush, Alexander M.},
  booktitle = {Proceedings of the 2016 Conference on Empirical Methods in Natural Language Processing},
  year      = {2016},
  url       = {https://aclanthology.org/D16-1139/}
}""")


def on_policy_step(seed: int, step: int, lmbda: float) -> bool:
    """Returns whether optimizer step `step` trains on the student's own samples: a draw from `seed` and `step`
    alone, below `lmbda` (every process and a resumed run draw alike)."""
    if lmbda >= 1.0 or lmbda <= 0.0:
        return lmbda >= 1.0
    return random.Random(seed * 1_000_003 + step).random() < lmbda


@dataclass
class DistillationBatch(RolloutBatch):
    """The rows distillation trains on (`RolloutBatch`: the student's samples, or the gold / teacher targets) plus,
    with the sampled estimator, the teacher's log-probs of their tokens `(N, T)` (written by the scoring stage)."""

    teacher_logprobs: torch.Tensor | None = None


class Distillation(Objective):
    """On-policy distillation and knowledge distillation from a teacher with the student's tokenizer.

    Loss: the divergence `beta` selects between the student's and the teacher's next-token distributions, averaged
    over the counted tokens of the student's samples (on-policy steps) or of the gold / teacher targets; with
    `reward_funcs` the policy gradient of that reward is added (its baseline from `baseline`). Dropout off by
    default: the divergence compares the distribution the student samples from with the teacher's. Logs
    `distill/divergence`, `distill/on_policy` and, with the sampled estimator, `rl/teacher_logprob` and
    `distill/reverse_kl`.
    """

    defaults = Defaults(algorithm_id="distill", config_class=DistillationConfig, baseline="moving_average",
                        disable_dropout=True, needs_rewards=False, needs_teacher=True)
    reports_teacher = False  # the loss records what the teacher said (`distill/*`), from the pass it already ran

    @property
    def method(self) -> Method:
        args = self.args
        what = {0.0: "forward KL(teacher || student)", 1.0: "reverse KL(student || teacher)"}.get(
            args.beta, f"generalized JSD (beta={args.beta})")
        on = "on the student's own samples" if args.lmbda == 1 else \
            f"on the student's own samples for {args.lmbda:g} of the steps" if args.lmbda > 0 else \
            ("on the teacher's beam outputs" if args.seq_kd else "on gold prefixes")
        papers = (AGARWAL_2024,) if args.lmbda > 0 else (KIM_RUSH_2016,)
        return Method("On-policy distillation" if args.lmbda > 0 else "Knowledge distillation", "distillation",
                      f"the {what} to a teacher's next-token distributions, {on}", papers)

    @classmethod
    def check_arguments(cls, reward_funcs, teacher_model, args) -> None:
        if teacher_model is None:
            raise ValueError("DistillationTrainer needs teacher_model=: a model, a Hub id or a folder of the "
                             "student's family with the student's tokenizer.")

    def check_models(self, runner: Runner) -> None:
        teacher = runner.frozen_models["teacher"].model
        if family_for(teacher).name != runner.family.name:
            raise ValueError(f"teacher_model is a {family_for(teacher).name} model and the student a "
                             f"{runner.family.name} one: the token-level divergence needs a teacher of the student's "
                             "family and tokenizer (for a teacher with another tokenizer, reward with "
                             "rewards.TeacherLikelihoodReward).")
        if self.args.log_completions and self.args.lmbda == 0 and self.args.process_index == 0:
            logger.warning(f"{type(self.args).__name__}.log_completions=True logs the student's own samples, and "
                           "lmbda=0 trains on none (every step is on the gold or the teacher's targets): no sample log "
                           "will be written. Set lmbda > 0 to sample, or log_completions=False.")

    def on_policy(self, step: int) -> bool:
        """Returns whether optimizer step `step` trains on the student's own samples (`on_policy_step`)."""
        return on_policy_step(self.args.seed, step, self.args.lmbda)

    def rollout_plan(self, step: int) -> RolloutPlan:
        # An off-policy step trains on given targets: nothing to decode ahead.
        return RolloutPlan(from_source=self.on_policy(step), greedy=self.baseline == "greedy")

    def rollout(self, runner: Runner, ctx: StepContext) -> Rollout:
        """The student's samples on an on-policy step; else the targets it trains on: the teacher's beam decodes
        (`seq_kd`) or the gold targets, one row per source."""
        if ctx.on_policy:
            return runner.take_rollout(ctx)
        if self.args.seq_kd:
            teacher = runner.frozen_models["teacher"].model
            ids, mask = runner.family.beam_search(teacher, ctx.inputs, self.args.seq_kd_num_beams, 1,
                                                  decode_budget(runner.rollout_config))
        else:
            labels = runner.family.target_labels(ctx.inputs)
            mask = labels != -100
            ids = labels.masked_fill(~mask, pad_id(ctx.unwrapped))
        return Rollout(ids, mask.bool(), None, None, 1, torch.zeros(ids.shape[0], dtype=torch.bool,
                                                                    device=ids.device))

    def weigh(self, runner: Runner, rollout: Rollout, ctx: StepContext) -> DistillationBatch:
        """The rewards and advantages of the student's samples when a reward is given (`Runner.sample_advantages`);
        without one, the samples with what they measure and no advantage (`Runner.unrewarded_batch`); off-policy,
        the tokens alone."""
        if ctx.on_policy and runner.rewards is not None:
            batch = runner.sample_advantages(rollout, ctx)
        elif ctx.on_policy:
            batch = runner.unrewarded_batch(rollout, ctx)
        else:
            batch = RolloutBatch(rollout.sample_ids, rollout.sample_mask, None, group=rollout.num_samples)
        batch.metrics["distill/on_policy"] = float(ctx.on_policy)
        return DistillationBatch(**vars(batch))

    def gold_step(self, ctx: StepContext, label_smoothing: bool) -> bool:
        """Returns whether this step's rows are the gold targets themselves (off-policy, no `seq_kd`) and their scoring
        pass gives the cross-entropy too (temperature 1, no label smoothing): the gold rows are then scored once."""
        return not self.args.seq_kd and self.args.temperature == 1.0 and not label_smoothing and not ctx.on_policy

    def gold_labels(self, runner: Runner, ctx: StepContext):
        return None if self.gold_step(ctx, runner.label_smoother is not None) else runner.gold_labels(ctx.inputs)

    def score(self, runner: Runner, model, batch: DistillationBatch, ctx: StepContext) -> ScoredRollout:
        """The student's scoring pass over the batch's tokens; with the full estimator the teacher's output-layer
        inputs at the same positions go into it (the divergence, a slice of the vocabulary at a time); with the sampled
        one the teacher scores the student's tokens (kept in `batch.teacher_logprobs`)."""
        args, ids, group, inputs = self.args, batch.sample_ids, batch.group, ctx.inputs
        if args.divergence_estimator == "sampled":
            batch.teacher_logprobs = runner.score_frozen("teacher", inputs, ids, group, args.temperature).token_logprobs
            return runner.score_policy(model, ctx, ids, group, self.gold_labels(runner, ctx))
        frozen = runner.frozen_models["teacher"]
        with frozen.running(runner.accelerator, runner.model.training) as teacher:
            positions = runner.family.reference_positions(teacher, inputs, ids, group).narrowed(frozen.width)
        return runner.score_policy(model, ctx, ids, group, self.gold_labels(runner, ctx),
                                   divergence=Divergence(positions, args.beta, args.temperature))

    def loss(self, scored: ScoredRollout, batch: DistillationBatch, ctx: StepContext) -> StepLoss:
        """The mean divergence per counted token (full estimator), or the policy gradient over the per-token
        advantages `-(log p_s - log p_t)` (sampled); plus the sequence reward's policy gradient when one is given."""
        args, mask = self.args, batch.loss_mask
        metrics = dict(batch.metrics)
        if args.divergence_estimator == "sampled":
            teacher = batch.teacher_logprobs
            adv = reverse_kl_advantages(scored.token_logprobs, teacher, mask, args.token_reward_to_go)
            if batch.advantages is not None:  # the reward's advantage on every token of its sample
                adv = adv + losses.token_advantages(batch.advantages, scored.token_logprobs) * mask
            loss = losses.policy_gradient_loss(scored.token_logprobs, mask, adv)
            metrics["rl/teacher_logprob"] = losses.masked_mean(teacher.flatten(), mask.flatten(), 0).item()
            metrics["distill/reverse_kl"] = losses.sampled_kl(scored.token_logprobs, teacher, mask).item()
            return StepLoss(loss, mask, metrics)
        loss = losses.masked_mean(scored.divergence.flatten(), mask.flatten(), 0)
        metrics["distill/divergence"] = loss.item()
        if batch.advantages is not None:
            pg_loss = losses.policy_gradient_loss(scored.token_logprobs, mask, batch.advantages)
            metrics["rl/pg_loss"] = pg_loss.item()
            loss = loss + pg_loss
        return StepLoss(loss, mask, metrics)

    def cross_entropy(self, runner: Runner, scored: ScoredRollout, batch: DistillationBatch,
                      ctx: StepContext) -> torch.Tensor | None:
        """The cross-entropy of the gold targets: on a gold step, from the log-probs of the rows the divergence was
        taken over (the same tokens); else from the gold rows the scoring pass added."""
        if self.args.rl_weight < 1 and self.gold_step(ctx, runner.label_smoother is not None):
            return runner.cross_entropy_of(scored.token_logprobs, runner.family.target_labels(ctx.inputs))
        return runner.gold_cross_entropy(scored, self.gold_labels(runner, ctx))
