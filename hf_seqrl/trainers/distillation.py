"""`DistillationTrainer`: a student trained toward a frozen teacher's next-token distributions (on-policy
distillation, Agarwal et al., 2024; word- and sequence-level knowledge distillation, Kim & Rush, 2016).

One step, as every rewarded trainer's (`RolloutTrainer.rl_loss`): the tokens to train on (the student's own samples
on the optimizer steps drawn on-policy, `lmbda` of them; else the gold targets, or with `seq_kd` the teacher's beam
decodes) → rewards and advantages when a sequence reward is given → the scoring pass, the teacher's output-layer
inputs at the same positions handed to the student's pass, which reduces the divergence slice by slice over the
vocabulary → the divergence per counted token (`functional.divergences.generalized_jsd`'s math), or the sampled
reverse KL as a policy gradient with per-token advantages (`functional.divergences.reverse_kl_advantages`) → the
shared tail.
"""

from __future__ import annotations

import random

import torch
from transformers.utils import logging

from .. import losses
from ..configs.distillation import DistillationConfig
from ..functional.divergences import reverse_kl_advantages
from ..functional.lm_head import Divergence
from ..hub import Method, Paper
from ..models import family_for
from ..models.base import decode_budget
from ..models.tokens import pad_id
from ..models.languages import decode_texts
from ..types import BatchText, Rollout, RolloutBatch, RewardValues, ScoredRollout, repeat_rows
from .rollout import RolloutPlan, RolloutTrainer, StepLoss
from .services.reward_scorer import sample_metrics

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


class DistillationTrainer(RolloutTrainer):
    """On-policy distillation and knowledge distillation from a teacher with the student's tokenizer.

    Loss: the divergence `beta` selects between the student's and the teacher's next-token distributions, averaged
    over the counted tokens of the student's samples (on-policy steps) or of the gold / teacher targets, mixed with
    cross-entropy by `rl_weight`; with `reward_funcs` the policy gradient of that reward is added (its baseline from
    `baseline`). `teacher_model` (a model, a Hub id or a folder of the student's family) is required and
    `reward_funcs` optional. `args` is a `DistillationConfig`. Logs `distill/divergence`, `distill/on_policy`, the
    student's samples' `rl/sample_length`, `rl/frac_truncated` (and the other `rl/*` metrics of `sample_metrics`) on
    on-policy steps and, with the sampled estimator, `rl/teacher_logprob` and `distill/reverse_kl`; with
    `log_completions`, the sample log holds the student's samples (with their rewards when a reward is given).
    """

    config_class = DistillationConfig
    algorithm_id = "distill"
    model_families = ("seq2seq", "causal")
    needs_rewards = False
    default_baseline = "moving_average"
    # Dropout off: the divergence compares the distribution the student samples from with the teacher's.
    default_disable_dropout = True

    def __init__(self, model=None, args: DistillationConfig | None = None, data_collator=None, train_dataset=None,
                 eval_dataset=None, processing_class=None, reward_funcs=None, teacher_model=None, **kwargs):
        if teacher_model is None:
            raise ValueError("DistillationTrainer needs teacher_model=: a model, a Hub id or a folder of the "
                             "student's family with the student's tokenizer.")
        super().__init__(model=model, args=args, data_collator=data_collator, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, reward_funcs=reward_funcs,
                         teacher_model=teacher_model, **kwargs)
        teacher = self.frozen_models["teacher"].model
        if family_for(teacher).name != self.family.name:
            raise ValueError(f"teacher_model is a {family_for(teacher).name} model and the student a {self.family.name} "
                             "one: the token-level divergence needs a teacher of the student's family and tokenizer "
                             "(for a teacher with another tokenizer, reward with rewards.TeacherLikelihoodReward).")
        if self.args.log_completions and self.args.lmbda == 0 and self.is_world_process_zero():
            logger.warning(f"{type(self.args).__name__}.log_completions=True logs the student's own samples, and "
                           "lmbda=0 trains on none (every step is on the gold or the teacher's targets): no sample log "
                           "will be written. Set lmbda > 0 to sample, or log_completions=False.")

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

    def on_policy(self) -> bool:
        """Returns whether the current optimizer step trains on the student's own samples (`on_policy_step`)."""
        return on_policy_step(self.args.seed, self.state.global_step, self.args.lmbda)

    def rollout_plan(self) -> RolloutPlan | None:
        plan = super().rollout_plan()
        if plan is not None and not self.on_policy():
            return plan._replace(from_source=False)  # the step trains on given targets: nothing to decode ahead
        return plan

    # ---- the stages ---------------------------------------------------------------------------------

    def rollout(self, unwrapped, inputs) -> Rollout:
        """The student's samples on an on-policy step; else the targets it trains on: the teacher's beam decodes
        (`seq_kd`) or the gold targets, one row per source."""
        if self.on_policy():
            return self.take_rollout(unwrapped, inputs)
        if self.args.seq_kd:
            teacher = self.frozen_models["teacher"].model
            ids, mask = self.family.beam_search(teacher, inputs, self.args.seq_kd_num_beams, 1,
                                                decode_budget(self.rollout_config))
        else:
            labels = self.family.target_labels(inputs)
            mask = labels != -100
            ids = labels.masked_fill(~mask, pad_id(unwrapped))
        return Rollout(ids, mask.bool(), None, None, 1, torch.zeros(ids.shape[0], dtype=torch.bool,
                                                                    device=ids.device))

    def gold_step(self) -> bool:
        """Returns whether this step's rows are the gold targets themselves (off-policy, no `seq_kd`) and their scoring
        pass gives the cross-entropy too (temperature 1, no label smoothing): the gold rows are then scored once."""
        return (not self.args.seq_kd and self.args.temperature == 1.0 and self.label_smoother is None
                and not self.on_policy())

    def gold_labels(self, inputs):
        return None if self.gold_step() else super().gold_labels(inputs)

    def cross_entropy_term(self, scored: ScoredRollout, batch: RolloutBatch, inputs):
        """The cross-entropy of the gold targets: on a gold step, from the log-probs of the rows the divergence was
        taken over (the same tokens); else from the gold rows the scoring pass added."""
        if self.args.rl_weight < 1 and self.gold_step():
            return self.cross_entropy_of(scored.token_logprobs, self.family.target_labels(inputs))
        return super().cross_entropy_term(scored, batch, inputs)

    def rollout_batch(self, rollout: Rollout, text: BatchText, unwrapped, inputs=None) -> RolloutBatch:
        """The rewards and advantages of the student's samples when a reward is given (`RolloutTrainer`'s); without
        one, the samples with what they measure and no advantage (`unrewarded_batch`); off-policy, the tokens alone."""
        on_policy = self.on_policy()
        if on_policy and self.rewards is not None:
            batch = super().rollout_batch(rollout, text, unwrapped, inputs)
        elif on_policy:
            batch = self.unrewarded_batch(rollout, text, unwrapped, inputs)
        else:
            batch = RolloutBatch(rollout.sample_ids, rollout.sample_mask, None, group=rollout.num_samples)
        batch.metrics["distill/on_policy"] = float(on_policy)
        return batch

    def unrewarded_batch(self, rollout: Rollout, text: BatchText, unwrapped, inputs=None) -> RolloutBatch:
        """The student's samples without a reward: their length and truncation metrics (`rewards.sample_metrics`) and,
        with `log_completions`, their rows for the sample log, with no reward, baseline or advantage."""
        n = rollout.num_samples
        predictions = decode_texts(self.processing_class, rollout.sample_ids)
        metrics = sample_metrics(predictions, rollout.sample_mask, rollout.sample_cut, repeat_rows(text, n))
        if self.completions is not None:
            none = torch.ones(len(predictions), dtype=torch.bool)
            samples = RewardValues(predictions, [None] * len(predictions), {}, torch.zeros(len(predictions)), none)
            self.record_completions(inputs, text, samples, rollout.sample_cut, unwrapped)
        return RolloutBatch(rollout.sample_ids, rollout.sample_mask, None, metrics, group=n)

    def score_batch(self, model, inputs, batch: RolloutBatch) -> ScoredRollout:
        """The student's scoring pass over the batch's tokens; with the full estimator the teacher's output-layer
        inputs at the same positions go into it (the divergence, a slice of the vocabulary at a time); with the sampled
        one the teacher scores the student's tokens (kept in `batch.extra["teacher_logprobs"]`)."""
        args, ids, group = self.args, batch.sample_ids, batch.group
        if args.divergence_estimator == "sampled":
            teacher = self.score_frozen("teacher", inputs, ids, group, args.temperature)
            batch.extra["teacher_logprobs"] = teacher.token_logprobs
            return self.score_policy(model, inputs, ids, group, self.gold_labels(inputs))
        frozen = self.frozen_models["teacher"]
        with frozen.running(self.accelerator, self.model.training) as teacher:
            positions = self.family.reference_positions(teacher, inputs, ids, group).narrowed(frozen.width)
        return self.score_policy(model, inputs, ids, group, self.gold_labels(inputs),
                                 divergence=Divergence(positions, args.beta, args.temperature))

    def algorithm_loss(self, scored: ScoredRollout, batch: RolloutBatch, inputs) -> StepLoss:
        """The mean divergence per counted token (full estimator), or the policy gradient over the per-token
        advantages `-(log p_s - log p_t)` (sampled); plus the sequence reward's policy gradient when one is given."""
        args, mask = self.args, batch.loss_mask
        metrics = dict(batch.metrics)
        if args.divergence_estimator == "sampled":
            teacher = batch.extra["teacher_logprobs"]
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

    def teacher_metrics(self, inputs, scored, token_ids, group, token_mask) -> dict[str, float]:
        """Nothing: the loss stage records what the teacher said (`distill/*`), from the pass it already ran."""
        return {}
