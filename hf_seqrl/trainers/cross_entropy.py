"""`CrossEntropyTrainer`: plain cross-entropy fine-tuning (maximum likelihood with teacher forcing, the `Seq2SeqTrainer`
loss) with hf-seqrl's data handling, evaluation, model card and `seqrl_run.json`: a teacher before distillation, a
sequence-level KD student on a teacher's decodes (`hf-seqrl distill-data`), the checkpoint an RL run starts from."""

from __future__ import annotations

from ..configs import SeqRLBaseConfig
from ..types import BatchText
from .base import SeqRLBaseTrainer


class CrossEntropyTrainer(SeqRLBaseTrainer):
    """Cross-entropy on the gold targets at every step, for encoder-decoder and decoder-only models (a decoder-only
    model's loss covers its completion tokens only); no reward. Same constructor as `Seq2SeqTrainer`, `args` a
    `SeqRLBaseConfig` (its text-dataset fields, `task` for the card, `disable_dropout`). `hf-seqrl train --algorithm
    xe` runs it."""

    config_class = SeqRLBaseConfig
    model_families = ("seq2seq", "causal")

    def sequence_loss(self, model, inputs, text: BatchText, num_items_in_batch):
        """The `Seq2SeqTrainer` loss, as in the warm-up (`warmup_xe_steps` changes nothing here)."""
        return self.per_batch_mean_loss(model, inputs)
