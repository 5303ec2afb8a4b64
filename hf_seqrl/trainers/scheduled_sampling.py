"""`ScheduledSamplingTrainer`: two-pass scheduled sampling for transformer decoders.

Mihaylova & Martins (2019): pass 1 runs the decoder on the gold prefix and takes its prediction at every
position; pass 2 trains with cross-entropy against the gold targets on decoder inputs where each token is
the gold one with probability ε (the teacher-forcing ratio of Bengio et al., 2015) and the pass-1
prediction otherwise. The encoder runs once and both passes read its output (a decoder-only model: both read the
prompt, and only completion tokens are mixed); see `InputScheduleTrainer`.
"""

from __future__ import annotations

import torch

from ..functional import decoder_inputs as di
from ..configs import ScheduledSamplingConfig
from ..schedules import teacher_forcing_ratio
from ..papers import Method, Paper
from .input_schedules import DecoderRows, InputScheduleTrainer, replaced_fraction

BENGIO_2015 = Paper(key="bengio2015scheduled", cite="Bengio et al., 2015", url="https://arxiv.org/abs/1506.03099",
                    title="Scheduled Sampling for Sequence Prediction with Recurrent Neural Networks", citation="""\
@inproceedings{bengio2015scheduled,
  title     = {Scheduled Sampling for Sequence Prediction with Recurrent Neural Networks},
  author    = {Bengio, Samy and Vinyals, Oriol and Jaitly, Navdeep and Shazeer, Noam},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year      = {2015},
  url       = {https://arxiv.org/abs/1506.03099}
}""")

MIHAYLOVA_2019 = Paper(key="mihaylova2019scheduled", cite="Mihaylova & Martins, 2019", url="https://aclanthology.org/P19-2049/",
                       title="Scheduled Sampling for Transformers", citation="""\
@inproceedings{mihaylova2019scheduled,
  title     = {Scheduled Sampling for Transformers},
  author    = {Mihaylova, Tsvetomila and Martins, Andr{\\'e} F. T.},
  booktitle = {Proceedings of the 57th Annual Meeting of the ACL: Student Research Workshop},
  year      = {2019},
  url       = {https://aclanthology.org/P19-2049/}
}""")


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
    replaced = di.corruption_mask(labels, 1.0 - ratio, generator=generator)
    return di.feed_back(gold_inputs, predicted_tokens, replaced), replaced


class ScheduledSamplingTrainer(InputScheduleTrainer):
    """Scheduled sampling for transformers (Bengio et al., 2015; Mihaylova & Martins, 2019).

    Loss: cross-entropy of the gold targets on decoder inputs that are the gold token with probability ε and the
    model's own pass-1 prediction otherwise, ε following `ScheduledSamplingConfig.schedule`. No reward, no baseline.
    Same constructor as `Seq2SeqTrainer`; `args` is a `ScheduledSamplingConfig`. With ε = 1 the loss is plain
    teacher forcing exactly.
    """

    config_class = ScheduledSamplingConfig
    algorithm_id = "scheduled_sampling"
    method = Method("Scheduled sampling", "scheduled-sampling", "cross-entropy on decoder inputs that mix gold tokens "
                    "with the model's own predictions, the gold share following a schedule",
                    (BENGIO_2015, MIHAYLOVA_2019))

    def teacher_forcing_ratio(self) -> float:
        """Returns ε at the current step (or epoch), counted from the end of the warm-up."""
        args = self.args
        return teacher_forcing_ratio(self.schedule_position(), args.schedule, args.schedule_k,
                                     args.min_teacher_forcing_ratio)

    def decoder_rows(self, batch, gold_inputs, labels):
        ratio = self.teacher_forcing_ratio()
        predicted = batch.predict(gold_inputs, self.args.sampling)
        mixed, replaced = mix_decoder_inputs(gold_inputs, predicted, labels, ratio)
        return DecoderRows(mixed, labels, metrics={
            "ss/teacher_forcing_ratio": ratio,
            "ss/replaced_fraction": replaced_fraction(replaced, labels),
        })
