"""MIXER (Ranzato et al., 2016), the gradual hand-off from teacher forcing to REINFORCE.

Each target's first `T - Δ` tokens are teacher-forced (cross-entropy); the model continues that gold prefix on its
own (`num_samples` samples, and the greedy continuation for the greedy baseline), and the continuation is trained
with REINFORCE on the reward of prefix + continuation. Δ grows during training (`schedules.mixer_delta`), from the
end of the target backwards, until whole sequences are sampled. Rows that share a prefix length are decoded
together, the gold prefix read once per source (seq2seq: after the decoder start token, the encoder run once;
decoder-only: after the prompt).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from .. import losses
from ..configs import MixerConfig
from ..models.base import decode_budget
from ..models.tokens import pad_id, right_pad
from ..schedules import mixer_delta
from ..papers import Method, Paper
from ..types import Rollout, RolloutBatch, ScoredRollout
from .base import Defaults, Objective, RolloutPlan, Runner, StepContext, StepLoss

RANZATO_2016 = Paper(key="ranzato2016mixer", cite="Ranzato et al., 2016", url="https://arxiv.org/abs/1511.06732",
                     title="Sequence Level Training with Recurrent Neural Networks", citation="""\
@inproceedings{ranzato2016mixer,
  title     = {Sequence Level Training with Recurrent Neural Networks},
  author    = {Ranzato, Marc'Aurelio and Chopra, Sumit and Auli, Michael and Zaremba, Wojciech},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year      = {2016},
  url       = {https://arxiv.org/abs/1511.06732}
}""")


def prefix_lengths(labels: torch.Tensor, delta: int) -> torch.Tensor:
    """Returns the teacher-forced prefix length `max(0, T - Δ)` of each row, `T` its target tokens (EOS included).

    Args:
        labels (`torch.LongTensor` of shape `(B, T_max)`): gold targets, -100 at padding.
    """
    return ((labels != -100).sum(dim=1) - delta).clamp(min=0)


@dataclass
class MixerBatch(RolloutBatch):
    """The continuations as MIXER's loss reads them: `RolloutBatch` plus each row's teacher-forced prefix length
    `(B,)` and the batch's count of gold target tokens."""

    prefixes: torch.Tensor | None = None
    target_tokens: torch.Tensor | None = None


class Mixer(Objective):
    """MIXER (Ranzato et al., 2016): cross-entropy on the first `T - Δ` gold tokens of each target and REINFORCE on
    the model's continuation of that prefix, rewarded as a whole sequence; Δ grows by `mixer_delta` every
    `mixer_increment_steps` optimizer steps. Any baseline of `BaselineConfig` (default: moving average); with Δ at
    least the target length the loss is exactly REINFORCE's. Dropout stays on by default (the policy gradient's
    choice). Logs `mixer/delta` and `mixer/prefix_fraction` (the teacher-forced share of the targets)."""

    defaults = Defaults(algorithm_id="mixer", config_class=MixerConfig, baseline="moving_average",
                        disable_dropout=False, reads_targets="samples continuations of the gold prefixes")
    method = Method("MIXER", "mixer", "cross-entropy on the first tokens of each target and REINFORCE on the sampled "
                    "rest, the sampled part growing over training", (RANZATO_2016,))

    def delta(self, step: int) -> int:
        """Returns Δ at optimizer step `step`, counted from the end of the warm-up."""
        return mixer_delta(max(0, step - self.args.warmup_xe_steps), self.args.mixer_delta,
                           self.args.mixer_increment_steps)

    def rollout_plan(self, step: int) -> RolloutPlan:
        # Continuations of each micro-batch's own gold prefixes: nothing to decode ahead.
        return RolloutPlan(from_source=False, greedy=self.baseline == "greedy")

    def rollout(self, runner: Runner, ctx: StepContext) -> Rollout:
        """The continuations of each target's gold prefix of `T - Δ` tokens (`sample_continuations`)."""
        if ctx.inputs.get("labels") is None:
            raise ValueError("MixerTrainer teacher-forces a prefix of each target: the dataset needs tokenized "
                             "'labels' (tokenizer(text_target=...), or tokenize_prompt_completion for a decoder-only "
                             "model).")
        labels = runner.family.target_labels(ctx.inputs)  # target coordinates (causal: completions)
        return self.sample_continuations(runner, ctx, labels, prefix_lengths(labels, self.delta(ctx.step)))

    def weigh(self, runner: Runner, rollout: Rollout, ctx: StepContext) -> MixerBatch:
        """The continuations' rewards and advantages (`Runner.sample_advantages`), with each row's gold prefix."""
        batch = runner.sample_advantages(rollout, ctx)
        labels = runner.family.target_labels(ctx.inputs)
        return MixerBatch(**vars(batch), prefixes=prefix_lengths(labels, self.delta(ctx.step)),
                          target_tokens=(labels != -100).sum().clamp(min=1))

    def score(self, runner: Runner, model, batch: RolloutBatch, ctx: StepContext) -> ScoredRollout:
        # The cross-entropy part is at temperature 1 whatever temperature the continuations are sampled at.
        return runner.score_policy(model, ctx, batch.sample_ids, batch.group, runner.gold_labels(ctx.inputs),
                                   plain=self.args.temperature != 1.0)

    def loss(self, scored: ScoredRollout, batch: MixerBatch, ctx: StepContext) -> StepLoss:
        """Cross-entropy on each row's gold prefix and REINFORCE on its continuation (`losses.mixer_loss`); records
        `mixer/delta` and `mixer/prefix_fraction`. The entropy and KL terms count the continuations."""
        prefixes, n = batch.prefixes, batch.group
        positions = torch.arange(batch.sample_ids.shape[1], device=prefixes.device)
        prefix_mask = positions.unsqueeze(0) < prefixes.repeat_interleave(n).unsqueeze(1)
        continuation_mask = batch.loss_mask & ~prefix_mask  # a left-out row keeps its gold prefix's cross-entropy
        mixer_loss = losses.mixer_loss(scored.token_logprobs, prefix_mask, continuation_mask, batch.advantages,
                                       scored.plain_logprobs)
        metrics = {**batch.metrics, "rl/pg_loss": mixer_loss.item(), "mixer/delta": float(self.delta(ctx.step)),
                   "mixer/prefix_fraction": (prefixes.sum() / batch.target_tokens).item()}
        return StepLoss(mixer_loss, continuation_mask, metrics)

    def sample_continuations(self, runner: Runner, ctx: StepContext, labels: torch.Tensor,
                             prefixes: torch.Tensor) -> Rollout:
        """Returns the samples (and greedy rows) of every source, each holding its gold prefix then its own
        continuation; rows sharing a prefix length are decoded together, in one decode.

        Args:
            labels (`torch.LongTensor` of shape `(B, T)`): the gold targets in target coordinates.
        """
        n, with_greedy, family = self.args.num_samples, self.baseline == "greedy", runner.family
        unwrapped, inputs = ctx.unwrapped, ctx.inputs
        keys = runner.rollout_keys.next(ctx.step, labels.shape[0], n, labels.device)
        if not prefixes.any():  # Δ covers every target: the rollout of REINFORCE itself
            return family.sample(unwrapped, inputs, runner.rollout_config, n, with_greedy=with_greedy, keys=keys)
        config = runner.rollout_config
        budget = decode_budget(config)  # the whole output's length limit
        pad, parts = pad_id(unwrapped), []
        for length in prefixes.unique().tolist():
            rows = (prefixes == length).nonzero().squeeze(1)
            sub_batch = {k: v[rows] for k, v in inputs.items() if torch.is_tensor(v)}
            sub_keys = keys.view(-1, n)[rows].reshape(-1)  # each source draws from its own keys, whatever its group
            if length == 0:
                part = family.sample(unwrapped, sub_batch, config, n, with_greedy=with_greedy, keys=sub_keys)
            else:
                continuation = copy.deepcopy(config)
                continuation.max_new_tokens = max(1, budget - length)
                part = family.sample_from_prefix(unwrapped, sub_batch, labels[rows, :length], continuation, n,
                                                 with_greedy=with_greedy, keys=sub_keys)
            parts.append((rows, part))
        width = max(part.sample_ids.shape[1] for _, part in parts)
        sample_ids = labels.new_full((labels.shape[0] * n, width), pad)
        sample_mask = torch.zeros_like(sample_ids, dtype=torch.bool)
        greedy_ids = labels.new_full((labels.shape[0], width), pad) if with_greedy else None
        greedy_mask = torch.zeros_like(greedy_ids, dtype=torch.bool) if with_greedy else None
        sample_cut = torch.zeros(sample_ids.shape[0], dtype=torch.bool, device=labels.device)
        greedy_cut = torch.zeros(labels.shape[0], dtype=torch.bool, device=labels.device) if with_greedy else None
        for rows, part in parts:
            sample_rows = (rows.unsqueeze(1) * n + torch.arange(n, device=rows.device)).flatten()
            sample_ids[sample_rows] = right_pad(part.sample_ids, width, pad)
            sample_mask[sample_rows] = right_pad(part.sample_mask.long(), width, 0).bool()
            sample_cut[sample_rows] = part.sample_cut
            if with_greedy:
                greedy_ids[rows] = right_pad(part.greedy_ids, width, pad)
                greedy_mask[rows] = right_pad(part.greedy_mask.long(), width, 0).bool()
                greedy_cut[rows] = part.greedy_cut
        return Rollout(sample_ids, sample_mask, greedy_ids, greedy_mask, n, sample_cut, greedy_cut)
