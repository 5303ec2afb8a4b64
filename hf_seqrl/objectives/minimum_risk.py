"""Minimum risk training (Shen et al., 2016; Edunov et al., 2018).

One step: draw candidates (samples and / or the beam's n-best, plus the greedy decode and the reference when asked;
capped at a length limit relative to the source when one is set) → rewards → drop duplicates →
log-probs of every candidate (with grad) → risk `sum_y Q(y) (1 - r(y))`, `Q ∝ p^α` over the source's candidates,
mixed with cross-entropy by `rl_weight` (− entropy, + KL on the sampled positions). The math is
`functional.risk.minimum_risk`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .. import losses
from ..configs import MRTConfig
from ..functional.risk import first_occurrence_mask, minimum_risk
from ..models.base import decode_budget
from ..models.tokens import cut_at_limit, eos_ids, pad_id, right_pad
from ..models.beam import cap_lengths, length_limits
from ..rewards.builtin import TOKEN_REWARDS
from ..rewards.spans import TokenScore
from ..rewards.token_match import TokenMatchReward
from ..papers import Method, Paper
from ..types import RolloutBatch, ScoredRollout, repeat_rows
from .base import Defaults, Objective, RolloutPlan, Runner, StepContext, StepLoss

SHEN_2016 = Paper(key="shen2016mrt", cite="Shen et al., 2016", url="https://aclanthology.org/P16-1159/",
                  title="Minimum Risk Training for Neural Machine Translation", citation="""\
@inproceedings{shen2016mrt,
  title     = {Minimum Risk Training for Neural Machine Translation},
  author    = {Shen, Shiqi and Cheng, Yong and He, Zhongjun and He, Wei and Wu, Hua and Sun, Maosong and Liu, Yang},
  booktitle = {Proceedings of the 54th Annual Meeting of the ACL},
  year      = {2016},
  url       = {https://aclanthology.org/P16-1159/}
}""")


def candidate_set(parts: list[tuple[torch.Tensor, torch.Tensor, int]], drawn: int, pad: int):
    """Returns `(token_ids, token_mask, is_drawn)` of each source's candidates: the rows of every part in order.

    Args:
        parts: `(ids, mask, m)` triples, `m` candidates per source each, contiguous per source: ids and mask of shape
            `(B*m, T_j)` (samples, the beam's n-best, greedy decodes, references).
        drawn (`int`): how many of each source's first candidates were drawn (samples or n-best), as opposed to added.
        pad (`int`): pad token id, written after every candidate's last counted token.

    Returns: token ids `(B*k, T_max)`, their mask `(B*k, T_max)` and a bool `(B*k,)` that is true on drawn rows, with
    `k = sum of m` contiguous candidates per source.
    """
    batch = parts[0][0].shape[0] // parts[0][2]
    grouped = [(ids.view(batch, m, -1), mask.view(batch, m, -1)) for ids, mask, m in parts]
    length = max(ids.shape[-1] for ids, _ in grouped)

    def widen(x: torch.Tensor, value: int) -> torch.Tensor:  # (B, rows, T) -> (B, rows, length)
        return right_pad(x.flatten(0, 1), length, value).view(x.shape[0], x.shape[1], length)

    # One pad id after the counted tokens makes equal sequences equal rows (see `first_occurrence_mask`).
    token_ids = torch.cat([widen(ids.masked_fill(~mask.bool(), pad), pad) for ids, mask in grouped], dim=1)
    token_mask = torch.cat([widen(mask.long(), 0).bool() for _, mask in grouped], dim=1)
    k = token_ids.shape[1]
    is_drawn = (torch.arange(k, device=token_ids.device) < drawn).repeat(batch)
    return token_ids.flatten(0, 1), token_mask.flatten(0, 1), is_drawn


def token_level_rewards(reward_funcs) -> list[str]:
    """Returns the names of the token-level rewards in `reward_funcs` (what a trainer's argument takes: a name, a
    reward, a list of them, combinations and gates of them): the built-in names of `TOKEN_REWARDS` and the
    `TokenMatchReward`s, wherever they are nested."""
    found, todo = [], list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    while todo:
        item = todo.pop(0)
        if isinstance(item, str) and item in TOKEN_REWARDS:
            found.append(item)
        elif isinstance(item, TokenMatchReward):
            found.append(item.__name__)
        else:
            todo.extend(getattr(item, "rewards", None) or [])
    return found


class Candidates(NamedTuple):
    """The rollout stage of MRT: each source's `group` candidates, contiguous (`candidate_set`)."""

    token_ids: torch.Tensor  # (B*k, T)
    token_mask: torch.Tensor  # (B*k, T)
    is_drawn: torch.Tensor  # (B*k,): sampled or from the beam, as opposed to the greedy decode and the reference
    group: int  # k
    drawn_cut: torch.Tensor  # (B*drawn,): the drawn candidates cut at a length limit
    greedy_ids: torch.Tensor | None  # (B, T'): each source's greedy decode, for the sample log
    targets: torch.Tensor | None  # (B, T_gold): the reference candidates, in target coordinates


@dataclass
class CandidateBatch(RolloutBatch):
    """A scored candidate set as MRT's loss reads it: `RolloutBatch` (the candidates, their rewards, `kept` the
    distinct ones with a reward) plus which were drawn and the reference rows."""

    is_drawn: torch.Tensor | None = None  # (B*k,): sampled or from the beam, as opposed to greedy and reference rows
    targets: torch.Tensor | None = None  # (B, T_gold): the reference candidates, in target coordinates


class MinimumRisk(Objective):
    """The expected cost `1 - reward` under `Q ∝ p(y|x)^α`, renormalized over a candidate set per source (samples
    and / or the beam's n-best, optionally the greedy decode and the reference; duplicates counted once). No
    baseline: the renormalization over candidates plays its part. Dropout off by default: `Q` is the distribution
    the candidates came from (benchmarks/README.md, "MRT's candidate sets")."""

    defaults = Defaults(algorithm_id="mrt", config_class=MRTConfig, disable_dropout=True)
    method = Method("Minimum risk training", "mrt", "the expected cost 1 - reward under the model's alpha-sharpened "
                    "distribution over each source's candidate set", (SHEN_2016,))

    @classmethod
    def check_arguments(cls, reward_funcs, teacher_model, args) -> None:
        token_level = token_level_rewards(reward_funcs)
        if token_level:  # a reward of their own that returns token-level values is refused at its first value
            raise ValueError(
                f"MRTTrainer: reward_funcs holds the token-level reward {', '.join(map(repr, token_level))}, which MRT "
                "cannot use: its risk weighs whole candidates. Train it with a policy-gradient trainer (SCSTTrainer, "
                "ReinforceTrainer; hf-seqrl train --algorithm scst), or give MRT a sentence reward such as 'chrf'.")

    def rollout_plan(self, step: int) -> RolloutPlan:
        # With beam candidates only, the n-best comes from `generate` and nothing is sampled.
        return RolloutPlan(from_source=self.args.mrt_candidates != "beam", greedy=self.args.mrt_include_greedy)

    def draw_candidates(self, runner: Runner, ctx: StepContext):
        """Returns `(drawn, greedy, drawn_cut)`: the candidates each source draws as `candidate_set` parts (its
        samples, its beam's n-best, as configured), its greedy decode as one more part `(ids (B, T), mask, 1)` or
        None, each capped at the source's length limit, and which drawn candidates were cut at a length limit
        (`(B*drawn,)` in `candidate_set`'s order of the drawn rows; `hf_seqrl.models.tokens.cut_at_limit`)."""
        args, n, unwrapped, inputs = self.args, self.args.num_samples, ctx.unwrapped, ctx.inputs
        limits = None
        if args.max_len_b is not None:
            source_lengths = runner.family.prompts(unwrapped, inputs)[1].sum(dim=1)
            limits = length_limits(source_lengths, args.max_len_a, args.max_len_b)
        eos, pad = (eos_ids(unwrapped) or [pad_id(unwrapped)])[0], pad_id(unwrapped)

        def capped(ids, mask, rows_per_source):
            if limits is None:
                return ids, mask, rows_per_source
            return (*cap_lengths(ids, mask, limits.repeat_interleave(rows_per_source), eos, pad), rows_per_source)

        parts, greedy, cuts = [], None, []
        if args.mrt_candidates != "beam":
            rollout = runner.take_rollout(ctx)
            parts.append(capped(rollout.sample_ids, rollout.sample_mask, n))
            cut = rollout.sample_cut
            if limits is not None:  # a sample longer than its limit ends in the EOS written there
                cut = cut | (rollout.sample_mask.sum(dim=1) > limits.repeat_interleave(n))
            cuts.append(cut.view(-1, n))
            if args.mrt_include_greedy:
                greedy = capped(rollout.greedy_ids, rollout.greedy_mask, 1)
        if "beam" in args.mrt_candidates:
            budget = decode_budget(runner.rollout_config)
            with runner.decoding(unwrapped):
                ids, mask = runner.family.beam_search(unwrapped, inputs, args.mrt_beam_size, n, budget, limits)
            parts.append((ids, mask, n))
            # `generate` forces the model's forced EOS at the budget, and EOS at each source's limit.
            cut = cut_at_limit(ids, mask, eos_ids(unwrapped), budget, unwrapped.generation_config.forced_eos_token_id)
            if limits is not None:
                cut = cut | cut_at_limit(ids, mask, eos_ids(unwrapped), limits.repeat_interleave(n), eos)
            cuts.append(cut.view(-1, n))
        return parts, greedy, torch.cat(cuts, dim=1).flatten()

    def rollout(self, runner: Runner, ctx: StepContext) -> Candidates:
        """Each source's candidate set (`draw_candidates`, then the greedy decode and the reference when asked)."""
        if self.args.mrt_include_reference and ctx.inputs.get("labels") is None:
            raise ValueError(
                "MRTConfig.mrt_include_reference=True adds each source's tokenized label to its candidates, but the "
                "dataset has no 'labels': add them (tokenizer(text_target=...)) or set mrt_include_reference=False.")
        parts, greedy, drawn_cut = self.draw_candidates(runner, ctx)
        drawn = sum(m for _, _, m in parts)
        greedy_ids = None if greedy is None else greedy[0]
        if greedy is not None:
            parts.append(greedy)
        targets = None
        if self.args.mrt_include_reference:
            targets = runner.family.target_labels(ctx.inputs)  # the label in target coordinates (a causal completion)
            parts.append((targets, targets != -100, 1))
        token_ids, token_mask, is_drawn = candidate_set(parts, drawn, pad_id(ctx.unwrapped))
        return Candidates(token_ids, token_mask, is_drawn, sum(m for _, _, m in parts), drawn_cut, greedy_ids, targets)

    def weigh(self, runner: Runner, candidates: Candidates, ctx: StepContext) -> CandidateBatch:
        """The candidates' rewards, which of them count in `Q` (distinct, with a reward) and the metrics of the drawn
        ones; MRT weighs the candidates in its loss, with no baseline or advantage."""
        k = candidates.group
        per_candidate = repeat_rows(ctx.text, k)
        values = runner.reward_values(candidates.token_ids, per_candidate)
        if any(isinstance(value, TokenScore) for value in values.values):
            raise ValueError(f"reward {runner.reward_label!r} returns token-level values, which MRT cannot use: its "
                             "risk weighs whole candidates. Use a policy-gradient trainer (SCSTTrainer, "
                             "ReinforceTrainer) for token-level rewards, or return a number per prediction.")
        keep = first_occurrence_mask(candidates.token_ids, k) & ~values.left_out
        drawn = candidates.is_drawn
        samples = values.select(drawn)
        metrics = runner.rewards.metrics(samples, samples.left_out, candidates.token_mask[drawn], candidates.drawn_cut,
                                         per_candidate.select(drawn.tolist()))
        if runner.completions is not None:  # the drawn candidates' rows; no baseline or advantage in MRT
            runner.record_completions(ctx, samples, candidates.drawn_cut, greedy_ids=candidates.greedy_ids)
        return CandidateBatch(candidates.token_ids, candidates.token_mask, None, metrics, kept=keep, group=k,
                              rewards=values.rewards, is_drawn=drawn, targets=candidates.targets)

    def score(self, runner: Runner, model, batch: CandidateBatch, ctx: StepContext) -> ScoredRollout:
        # Q is defined by the model's own probabilities: temperature 1, whatever the candidates were sampled at. The
        # reference candidate, when there is one, is the gold row of the cross-entropy term.
        gold = None if self.args.mrt_include_reference else runner.gold_labels(ctx.inputs)
        return runner.score_policy(model, ctx, batch.sample_ids, batch.group, gold, temperature=1.0)

    def loss(self, scored: ScoredRollout, batch: CandidateBatch, ctx: StepContext) -> StepLoss:
        """The risk `sum_y Q(y) (1 - r(y))` over each source's distinct candidates (`functional.risk.minimum_risk`);
        records `mrt/*`. The entropy and KL terms count the drawn candidates, as the other objectives count their
        samples."""
        args, k = self.args, batch.group
        seq_logprobs = losses.sequence_logprobs(scored.token_logprobs, batch.sample_mask, args.length_normalize)
        risk = minimum_risk(seq_logprobs, batch.rewards, k, args.mrt_alpha, batch.kept)
        metrics = {**batch.metrics,
                   "mrt/risk": risk.loss.item(),
                   "mrt/q_entropy": torch.special.entr(risk.q.detach()).sum(dim=-1).mean().item(),
                   "mrt/distinct_candidates": batch.kept.view(-1, k).sum(dim=-1).float().mean().item()}
        return StepLoss(risk.loss, batch.sample_mask & batch.is_drawn.unsqueeze(1), metrics)

    def cross_entropy(self, runner: Runner, scored: ScoredRollout, batch: CandidateBatch,
                      ctx: StepContext) -> torch.Tensor | None:
        """The cross-entropy of the reference candidate (the last of each source, scored at temperature 1) when the
        candidates hold it, else of the gold rows."""
        labels, targets, k = runner.gold_labels(ctx.inputs), batch.targets, batch.group
        if labels is None or targets is None:
            return runner.gold_cross_entropy(scored, labels)
        width = targets.shape[1]
        last = [None if x is None else x.view(-1, k, x.shape[1])[:, -1, :width]
                for x in (scored.token_logprobs, scored.raw_logprobs, scored.raw_logprob_sums)]
        return runner.cross_entropy_of(*last[:1], targets, *last[1:], scored.vocab_size)
