"""`MRTTrainer`: minimum risk training (Shen et al., 2016; Edunov et al., 2018).

One step: draw candidates (samples and / or the beam's n-best, plus the greedy decode and the reference when asked;
capped at a length limit relative to the source when one is set) → rewards → drop duplicates →
log-probs of every candidate (with grad) → risk `sum_y Q(y) (1 - r(y))`, `Q ∝ p^α` over the source's candidates,
mixed with cross-entropy by `rl_weight` (− entropy, + KL on the sampled positions). The math is
`hf_seqrl.losses.minimum_risk_loss`.
"""

from __future__ import annotations

import torch

from .. import losses
from ..configs import MRTConfig
from ..hub import Method, Paper
from ..models.base import cut_at_limit, decode_budget, eos_ids, pad_id, right_pad
from ..models.beam import cap_lengths, length_limits
from ..types import BatchText, repeat_rows
from .rollout import RolloutPlan, RolloutTrainer

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


class MRTTrainer(RolloutTrainer):
    """Minimum risk training (Shen et al., 2016; Edunov et al., 2018).

    Loss: the expected cost `1 - reward` under `Q ∝ p(y|x)^α`, renormalized over a candidate set per source
    (samples, optionally the greedy decode and the reference; duplicates counted once), mixed with cross-entropy by
    `rl_weight`. Baseline: none (the renormalization over candidates plays its part).

    `args` is an `MRTConfig`. Logs `mrt/risk`, `mrt/q_entropy`, `mrt/distinct_candidates` and the `rl/*` metrics of
    the samples (reward, length, entropy, KL, cross-entropy).
    """

    config_class = MRTConfig
    algorithm_id = "mrt"
    method = Method("Minimum risk training", "mrt", "the expected cost 1 - reward under the model's alpha-sharpened "
                    "distribution over each source's candidate set", (SHEN_2016,))
    model_families = ("seq2seq", "causal")

    def rollout_plan(self) -> RolloutPlan | None:
        plan = super().rollout_plan()
        # With beam candidates only, the n-best comes from `generate` and nothing is sampled.
        return plan and RolloutPlan(from_source=self.args.mrt_candidates != "beam", greedy=self.args.mrt_include_greedy)

    def draw_candidates(self, unwrapped, inputs):
        """Returns `(drawn, greedy, drawn_cut)`: the candidates each source draws as `candidate_set` parts (its
        samples, its beam's n-best, as configured), its greedy decode as one more part `(ids (B, T), mask, 1)` or
        None, each capped at the source's length limit, and which drawn candidates were cut at a length limit
        (`(B*drawn,)` in `candidate_set`'s order of the drawn rows; `hf_seqrl.models.base.cut_at_limit`)."""
        args, n = self.args, self.args.num_samples
        limits = None
        if args.max_len_b is not None:
            source_lengths = self.family.prompts(unwrapped, inputs)[1].sum(dim=1)
            limits = length_limits(source_lengths, args.max_len_a, args.max_len_b)
        eos, pad = (eos_ids(unwrapped) or [pad_id(unwrapped)])[0], pad_id(unwrapped)

        def capped(ids, mask, rows_per_source):
            if limits is None:
                return ids, mask, rows_per_source
            return (*cap_lengths(ids, mask, limits.repeat_interleave(rows_per_source), eos, pad), rows_per_source)

        parts, greedy, cuts = [], None, []
        if args.mrt_candidates != "beam":
            rollout = self.take_rollout(unwrapped, inputs)
            parts.append(capped(rollout.sample_ids, rollout.sample_mask, n))
            cut = rollout.sample_cut
            if limits is not None:  # a sample longer than its limit ends in the EOS written there
                cut = cut | (rollout.sample_mask.sum(dim=1) > limits.repeat_interleave(n))
            cuts.append(cut.view(-1, n))
            if args.mrt_include_greedy:
                greedy = capped(rollout.greedy_ids, rollout.greedy_mask, 1)
        if "beam" in args.mrt_candidates:
            budget = decode_budget(self.rollout_config)
            with self.decoding(unwrapped):
                ids, mask = self.family.beam_search(unwrapped, inputs, args.mrt_beam_size, n, budget, limits)
            parts.append((ids, mask, n))
            # `generate` forces the model's forced EOS at the budget, and EOS at each source's limit.
            cut = cut_at_limit(ids, mask, eos_ids(unwrapped), budget, unwrapped.generation_config.forced_eos_token_id)
            if limits is not None:
                cut = cut | cut_at_limit(ids, mask, eos_ids(unwrapped), limits.repeat_interleave(n), eos)
            cuts.append(cut.view(-1, n))
        return parts, greedy, torch.cat(cuts, dim=1).flatten()

    def rl_loss(self, model, inputs, text: BatchText):
        """Returns the MRT loss of a batch and records the `mrt/*` and `rl/*` metrics."""
        args = self.args
        unwrapped = self.accelerator.unwrap_model(model)
        labels = inputs.get("labels")
        if args.mrt_include_reference and labels is None:
            raise ValueError(
                "MRTConfig.mrt_include_reference=True adds each source's tokenized label to its candidates, but the "
                "dataset has no 'labels': add them (tokenizer(text_target=...)) or set mrt_include_reference=False.")
        parts, greedy, drawn_cut = self.draw_candidates(unwrapped, inputs)
        drawn = sum(m for _, _, m in parts)
        greedy_ids = None if greedy is None else greedy[0]
        if greedy is not None:
            parts.append(greedy)
        if args.mrt_include_reference:
            targets = self.family.target_labels(inputs)  # the label in target coordinates (a causal completion)
            parts.append((targets, targets != -100, 1))
        token_ids, token_mask, is_drawn = candidate_set(parts, drawn, pad_id(unwrapped))
        k = sum(m for _, _, m in parts)
        per_candidate = repeat_rows(text, k)
        candidates = self.reward_values(token_ids, per_candidate)
        rewards, bad = candidates.rewards, candidates.left_out
        keep = losses.first_occurrence_mask(token_ids, k) & ~bad
        xe_labels = labels if args.rl_weight < 1 else None
        # Q is defined by the model's own probabilities: temperature 1, whatever the candidates were sampled at.
        scored = self.score_policy(model, inputs, token_ids, k, None if args.mrt_include_reference else xe_labels,
                                   temperature=1.0)
        seq_logprobs = losses.sequence_logprobs(scored.token_logprobs, token_mask, args.length_normalize)
        risk = losses.minimum_risk(seq_logprobs, rewards, k, args.mrt_alpha, keep)
        if xe_labels is not None and args.mrt_include_reference:  # the last candidate, scored at temperature 1
            width = targets.shape[1]
            last = [None if x is None else x.view(-1, k, x.shape[1])[:, -1, :width]
                    for x in (scored.token_logprobs, scored.raw_logprobs, scored.raw_logprob_sums)]
            xe_loss = self.cross_entropy_of(*last[:1], targets, *last[1:], scored.vocab_size)
        else:
            xe_loss = self.gold_cross_entropy(scored, xe_labels)
        samples = candidates.select(is_drawn)
        drawn_mask = token_mask[is_drawn]
        metrics = self.rewards.metrics(samples, samples.left_out, drawn_mask, drawn_cut,
                                      per_candidate.select(is_drawn.tolist()))
        if self.completions is not None:  # the drawn candidates' rows; no baseline or advantage in MRT
            self.record_completions(inputs, text, samples, drawn_cut, unwrapped, greedy_ids=greedy_ids)
        metrics.update({
            "mrt/risk": risk.loss.item(),
            "mrt/q_entropy": torch.special.entr(risk.q.detach()).sum(dim=-1).mean().item(),
            "mrt/distinct_candidates": keep.view(-1, k).sum(dim=-1).float().mean().item(),
        })
        sampled_tokens = token_mask & is_drawn.unsqueeze(1)  # entropy and KL on the drawn candidates, as elsewhere
        return self.finish_loss(risk.loss, xe_loss, inputs, scored, token_ids, k, sampled_tokens, metrics)
