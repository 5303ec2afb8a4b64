"""The policy gradient: SCST, REINFORCE, leave-one-out, clipped multi-update steps and GSPO.

Its stages are the defaults of `Objective`: samples from the source (with each source's greedy decode for the greedy
baseline) → rewards → baseline → advantages (`functional.advantages.sample_advantages`) → one scoring pass → the
policy gradient `-mean_i A_i log p(y_i | x_i)` (`losses.policy_gradient_loss`), clipped on reused rollouts and at the
sequence level (`losses.clipped_policy_objective`). The baseline decides the algorithm's name (`BASELINE_METHODS`):
with the greedy baseline it is SCST, with the leave-one-out mean REINFORCE with leave-one-out baseline.
"""

from __future__ import annotations

import dataclasses

from .. import losses
from ..configs import SeqRLConfig
from ..papers import Method, Paper
from ..types import RolloutBatch, ScoredRollout
from .base import Defaults, Objective, StepContext, StepLoss

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


class PolicyGradient(Objective):
    """The policy gradient over the samples' advantages (`(N,)` or `(N, T)`); with `num_iterations > 1` a rollout
    serves several clipped updates, and with `importance_sampling_level="sequence"` the ratio is clipped per sample
    (GSPO). Dropout stays on by default (as TRL's; docs/math.md, "Dropout and the estimator")."""

    defaults = Defaults(algorithm_id="policy_gradient", config_class=SeqRLConfig, baseline="greedy",
                        disable_dropout=False)
    reuses_rollouts = True

    @property
    def method(self) -> Method:
        return policy_gradient_method(self.baseline)

    def loss(self, scored: ScoredRollout, batch: RolloutBatch, ctx: StepContext) -> StepLoss:
        """The policy gradient, clipped on reused rollouts and at the sequence level (GSPO); records `rl/pg_loss`
        and, on reused rollouts, the ratio metrics."""
        args = self.args
        reused = args.num_iterations > 1
        mask, adv, metrics = batch.loss_mask, batch.advantages, dict(batch.metrics)
        if not reused and args.importance_sampling_level == "token":
            pg_loss = losses.policy_gradient_loss(scored.token_logprobs, mask, adv, args.length_normalize,
                                                  args.loss_normalization)
        else:  # clipped; the sequence level (GSPO) trains through its ratio even on a rollout used once
            old = batch.old_token_logprobs if reused else scored.token_logprobs.detach()
            clipped = losses.clipped_policy_objective(
                scored.token_logprobs, old, mask, adv, args.epsilon, args.epsilon_high, args.length_normalize,
                args.loss_normalization, args.importance_sampling_level, args.delta)
            pg_loss = clipped.loss
            if reused:
                metrics.update({"rl/clip_fraction": clipped.clip_fraction.item(),
                                "rl/ratio_mean": clipped.ratio_mean.item(), "rl/ratio_min": clipped.ratio_min.item(),
                                "rl/ratio_max": clipped.ratio_max.item()})
        metrics["rl/pg_loss"] = pg_loss.item()
        return StepLoss(pg_loss, mask, metrics)


# The trainers of this objective differ in their name and default baseline only.
SCST = dataclasses.replace(PolicyGradient.defaults, algorithm_id="scst", baseline="greedy")
REINFORCE = dataclasses.replace(PolicyGradient.defaults, algorithm_id="reinforce", baseline="moving_average")
