"""`label_smoothing_factor` reaches the cross-entropy that every rewarded trainer mixes in (`rl_weight < 1`): its
`rl/xe_loss` is `Seq2SeqTrainer`'s label-smoothed loss of the same batch, and differs from the plain one."""

import pytest
import torch
from transformers.trainer_pt_utils import LabelSmoother

from helpers import byt5_tokenizer, make_config, tiny_model, toy_dataset, toy_pairs
from hf_seqrl import MixerConfig, MixerTrainer, MRTConfig, MRTTrainer, ReinforceTrainer, SCSTTrainer, SeqRLConfig

TRAINERS = {"scst": (SCSTTrainer, SeqRLConfig, {}), "reinforce": (ReinforceTrainer, SeqRLConfig, {}),
            "mrt": (MRTTrainer, MRTConfig, {"num_samples": 2}),
            "mixer": (MixerTrainer, MixerConfig, {"num_samples": 2, "mixer_delta": 2})}


def gold_cross_entropy(model, data, tokenizer, smoothing: float) -> float:
    """The Trainer's loss of the whole dataset as one batch: `LabelSmoother` over the decoder logits, or the model's
    own cross-entropy without smoothing."""
    from transformers import DataCollatorForSeq2Seq

    batch = DataCollatorForSeq2Seq(tokenizer, model=model)([dict(row) for row in data])
    with torch.no_grad():
        out = model(**batch)
    return (LabelSmoother(epsilon=smoothing)(out, batch["labels"]) if smoothing else out.loss).item()


@pytest.mark.parametrize("name", list(TRAINERS))
def test_the_mixed_cross_entropy_is_label_smoothed(tmp_path, name):
    trainer_class, config_class, extra = TRAINERS[name]
    tokenizer = byt5_tokenizer()
    sources, targets = toy_pairs(8, seed=2, alphabet="abcd", lengths=(3, 5))
    data = toy_dataset(tokenizer, sources, targets)
    logged = {}
    for smoothing in (0.0, 0.1):
        model = tiny_model("t5", dropout=0.1)  # dropout as shipped, off so that an eval-mode pass gives the same loss
        args = make_config(config_class, tmp_path / str(smoothing), per_device_train_batch_size=8, max_steps=1,
                           learning_rate=0.0, rl_weight=0.5, label_smoothing_factor=smoothing, disable_dropout=True,
                           **extra)
        trainer = trainer_class(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                                reward_funcs="chrf")
        trainer.train()
        logged[smoothing] = next(h["rl/xe_loss"] for h in trainer.state.log_history if "rl/xe_loss" in h)
        model.eval()
        assert logged[smoothing] == pytest.approx(gold_cross_entropy(model, data, tokenizer, smoothing), rel=1e-5)
    assert logged[0.1] != pytest.approx(logged[0.0], rel=1e-3)
