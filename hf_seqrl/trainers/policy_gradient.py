"""The policy-gradient trainers: `SeqRLTrainer` (the policy gradient, clipped on reused rollouts), `SCSTTrainer` and
`ReinforceTrainer`.

One RL step follows the diagram of docs/architecture.md: rollout → rewards → baseline → advantages
(`RolloutTrainer.rollout_batch`) →
log-probs → policy-gradient loss mixed with cross-entropy (+ KL, − entropy; `RolloutTrainer.finish_loss`). The
baseline decides the algorithm's name (`BASELINE_METHODS`): a policy gradient with the greedy baseline is SCST, with
the leave-one-out mean REINFORCE with leave-one-out baseline. The math lives in `hf_seqrl.losses`, decoding and
scoring in the model family (`hf_seqrl.models`). With `num_iterations > 1` a rollout serves several clipped updates
(`reuse`).
"""

from __future__ import annotations

import dataclasses

from .. import losses
from ..configs import SeqRLConfig
from ..hub import Method, Paper
from ..types import RolloutBatch, ScoredRollout
from .services.reuse import RolloutReuse
from .rollout import RolloutPlan, RolloutTrainer, StepLoss

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


def policy_gradient_method(baseline: str) -> Method:
    """Returns what logs and cards say of a policy gradient with `baseline`: with the greedy baseline it is SCST,
    with the leave-one-out mean REINFORCE with leave-one-out baseline, whichever trainer class runs it."""
    method = BASELINE_METHODS.get(baseline) or Method(
        f"REINFORCE with a {baseline} baseline", "reinforce", f"policy gradient with the `{baseline}` baseline",
        (WILLIAMS_1992,))
    return dataclasses.replace(method, baseline=baseline)


class SeqRLTrainer(RolloutTrainer):
    """Base of the policy-gradient trainers; same constructor as `Seq2SeqTrainer` plus `reward_funcs`, `args` a
    `SeqRLConfig`."""

    algorithm_id = "policy_gradient"
    config_class = SeqRLConfig
    model_families = ("seq2seq", "causal")
    default_baseline = "greedy"
    # The checkpoint's dropout stays on (as TRL's default); docs/math.md ("Dropout and the estimator") has the
    # measurements behind this default.
    default_disable_dropout = False

    @property
    def method(self) -> Method:
        """The policy gradient the baseline makes of this trainer (`policy_gradient_method`)."""
        return policy_gradient_method(self.baseline)

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

    def algorithm_loss(self, scored: ScoredRollout, batch: RolloutBatch, inputs) -> StepLoss:
        """The policy gradient over the samples' advantages (`(N,)` or `(N, T)`), clipped on reused rollouts and at
        the sequence level (GSPO); records `rl/pg_loss` and, on reused rollouts, the ratio metrics."""
        args = self.args
        mask, adv, metrics = batch.loss_mask, batch.advantages, dict(batch.metrics)
        if self.reuse is None and args.importance_sampling_level == "token":
            pg_loss = losses.policy_gradient_loss(scored.token_logprobs, mask, adv, args.length_normalize,
                                                  args.loss_normalization)
        else:  # clipped; the sequence level (GSPO) trains through its ratio even on a rollout used once
            old = scored.token_logprobs.detach() if self.reuse is None else batch.old_token_logprobs
            clipped = losses.clipped_policy_objective(
                scored.token_logprobs, old, mask, adv, args.epsilon, args.epsilon_high, args.length_normalize,
                args.loss_normalization, args.importance_sampling_level, args.delta)
            pg_loss = clipped.loss
            if self.reuse is not None:
                metrics.update({"rl/clip_fraction": clipped.clip_fraction.item(),
                                "rl/ratio_mean": clipped.ratio_mean.item(), "rl/ratio_min": clipped.ratio_min.item(),
                                "rl/ratio_max": clipped.ratio_max.item()})
        metrics["rl/pg_loss"] = pg_loss.item()
        return StepLoss(pg_loss, mask, metrics)

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
    algorithm_id = "scst"


class ReinforceTrainer(SeqRLTrainer):
    """REINFORCE on sampled sequences (Williams, 1992).

    Loss: the policy gradient `-mean_i (r_i - b) * log p(y_i | x_i)`, mixed with cross-entropy by `rl_weight`
    (Ranzato et al., 2016; Paulus et al., 2017). Baseline: `SeqRLConfig.baseline`, by default `"moving_average"`,
    an exponential moving average of past batch rewards.
    """

    default_baseline = "moving_average"
    algorithm_id = "reinforce"
