"""`RewardScorer`: the rewards of a rewarded trainer, from `reward_funcs` to the numbers a step uses.

It builds the reward (in worker processes with `reward_workers >= 2`), places its model rewards on the trainer's
device with the policy's attention, calls it on decoded sequences, combines the parts into one value per sequence,
and summarises what the samples scored (`rl/*` metrics). The trainer keeps what needs the training loop: the step
number and the checkpoint written when a reward fails (`save_on_error`).
"""

from __future__ import annotations

import math

import torch

from ...hub import reward_label
from ...models.languages import decode_texts, text_ids
from ...rewards import PooledReward, RewardError, build_reward, call_reward_parts, combine_parts, reward_name
from ...rewards.combine import model_rewards, place_on
from ...rewards.convention import CombinedReward, check_finite, part_weights
from ...rewards.spans import TokenScore, piece_char_spans, sentence_score, token_char_spans
from ...rewards.combine import set_attention
from ...rewards.guards import LengthRatioReward
from ...types import BatchText, RewardValues

# What `rl/length_ratio` measures: a sample's words over its closest reference's (its source's without one).
LENGTH_RATIO = LengthRatioReward()


class RewardScorer:
    """The reward of `reward_funcs` (weighted by `args.reward_weights`) as a trainer calls it.

    Args:
        reward_funcs: what the trainer was given (a built-in name, a callable, an `evaluate` module, or a list).
        args (`RolloutConfig`): `reward_weights`, `reward_workers`, `nonfinite_rewards`, `model_init_kwargs` and the
            device.
    """

    def __init__(self, reward_funcs, args):
        self.config_name = type(args).__name__
        self.reward_funcs, self.weights = reward_funcs, args.reward_weights
        self.nonfinite = args.nonfinite_rewards
        workers = args.reward_workers
        self.fn = (PooledReward(reward_funcs, args.reward_weights, workers) if workers >= 2
                   else build_reward(reward_funcs, args.reward_weights))
        # The reward as this process holds it (a pooled one's in-process copy): its parts, weights and models.
        self.local = getattr(self.fn, "local", self.fn)
        if workers >= 2 and model_rewards(self.local):
            raise ValueError(
                f"{self.config_name}.reward_workers={workers} scores rewards in worker processes, but "
                "reward_funcs holds a model reward, which runs batched on the trainer's device: set reward_workers=0.")
        # A model reward runs on this process's device, outside the model that DDP / ZeRO / FSDP wrap.
        place_on(self.local, args.device)
        attention = (args.model_init_kwargs or {}).get("attn_implementation")
        if attention is not None:  # the model rewards attend as the policy does
            set_attention(self.local, attention)
        self.label = reward_name(self.fn)
        if getattr(args, "multi_objective_aggregation", None) == "normalize_then_sum" and \
                isinstance(self.local, CombinedReward):
            self.local.part_weights()  # a gate has no weights to normalize by: refused here, not at the first step

    def card_label(self) -> str:
        """Returns the reward as the model card names it: the names the user gave in `reward_funcs`, with weights."""
        return reward_label(self.reward_funcs, self.weights)

    def score(self, token_ids: torch.Tensor, text: BatchText, tokenizer, step: int,
              token_mask: torch.Tensor | None = None) -> RewardValues:
        """Returns the decoded `token_ids` `(N, T)`, their rewards and each reward function's values (scored once;
        the rewards are the parts' combination). `text` holds one row per sequence (see `repeat_rows`); `step` is
        the optimizer step the values are for (1 for the first). A sequence no reward applies to (`None`) is left
        out, and so is a non-finite reward with `nonfinite_rewards="drop"`. Raises `RewardError` when a reward
        fails. With `token_mask` `(N, T)` (the tokens each sequence counts, EOS included), the token-level values
        rewards return are mapped to the tokens (`RewardValues.token_values`, `token_values`); the rewards are the
        sentence scores."""
        predictions = decode_texts(tokenizer, token_ids)
        parts = call_reward_parts(self.fn, predictions, text.references, text.sources, text.columns,
                                  name=self.label, step=step)
        values = combine_parts(self.fn, parts)
        if self.nonfinite == "error":
            check_finite(values, self.label, self.config_name)
        numbers = [float("nan") if value is None else sentence_score(value) for value in values]
        rewards = torch.tensor(numbers, dtype=torch.float32, device=token_ids.device)
        left_out = ~torch.isfinite(rewards)
        token_values = None
        if token_mask is not None and any(isinstance(value, TokenScore) for value in values):
            token_values = self.token_values(values, token_ids, token_mask, predictions, tokenizer, step)
        return RewardValues(predictions, values, parts, rewards.masked_fill(left_out, 0.0), left_out, token_values)

    def token_values(self, values: list, token_ids: torch.Tensor, token_mask: torch.Tensor, predictions: list[str],
                     tokenizer, step: int) -> torch.Tensor:
        """Returns `(N, T)` float32: each counted token's value from the `TokenScore`s among `values`, through the
        text each token adds to the decoded prediction (`char_spans`; tokenizer-independent), 0 elsewhere. Raises a
        `RewardError` when per-token values are not one per counted token."""
        out = torch.zeros(token_ids.shape, dtype=torch.float32)
        lengths = token_mask.sum(dim=1).tolist()
        for i, value in enumerate(values):
            if not isinstance(value, TokenScore) or not lengths[i]:
                continue
            ids = token_ids[i, :lengths[i]].tolist()
            try:
                row = value.token_values(char_spans(tokenizer, text_ids(tokenizer, [ids])[0], predictions[i]))
            except ValueError as error:
                raise RewardError(f"reward {self.label!r} at step {step}, prediction {i} ({predictions[i][:60]!r}): "
                                  f"{error}.") from error
            out[i, :lengths[i]] = torch.tensor(row, dtype=torch.float32)
        return out.to(token_ids.device)

    def part_tensors(self, values: RewardValues) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns each reward function's values `(K, N)` (NaN where it gives none) and their weights `(K,)`, for the
        advantages that normalize each part before summing (`multi_objective_aggregation="normalize_then_sum"`)."""
        weights = part_weights(self.local, values.parts)
        part_rewards = values.part_rewards()
        stacked = torch.stack([part_rewards[name] for name in values.parts])
        return stacked, torch.tensor([weights[name] for name in values.parts], dtype=torch.float32,
                                     device=stacked.device)

    def metrics(self, samples: RewardValues, left_out, sample_mask, sample_cut,
                text: BatchText | None = None) -> dict[str, float]:
        """Returns the `rl/*` metrics of the sampled sequences: those of `sample_metrics` (length, the share cut at the
        length limit (`sample_cut` `(N,)`, `Rollout.sample_cut`), degenerate shares, the length ratio; `text` holds one
        row per sample), the reward over the samples not `left_out` (`(N,)` bool), each reward function's mean and
        std over the samples it gave a value (`RewardValues.part_rewards`), and the counts of missing (None) and
        dropped non-finite rewards."""
        kept = samples.rewards[~left_out]
        metrics = sample_metrics(samples.predictions, sample_mask, sample_cut, text)
        if kept.numel():
            metrics["rl/reward"] = kept.mean().item()
            metrics["rl/reward_std"] = kept.std().item() if kept.numel() > 1 else 0.0
        for name, values in samples.part_rewards().items():
            values = values[torch.isfinite(values)]
            if values.numel():
                metrics[f"rl/rewards/{name}/mean"] = values.mean().item()
                metrics[f"rl/rewards/{name}/std"] = values.std().item() if values.numel() > 1 else 0.0
        if samples.token_values is not None:  # what the token-level rewards said of the counted tokens
            counted = sample_mask & ~left_out.unsqueeze(1)
            if counted.any():
                metrics["rl/token_reward"] = samples.token_values[counted].mean().item()
                metrics["rl/frac_tokens_rewarded"] = (samples.token_values[counted] != 0).float().mean().item()
        missing = samples.missing()
        metrics["rl/missing_rewards"] = float(missing)
        if self.nonfinite == "drop":
            metrics["rl/nonfinite_rewards"] = float(samples.left_out.sum().item() - missing)
        return metrics


def sample_metrics(predictions: list[str], sample_mask, sample_cut, text: BatchText | None = None) -> dict[str, float]:
    """Returns the `rl/*` metrics of sampled sequences that need no reward: `rl/phase` (1), `rl/sample_length` (mean
    counted tokens of `sample_mask` `(N, T)`, EOS included), `rl/frac_empty` (only EOS), `rl/frac_truncated` (the
    share `sample_cut` `(N,)` marks cut at the length limit) and `rl/length_ratio`: the decoded `predictions`' length
    in words over their closest reference's (their source's without one; `text` holds one row per sample)."""
    metrics = {
        "rl/phase": 1.0,
        "rl/sample_length": sample_mask.sum(dim=1).float().mean().item(),
        # Degenerate rollouts are logged, not fatal: samples that are only EOS, or hit the length limit.
        "rl/frac_empty": (sample_mask.sum(dim=1) <= 1).float().mean().item(),
        "rl/frac_truncated": sample_cut.float().mean().item(),
    }
    if text is not None and text.references is not None:
        ratios = [LENGTH_RATIO.ratio(prediction, references, None if text.sources is None else text.sources[i])
                  for i, (prediction, references) in enumerate(zip(predictions, text.references))]
        ratios = [ratio for ratio in ratios if ratio is not None and math.isfinite(ratio)]
        if ratios:
            metrics["rl/length_ratio"] = sum(ratios) / len(ratios)
    return metrics


def batch_references(inputs, tokenizer) -> list[list[str]]:
    """Returns each row's references from the batch's `labels` (`references_from_labels`); without labels (a dataset
    of sources alone, taken only when no setting reads a reference: `references.target_settings`), an empty list per
    row: what the rewards get as `references` then."""
    if inputs.get("labels") is None:
        return [[] for _ in range(inputs["input_ids"].shape[0])]
    return references_from_labels(inputs["labels"], tokenizer)


def references_from_labels(labels, tokenizer) -> list[list[str]]:
    """Returns the decoded `labels` `(B, T)` as each row's single reference, or raises naming the row without."""
    ids = labels.masked_fill(labels == -100, tokenizer.pad_token_id)
    texts = decode_texts(tokenizer, ids)
    for i, text in enumerate(texts):
        if not text.strip():
            raise ValueError(
                f"Row {i} of the batch has no reference: its labels are all -100/padding. Fix or drop that row."
            )
    return [[t] for t in texts]


def char_spans(tokenizer, ids: list[int], text: str) -> list[tuple[int, int]]:
    """Returns each of `ids`' `(start, end)` in `text`, their decoded prediction: from a fast tokenizer's incremental
    decoder in one pass where its chunks spell `text` (`spans.piece_char_spans`), else from the decoded prefixes
    (`spans.token_char_spans`, one decode per token). Bytes that form no character (U+FFFD in `text`) take the
    prefixes too: the incremental decoder holds them back, a prefix writes each as U+FFFD at once."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and "\ufffd" not in text:
        from tokenizers.decoders import DecodeStream

        stream = DecodeStream(skip_special_tokens=True)
        spans = piece_char_spans([stream.step(backend, i) or "" for i in ids], text)
        if spans is not None:
            return spans
    prefixes = tokenizer.batch_decode([ids[:t] for t in range(1, len(ids) + 1)], skip_special_tokens=True)
    return token_char_spans(prefixes, text)
