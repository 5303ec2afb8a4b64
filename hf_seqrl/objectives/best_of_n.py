"""Best-of-n self-training (RAFT, Dong et al., 2023; ReST, Gulcehre et al., 2023): each source's `num_samples`
samples are ranked, the best one, above `best_of_n_threshold` when one is set, is trained on by cross-entropy.

The ranking is the reward (`best_of_n_selection="reward"`; with a reference-free reward such as CometKiwi this is QE
fine-tuning) or, with `"mbr"`, each sample's expected utility against the source's other samples with the reward as
utility (MBR fine-tuning, Finkelstein et al., 2024: `selection.expected_utilities`). One step: samples → rewards →
the selected row per source → a scoring pass of the selected rows at temperature 1 → the mean cross-entropy over
their tokens (`losses.cross_entropy_from_logprobs`), mixed with the gold targets' cross-entropy by `rl_weight`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .. import losses
from ..configs.base import Range, check_choice
from ..configs.rollout import RolloutConfig
from ..papers import Method, Paper
from ..selection import expected_utilities, utility_matrices
from ..models.languages import decode_texts
from ..types import Rollout, RolloutBatch, ScoredRollout, repeat_rows
from .base import Defaults, Objective, RolloutPlan, Runner, StepContext, StepLoss

SELECTIONS = ("reward", "mbr")

DONG_2023 = Paper(key="dong2023raft", cite="Dong et al., 2023", url="https://openreview.net/forum?id=m7p5O7zblY",
                  title="RAFT: Reward rAnked FineTuning for Generative Foundation Model Alignment", citation="""\
@article{dong2023raft,
  title   = {{RAFT}: Reward rAnked FineTuning for Generative Foundation Model Alignment},
  author  = {Dong, Hanze and Xiong, Wei and Goyal, Deepanshu and Zhang, Yihan and Chow, Winnie and Pan, Rui and
             Diao, Shizhe and Zhang, Jipeng and Shum, Kashun and Zhang, Tong},
  journal = {Transactions on Machine Learning Research},
  year    = {2023},
  url     = {https://openreview.net/forum?id=m7p5O7zblY}
}""")
GULCEHRE_2023 = Paper(key="gulcehre2023rest", cite="Gulcehre et al., 2023", url="https://arxiv.org/abs/2308.08998",
                      title="Reinforced Self-Training (ReST) for Language Modeling", citation="""\
@article{gulcehre2023rest,
  title   = {Reinforced Self-Training ({ReST}) for Language Modeling},
  author  = {Gulcehre, Caglar and Le Paine, Tom and Srinivasan, Srivatsan and Konyushkova, Ksenia and Weerts, Lotte
             and Sharma, Abhishek and Siddhant, Aditya and Ahern, Alex and Wang, Miaosen and Gu, Chenjie and
             Macherey, Wolfgang and Doucet, Arnaud and Firat, Orhan and de Freitas, Nando},
  journal = {arXiv preprint arXiv:2308.08998},
  year    = {2023},
  url     = {https://arxiv.org/abs/2308.08998}
}""")
FINKELSTEIN_2024 = Paper(key="finkelstein2024mbr", cite="Finkelstein et al., 2024",
                         url="https://openreview.net/forum?id=bkNx3O0sND",
                         title="MBR and QE Finetuning: Training-time Distillation of the Best and Most Expensive "
                         "Decoding Methods", citation="""\
@inproceedings{finkelstein2024mbr,
  title     = {{MBR} and {QE} Finetuning: Training-time Distillation of the Best and Most Expensive Decoding Methods},
  author    = {Finkelstein, Mara and Naskar, Subhajit and Mirzazadeh, Mehdi and Shah, Apurva and Freitag, Markus},
  booktitle = {The Twelfth International Conference on Learning Representations},
  year      = {2024},
  url       = {https://openreview.net/forum?id=bkNx3O0sND}
}""")


@dataclass
class BestOfNConfig(RolloutConfig):
    r"""
    Arguments of [`BestOfNTrainer`] (best-of-n self-training), on top of [`RolloutConfig`]: `num_samples` samples
    per source (default 4), the best trained on by cross-entropy.

    best_of_n_selection (`str`, *optional*, defaults to `"reward"`):
        How a source's samples are ranked: `"reward"`, by the reward of `reward_funcs` (a reference-free reward such
        as CometKiwi makes this QE fine-tuning); `"mbr"`, by each sample's mean reward against the source's other
        samples as references (minimum Bayes risk; the reward is the utility, e.g. `"chrf"`).
    best_of_n_threshold (`float`, *optional*, defaults to `None`):
        Train on a source's selected sample only when its score (the reward, or the expected utility with `"mbr"`)
        is at least this; `None` trains on every source's best.
    """

    num_samples: int = field(default=4, metadata={"help": "Samples per source, of which the best is trained on."})
    best_of_n_selection: str = field(default="reward", metadata={
        "help": "Ranking of the samples: 'reward' (the reward; QE with a reference-free reward) or 'mbr' (expected "
                "utility against the other samples)."})
    best_of_n_threshold: float | None = field(default=None, metadata={
        "help": "Train on a source's best sample only when its score is at least this (None: always)."})

    FIELD_RANGES = {"best_of_n_threshold": Range()}

    def __post_init__(self):
        super().__post_init__()
        check_choice(self, "best_of_n_selection", SELECTIONS)
        if self.num_samples < 2:
            raise ValueError(f"BestOfNConfig.num_samples={self.num_samples}: best-of-n picks one of several samples "
                             "per source; set num_samples >= 2.")


def best_rows(scores: torch.Tensor) -> torch.Tensor:
    """Returns each source's best row `(B,)` of `scores` `(B, n)` (NaN where a row has no score): the first of equal
    maxima; a source with no score at all gets row 0 (and is left out by the caller)."""
    return torch.nan_to_num(scores, nan=float("-inf")).argmax(dim=1)


def length_gain(lengths: torch.Tensor, best: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Returns the mean length of the selected samples over the mean length of all samples, over the sources kept: a
    scalar tensor (NaN when none is kept). `lengths` `(B, n)`: each sample's tokens; `best` `(B,)`: each source's
    selected sample; `kept` `(B,)`. Above 1 the selection prefers longer samples than the model writes, and training
    on the picks lengthens its outputs step after step (MBR with a recall-weighted utility such as chrF does)."""
    picked = lengths.gather(1, best.unsqueeze(1)).squeeze(1).float()
    keep = kept.float()
    return (picked * keep).sum() / (lengths.float().mean(dim=1) * keep).sum()


class BestOfN(Objective):
    """Best-of-n self-training: the sample a reward ranks best per source, trained on by cross-entropy (optionally
    only above a threshold). Cross-entropy on its own selections keeps the checkpoint's dropout, as fine-tuning
    does. Logs `best_of_n/score` (the selected samples' mean score), `best_of_n/frac_trained` (the share of sources
    trained on), `best_of_n/length_gain` (`length_gain`) and the samples' `rl/*` metrics."""

    defaults = Defaults(algorithm_id="best_of_n", config_class=BestOfNConfig, disable_dropout=False)

    @property
    def method(self) -> Method:
        if self.args.best_of_n_selection == "mbr":
            return Method("MBR fine-tuning", "mbr-finetuning", "cross-entropy on each source's sample of highest "
                          "expected utility against its other samples", (FINKELSTEIN_2024,))
        return Method("Best-of-n self-training", "best-of-n", "cross-entropy on the sample the reward ranks best "
                      "among each source's samples", (DONG_2023, GULCEHRE_2023))

    def rollout_plan(self, step: int) -> RolloutPlan:
        return RolloutPlan(from_source=True, greedy=False)

    @classmethod
    def rewards_read_references(cls, args) -> bool:
        # MBR scores the samples against each other: a dataset of sources alone trains it.
        return args.best_of_n_selection != "mbr"

    def mbr_utilities(self, runner: Runner, predictions: list[str], n: int, ctx: StepContext) -> torch.Tensor:
        """Returns each sample's expected utility `(B, n)` against its source's other samples (the reward, as
        `reward_funcs` names it, as the utility; `selection.expected_utilities`)."""
        given = runner.rewards.reward_funcs
        utility = given if isinstance(given, str) else runner.rewards.fn  # a name keeps its fast path (fastchrf)
        candidates = [predictions[i:i + n] for i in range(0, len(predictions), n)]
        means = np.stack([expected_utilities(m) for m in utility_matrices(candidates, utility, ctx.text.sources)])
        return torch.as_tensor(means, dtype=torch.float32)

    def weigh(self, runner: Runner, rollout: Rollout, ctx: StepContext) -> RolloutBatch:
        """Each sample's score (its reward; with `"mbr"` its expected utility, the gold references unread) and each
        source's selected sample: the rows the loss trains on, `kept` where the score is at or above the threshold."""
        n, threshold, device = rollout.num_samples, self.args.best_of_n_threshold, rollout.sample_ids.device
        if self.args.best_of_n_selection == "mbr":
            predictions = decode_texts(runner.processing_class, rollout.sample_ids)
            batch = runner.unrewarded_batch(rollout, ctx, predictions)  # length metrics and sample-log rows
            scores, metrics = self.mbr_utilities(runner, predictions, n, ctx).to(device), batch.metrics
        else:
            text = repeat_rows(ctx.text, n)
            samples = runner.reward_values(rollout.sample_ids, text)
            scores = samples.rewards.masked_fill(samples.left_out, float("nan")).view(-1, n)
            metrics = runner.rewards.metrics(samples, samples.left_out, rollout.sample_mask, rollout.sample_cut, text)
            if runner.completions is not None:
                runner.record_completions(ctx, samples, rollout.sample_cut)
        best = best_rows(scores)
        chosen = scores.gather(1, best.unsqueeze(1)).squeeze(1)
        kept = torch.isfinite(chosen) & (chosen >= threshold if threshold is not None else True)
        rows = torch.arange(best.shape[0], device=device) * n + best
        gain = length_gain(rollout.sample_mask.sum(dim=1).view(-1, n), best, kept)
        score = chosen.nan_to_num(0.0).mul(kept).sum() / kept.sum().clamp(min=1)
        frac, score, gain = torch.stack([kept.float().mean(), score, gain]).tolist()  # one read of the device
        metrics["best_of_n/frac_trained"] = frac
        if frac > 0:
            metrics["best_of_n/score"], metrics["best_of_n/length_gain"] = score, gain
        return RolloutBatch(rollout.sample_ids[rows], rollout.sample_mask[rows], None, metrics, kept=kept, group=1,
                            rewards=chosen.nan_to_num(0.0))

    def score(self, runner: Runner, model, batch: RolloutBatch, ctx: StepContext) -> ScoredRollout:
        # Cross-entropy is at temperature 1, whatever the samples were drawn at.
        return runner.score_policy(model, ctx, batch.sample_ids, batch.group, runner.gold_labels(ctx.inputs),
                                   temperature=1.0)

    def loss(self, scored: ScoredRollout, batch: RolloutBatch, ctx: StepContext) -> StepLoss:
        """The mean cross-entropy over the tokens of the selected samples kept (`losses.cross_entropy_from_logprobs`:
        the `Seq2SeqTrainer` loss with those samples as labels); 0 when no source is kept."""
        mask = batch.loss_mask
        loss = losses.cross_entropy_from_logprobs(scored.token_logprobs, batch.sample_ids.masked_fill(~mask, -100))
        return StepLoss(loss, mask, {**batch.metrics, "best_of_n/loss": loss.item()})
