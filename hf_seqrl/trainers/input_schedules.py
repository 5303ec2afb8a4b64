"""Input-schedule trainers: cross-entropy on the gold targets, with decoder inputs other than the gold prefix.

`InputScheduleTrainer` holds the one code path they share, through the model's family (`hf_seqrl.models`):
the source pass runs once (an encoder-decoder's encoder, with grad; a decoder-only model's prompt is the fixed
context of every pass); no-grad passes over its detached output produce the model's own tokens where a trainer
needs them; `decoder_rows` builds the rows fed in place of the gold targets (target coordinates: a decoder-only
model's completion); one gradient pass trains every row on its gold targets with the Trainer's own
cross-entropy (label smoothing included), the mean over the batch's target tokens. The trainers differ only in
`decoder_rows`; the tensor math is in `hf_seqrl.functional.decoder_inputs`.

- `PrefixCorruptionTrainer`: each input replaced with probability σ by a random token or the model's own
  prediction; with `per_token_levels`, noise-level forcing (σ_t ~ U(0, σ) per position). One row per source.
- `KStepRolloutTrainer`: from anchors every k positions the decoder continues the gold prefix on its own tokens
  for k positions, then re-anchors.
- `ScheduledSamplingTrainer` (in `scheduled_sampling.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from ..functional import decoder_inputs as di
from ..configs import KStepRolloutConfig, PrefixCorruptionConfig
from ..papers import Method, Paper
from ..models.tokens import eos_ids, pad_id, shift_right
from ..schedules import corruption_rate
from .base import SeqRLBaseTrainer

CHEN_2024 = Paper(key="chen2024diffusion", cite="Chen et al., 2024", url="https://arxiv.org/abs/2407.01392",
                  title="Diffusion Forcing: Next-token Prediction Meets Full-Sequence Diffusion", citation="""\
@inproceedings{chen2024diffusion,
  title     = {Diffusion Forcing: Next-token Prediction Meets Full-Sequence Diffusion},
  author    = {Chen, Boyuan and Mart{\\'i} Mons{\\'o}, Diego and Du, Yilun and Simchowitz, Max and Tedrake, Russ and
               Sitzmann, Vincent},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year      = {2024},
  url       = {https://arxiv.org/abs/2407.01392}
}""")


def target_context(decoder_inputs: torch.Tensor) -> torch.Tensor:
    """Returns the target-coordinate rows a family's `target_forward` reads for decoder rows `(N, T)`: the input at
    position t + 1 is the context token at t (the start token at position 0 is the family's own). The last
    column is a filler that no trained position reads."""
    return torch.cat([decoder_inputs[:, 1:], decoder_inputs[:, -1:]], dim=1)


@dataclass
class EncodedBatch:
    """A batch after its source pass: what the no-grad passes read.

    Attributes:
        family (`ModelFamily`): the model's family (`hf_seqrl.models`).
        model: the unwrapped model.
        encoded: the family's `encode` output, detached (seq2seq: the encoder states; causal: the prompts). The
            model's tokens are discrete, so no gradient could flow back through them anyway.
    """

    family: object
    model: torch.nn.Module
    encoded: dict

    @torch.no_grad()
    def predict(self, decoder_input_ids: torch.Tensor, sampling: str,
                source_index: torch.Tensor | None = None) -> torch.Tensor:
        """Returns the model's token `(N, T)` at every position of a teacher-forced pass over `decoder_input_ids`.

        The pass runs in the model's current mode (in training, with dropout, like the gradient pass).

        Args:
            decoder_input_ids (`torch.LongTensor` of shape `(N, T)`): decoder rows (target coordinates: position 0
                holds the start token, position t the token fed in place of target t − 1).
            sampling (`str`): `"argmax"` or `"sample"` (from the softmax of the logits).
            source_index (`torch.LongTensor` of shape `(N,)`, *optional*): the source of each row; `None` when the
                rows are the `B` sources in order.
        """
        encoded = self.family.select(self.encoded, source_index)
        logits = self.family.target_forward(self.model, encoded, target_context(decoder_input_ids)).logits
        if sampling == "sample":
            return torch.distributions.Categorical(logits=logits.float()).sample()
        return logits.argmax(dim=-1)


@dataclass
class DecoderRows:
    """The rows of the gradient pass.

    Attributes:
        input_ids (`torch.LongTensor` of shape `(R, T)`): what the decoder is fed.
        labels (`torch.LongTensor` of shape `(R, T)`): the gold target of each trained position, -100 elsewhere.
            Every target of the batch is trained exactly once over all rows, so the mean cross-entropy is over
            the same tokens as teacher forcing.
        source_index (`torch.LongTensor` of shape `(R,)` or None): the source of each row; None when the rows
            are the `B` sources in order.
        metrics (`dict[str, float]`): logged with the step.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    source_index: torch.Tensor | None = None
    metrics: dict = field(default_factory=dict)


def replaced_fraction(replaced: torch.Tensor, labels: torch.Tensor) -> float:
    """Returns the share of replaceable decoder inputs that `replaced` (a bool mask `(B, T)`) marks."""
    return replaced.sum().item() / max(int(di.replaceable_positions(labels).sum()), 1)


class InputScheduleTrainer(SeqRLBaseTrainer):
    """Cross-entropy on the gold targets of decoder rows built by `decoder_rows` (implemented by subclasses)."""

    model_families = ("seq2seq", "causal")

    def schedule_position(self) -> float:
        """Returns the time of the schedule of a `ScheduleConfig` (scheduled sampling, prefix corruption): optimizer
        steps after the warm-up, or completed epochs."""
        if self.args.schedule_unit == "epoch":
            return float(int(self.state.epoch or 0))
        return float(max(0, self.state.global_step - self.args.warmup_xe_steps))

    def decoder_rows(self, batch: EncodedBatch, gold_inputs: torch.Tensor, labels: torch.Tensor) -> DecoderRows:
        """Returns the rows to train on.

        Args:
            batch (`EncodedBatch`): for no-grad passes of the model.
            gold_inputs (`torch.LongTensor` of shape `(B, T)`): teacher-forced decoder inputs.
            labels (`torch.LongTensor` of shape `(B, T)`): gold targets, -100 at padding.
        """
        raise NotImplementedError

    def sequence_loss(self, model, inputs, text, num_items_in_batch):
        if inputs.get("labels") is None:
            raise ValueError(
                f"{type(self).__name__} trains on the gold targets: the dataset needs tokenized 'labels' "
                "(hf_seqrl.data.tokenize_pairs, or tokenize_prompt_completion for a decoder-only model).")
        self.loss_is_scaled_for_ga = False  # a per-batch mean: the Trainer divides it by the accumulation steps
        unwrapped = self.accelerator.unwrap_model(model)
        labels = self.family.target_labels(inputs)
        # Position 0 holds the family's start (the decoder start token, or the prompt's last token); it is never
        # replaced, and the passes read it from the model or the prompt, so pad stands in for it here.
        gold_inputs = shift_right(labels, pad_id(unwrapped), pad_id(unwrapped))
        encoded = self.family.encode(unwrapped, inputs)  # with grad: every row's loss reaches its source
        rows = self.decoder_rows(EncodedBatch(self.family, unwrapped, self.family.detach(encoded)), gold_inputs,
                                 labels)
        loss = self.gold_target_loss(model, encoded, rows)
        self._record("train", {"rl/phase": 1.0, **rows.metrics})
        return loss

    def gold_target_loss(self, model, encoded, rows: DecoderRows):
        """Returns the Trainer's cross-entropy of `rows` (with grad, label smoothing included; the mean over the
        batch's trained tokens), each row reading its source's `encoded` part."""
        selected = self.family.select(encoded, rows.source_index)
        _, loss = self.teacher_forced_cross_entropy(
            model, lambda: self.family.target_forward(model, selected, target_context(rows.input_ids)), rows.labels)
        return loss


class PrefixCorruptionTrainer(InputScheduleTrainer):
    """Prefix corruption, or noise-level forcing (the text analogue of diffusion forcing, Chen et al., 2024).

    Loss: cross-entropy of the gold targets on decoder inputs of which each (never the start token or padding) is
    replaced with probability σ, or σ_t ~ U(0, σ) drawn per position with `per_token_levels`, by a random
    non-special token or the model's own prediction. No reward, no baseline. With σ = 0 it is teacher forcing
    exactly. Same constructor as `Seq2SeqTrainer`; `args` is a `PrefixCorruptionConfig`. Logs
    `pc/corruption_rate` and `pc/replaced_fraction`.
    """

    config_class = PrefixCorruptionConfig
    algorithm_id = "prefix_corruption"
    prefix_corruption = Method("Prefix corruption", "prefix-corruption", "teacher forcing on decoder inputs whose tokens are "
                    "replaced, with a probability, by random tokens or the model's own predictions")
    noise_level_method = Method("Noise-level forcing", "noise-level-forcing", "teacher forcing on decoder inputs "
                                "corrupted at an independent noise level per token", (CHEN_2024,))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._vocabulary: torch.Tensor | None = None

    @property
    def method(self) -> Method:
        """Noise-level forcing with `per_token_levels`, else prefix corruption."""
        return self.noise_level_method if self.args.per_token_levels else self.prefix_corruption

    def corruption_rate(self) -> float:
        """Returns σ at the current step (or epoch), counted from the end of the warm-up."""
        args = self.args
        return corruption_rate(self.schedule_position(), args.corruption_rate, args.schedule, args.schedule_k)

    def replacement_vocabulary(self, model) -> torch.Tensor:
        """Returns the ids random replacements are drawn from: every id the model embeds and the tokenizer knows,
        minus pad, EOS, the decoder start token, BOS and the tokenizer's special tokens."""
        if self._vocabulary is None:
            size = model.get_input_embeddings().num_embeddings
            if hasattr(self.processing_class, "__len__"):
                size = min(size, len(self.processing_class))
            special = {pad_id(model), *self.family.structural_ids(model),
                       getattr(model.generation_config, "bos_token_id", None), *eos_ids(model),
                       *getattr(self.processing_class, "all_special_ids", [])}
            self._vocabulary = di.replacement_vocabulary(size, special).to(model.device)
        return self._vocabulary

    def decoder_rows(self, batch, gold_inputs, labels):
        args = self.args
        rate = self.corruption_rate()
        replaced = di.corruption_mask(labels, rate, args.per_token_levels)
        if args.replacement == "random":
            candidates = di.random_tokens(gold_inputs.shape, self.replacement_vocabulary(batch.model))
            corrupted = torch.where(replaced, candidates, gold_inputs)
        elif replaced.any():  # the model's pass is only paid for when something is replaced
            corrupted = di.feed_back(gold_inputs, batch.predict(gold_inputs, args.sampling), replaced)
        else:
            corrupted = gold_inputs
        return DecoderRows(corrupted, labels, metrics={
            "pc/corruption_rate": rate,
            "pc/replaced_fraction": replaced_fraction(replaced, labels),
        })


class KStepRolloutTrainer(InputScheduleTrainer):
    """k-step rollout: cross-entropy of the gold targets after up to k − 1 of the decoder's own tokens.

    Loss: anchors are positions 0, k, 2k, ...; from anchor a the decoder predicts position a from the gold prefix,
    then positions a+1 .. a+k−1 after feeding back its own tokens for a .. a+k−2, each trained on its gold target;
    the next anchor starts again from the gold prefix. No reward, no baseline. `rollout_steps=1` is teacher
    forcing exactly. What each position sees, for `rollout_context="exact"` and `"shared_row"`, is in
    docs/math.md. Same constructor as `Seq2SeqTrainer`; `args` is a `KStepRolloutConfig`. Logs
    `ks/own_token_accuracy` and `ks/rows_per_source`.
    """

    config_class = KStepRolloutConfig
    algorithm_id = "kstep_rollout"
    method = Method("k-step rollout", "k-step-rollout", "cross-entropy of the gold tokens after the model ran on its "
                    "own outputs for up to k steps from gold anchors")

    def decoder_rows(self, batch, gold_inputs, labels):
        k = self.args.rollout_steps
        if k == 1:
            return DecoderRows(gold_inputs, labels, metrics={"ks/rows_per_source": 1.0})
        if self.args.rollout_context == "shared_row":
            return self.shared_rows(batch, gold_inputs, labels)
        return self.exact_rows(batch, gold_inputs, labels)

    def exact_rows(self, batch, gold_inputs, labels) -> DecoderRows:
        """Returns the gold rows (trained at the anchors) and one row per anchor (trained at its chunk).

        The row of anchor a is the gold prefix up to position a, then the model's own tokens at a+1 .. a+k−1:
        the token at a+j is the model's choice at position a+j−1 of that same row, so every chunk sees exactly
        what a step-by-step decode from the gold prefix up to its anchor would feed it. The tokens are made in
        k − 1 no-grad passes: the first over the gold rows (each anchor's first token has the gold prefix as
        context), the others over all anchor rows at once.
        """
        k, sampling, length = self.args.rollout_steps, self.args.sampling, gold_inputs.shape[1]
        row_source, row_anchor = di.rollout_rows(labels, k)
        rows = gold_inputs[row_source]
        replaceable = di.replaceable_positions(labels)[row_source]
        fed = torch.zeros_like(rows, dtype=torch.bool)
        if len(row_source):
            predicted = batch.predict(gold_inputs, sampling)[row_source]
            for offset in range(1, k):
                if offset > 1:
                    # Causal attention: positions past the last one read here cannot change its prediction.
                    end = min(length, int(row_anchor.max()) + offset)
                    predicted = batch.predict(rows[:, :end], sampling, row_source)
                feed = di.offset_positions(row_anchor, offset, length) & replaceable
                rows = di.feed_back(rows, predicted, feed)
                fed |= feed
        source = torch.arange(len(gold_inputs), device=labels.device)
        return DecoderRows(
            input_ids=torch.cat([gold_inputs, rows]),
            labels=torch.cat([di.anchor_labels(labels, k), di.chunk_labels(labels, row_source, row_anchor, k)]),
            source_index=torch.cat([source, row_source]),
            metrics=self.rollout_metrics(rows, gold_inputs[row_source], fed, 1 + len(row_source) / len(source)),
        )

    def shared_rows(self, batch, gold_inputs, labels) -> DecoderRows:
        """Returns one row per source where every non-anchor input is the model's own token.

        Pass j (j = 1 .. k−1, no grad) feeds the model's choice at position t−1 into every position t with
        t mod k = j; its row then holds own tokens at offsets 1 .. j−1 of every chunk, gold tokens elsewhere. So a
        chunk also sees the own tokens of the chunks before it, and those were chosen before the later offsets of
        earlier chunks had been replaced: an approximation of the exact rollout, at one row per source.
        """
        k, sampling = self.args.rollout_steps, self.args.sampling
        rows = gold_inputs
        fed = torch.zeros_like(rows, dtype=torch.bool)
        for offset in range(1, k):
            feed = di.chunk_offset_positions(labels, k, offset)
            rows = di.feed_back(rows, batch.predict(rows, sampling), feed)
            fed |= feed
        return DecoderRows(rows, labels, metrics=self.rollout_metrics(rows, gold_inputs, fed, 1.0))

    @staticmethod
    def rollout_metrics(rows, gold_rows, fed, rows_per_source: float) -> dict[str, float]:
        """Returns `ks/own_token_accuracy` (share of fed own tokens equal to the gold input they replace) and
        `ks/rows_per_source` (decoder rows of the gradient pass per source)."""
        matches = (rows == gold_rows) & fed
        accuracy = matches.sum().item() / max(int(fed.sum()), 1)
        return {"ks/own_token_accuracy": accuracy, "ks/rows_per_source": rows_per_source}
