"""The tail of one RL step, the same for every rewarded trainer: the cross-entropy the loss mixes in, then the mix,
minus entropy, plus KL, and the step's metrics (`rl_loss`'s last two stages, after the algorithm's loss).

These are methods of `RolloutTrainer` (bound there by name: `finish_loss = loss_tail.finish_loss`), kept in a module of
their own so that a step reads in one direction: the head in `rollout.py` (the rollout, its rewards and advantages,
the scoring pass), the algorithm's file (its loss), then this tail. A trainer overrides one as any method
(`MRTTrainer.cross_entropy_term`); the math is `hf_seqrl.losses`.
"""

from __future__ import annotations

from .. import losses
from ..types import RolloutBatch, ScoredRollout


def cross_entropy_term(self, scored: ScoredRollout, batch: RolloutBatch, inputs):
    """Returns the cross-entropy the loss mixes in (`rl_weight < 1`) from the scoring pass, else None."""
    return self.gold_cross_entropy(scored, self.gold_labels(inputs))


def gold_cross_entropy(self, scored: ScoredRollout, labels):
    """Returns the cross-entropy of the gold `labels` from the scoring pass `scored`, or None without labels."""
    if labels is None:
        return None
    return self.cross_entropy_of(scored.gold_logprobs, labels, scored.raw_logprobs, scored.raw_logprob_sums,
                                 scored.vocab_size)


def finish_loss(self, rl_loss, xe_loss, inputs, scored: ScoredRollout, token_ids, group: int, token_mask,
                metrics: dict):
    """Returns the loss of a step from its algorithm's loss `rl_loss` (`algorithm_loss`): mixed with `xe_loss` by
    `rl_weight`, minus `entropy_coef` × entropy, plus `kl_coef` × KL over `token_mask` `(N, T)` (the scoring pass's,
    `scored`); records `metrics` with the entropy, KL and cross-entropy added."""
    loss = losses.mix_losses(rl_loss, xe_loss, self.args.rl_weight)
    loss = self.add_regularizers(loss, scored, token_mask, metrics)
    if "teacher" in self.frozen_models:
        metrics.update(self.teacher_metrics(inputs, scored, token_ids, group, token_mask))
    if xe_loss is not None:
        metrics["rl/xe_loss"] = xe_loss.item()
    self._record("train", metrics)
    return loss


def add_regularizers(self, loss, scored: ScoredRollout, token_mask, metrics: dict):
    """Returns `loss - entropy_coef * entropy (+ kl_coef * KL)` over the counted tokens `token_mask` (the samples
    left out of the loss are out of these too; `losses.regularize`); records both, unless no token counts. Both
    are those of the rollout distribution (banned entries excluded)."""
    args = self.args
    terms = losses.regularize(loss, scored.entropy, token_mask, args.entropy_coef, scored.kl, args.kl_coef)
    if bool(token_mask.any()):
        metrics["rl/entropy"] = terms.entropy.item()
        if terms.kl is not None:
            metrics["rl/kl"] = terms.kl.item()
    return terms.loss


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
