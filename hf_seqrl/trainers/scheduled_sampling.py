"""`ScheduledSamplingTrainer`: two-pass scheduled sampling for transformer decoders.

Mihaylova & Martins (2019): pass 1 runs the decoder on the gold prefix and takes its prediction at every
position; pass 2 trains with cross-entropy against the gold targets on decoder inputs where each token is
the gold one with probability ε (the teacher-forcing ratio of Bengio et al., 2015) and the pass-1
prediction otherwise. The encoder runs once; both passes read its output.
"""

from __future__ import annotations

import torch

from ..configs import ScheduledSamplingConfig
from ..schedules import teacher_forcing_ratio
from .base import SeqRLBaseTrainer


def mix_decoder_inputs(
    gold_inputs: torch.Tensor,
    predicted_tokens: torch.Tensor,
    labels: torch.Tensor,
    ratio: float,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns `(mixed decoder inputs, replaced mask)`: each gold input kept with probability `ratio`.

    The input at position t is the target at t-1, so its replacement is the pass-1 prediction at t-1.
    Position 0 (the decoder start token) and positions whose previous target is padding are never replaced.

    Args:
        gold_inputs (`torch.LongTensor` of shape `(B, T)`): teacher-forced decoder inputs (start + labels[:-1]).
        predicted_tokens (`torch.LongTensor` of shape `(B, T)`): pass-1 prediction at each position.
        labels (`torch.LongTensor` of shape `(B, T)`): gold targets, -100 at padding.
        ratio (`float`): ε, the probability of keeping the gold token.
    """
    replaceable = torch.zeros_like(labels, dtype=torch.bool)
    replaceable[:, 1:] = labels[:, :-1] != -100
    draws = torch.rand(labels.shape, generator=generator, device=labels.device)
    replaced = replaceable & (draws >= ratio)
    candidates = torch.empty_like(gold_inputs)
    candidates[:, 0] = gold_inputs[:, 0]
    candidates[:, 1:] = predicted_tokens[:, :-1]
    return torch.where(replaced, candidates, gold_inputs), replaced


class ScheduledSamplingTrainer(SeqRLBaseTrainer):
    """Cross-entropy training where the decoder sees its own predictions with probability 1 − ε.

    Same constructor as `Seq2SeqTrainer`; `args` is a `ScheduledSamplingConfig`. With ε = 1 the loss is plain
    teacher forcing exactly.
    """

    config_class = ScheduledSamplingConfig
    algorithm = "Scheduled sampling"
    model_families = ("seq2seq", "causal")

    def teacher_forcing_ratio(self) -> float:
        """Returns ε at the current step (or epoch), counted from the end of the warm-up."""
        args = self.args
        if args.schedule_unit == "epoch":
            position = float(int(self.state.epoch or 0))
        else:
            position = float(max(0, self.state.global_step - args.warmup_xe_steps))
        return teacher_forcing_ratio(position, args.schedule, args.schedule_k, args.min_teacher_forcing_ratio)

    def sequence_loss(self, model, inputs, text, num_items_in_batch):
        self.loss_is_scaled_for_ga = None  # the Trainer's own cross-entropy path below
        unwrapped = self.accelerator.unwrap_model(model)
        # Through the model family: seq2seq models mix decoder inputs, causal ones the completion tokens of input_ids.
        gold_inputs, labels = self.family.teacher_forcing(unwrapped, inputs)
        # Encoder once, with grad (seq2seq); pass 1 reads it without grad: its output is turned into discrete
        # tokens, so no gradient could flow back through it anyway.
        encoded = self.family.encode(unwrapped, inputs)
        ratio = self.teacher_forcing_ratio()
        with torch.no_grad():
            first_inputs = self.family.fed_inputs(inputs, gold_inputs, encoded)
            first_inputs.pop("labels", None)
            first = unwrapped(**first_inputs, use_cache=False).logits
        if self.args.sampling == "sample":
            predicted = torch.distributions.Categorical(logits=first.float()).sample()
        else:
            predicted = first.argmax(dim=-1)
        mixed, replaced = mix_decoder_inputs(gold_inputs, predicted, labels, ratio)
        second_inputs = self.family.fed_inputs(inputs, mixed, encoded)
        loss = super(SeqRLBaseTrainer, self).compute_loss(model, second_inputs, num_items_in_batch=num_items_in_batch)
        replaceable = max(int((labels[:, :-1] != -100).sum()), 1)
        self._record("train", {
            "rl/phase": 1.0,
            "ss/teacher_forcing_ratio": ratio,
            "ss/replaced_fraction": replaced.sum().item() / replaceable,
        })
        return loss
