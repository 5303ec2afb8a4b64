"""Scheduled sampling: ε = 1 is teacher forcing exactly, ε = 0 feeds only predictions, the mix follows ε."""

import pytest
import torch
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

from helpers import tiny_model, toy_dataset, toy_pairs
from hf_seqrl import ScheduledSamplingConfig, ScheduledSamplingTrainer
from hf_seqrl.trainers.scheduled_sampling import mix_decoder_inputs


def test_mix_decoder_inputs_ratio_extremes_and_padding():
    gold = torch.tensor([[0, 5, 6, 7, 0]])
    pred = torch.tensor([[9, 8, 7, 3, 2]])
    labels = torch.tensor([[5, 6, 7, 1, -100]])
    same, replaced = mix_decoder_inputs(gold, pred, labels, 1.0)
    assert torch.equal(same, gold) and not replaced.any()
    mixed, replaced = mix_decoder_inputs(gold, pred, labels, 0.0)
    # position 0 is the start token; position t takes the prediction made at t-1; position 4 follows padding? no:
    # labels[3] = 1 (EOS) is real, so position 4 is replaceable; nothing follows the -100.
    assert mixed.tolist() == [[0, 9, 8, 7, 3]]
    assert replaced.tolist() == [[False, True, True, True, True]]
    labels_pad = torch.tensor([[5, 1, -100, -100, -100]])
    mixed, replaced = mix_decoder_inputs(gold, pred, labels_pad, 0.0)
    assert replaced.tolist() == [[False, True, True, False, False]]


def test_replacement_fraction_follows_ratio():
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(2, 50, (64, 40))
    gold = torch.zeros_like(labels)
    for eps in (0.25, 0.5, 0.9):
        _, replaced = mix_decoder_inputs(gold, gold + 1, labels, eps, generator=gen)
        frac = replaced[:, 1:].float().mean().item()
        assert abs(frac - (1 - eps)) < 0.03, (eps, frac)


def make_args(tmp_path, trainer="ss", **kwargs):
    base = dict(output_dir=str(tmp_path / trainer), per_device_train_batch_size=4, max_steps=1, learning_rate=0.1,
                optim="sgd", report_to=[], save_strategy="no", disable_tqdm=True, logging_steps=1, seed=0,
                max_grad_norm=0.0, dataloader_pin_memory=False)
    base.update(kwargs)
    if trainer == "ss":
        return ScheduledSamplingConfig(**base)
    return Seq2SeqTrainingArguments(**base)


@pytest.mark.parametrize("arch", ["t5", "bart", "marian"])
def test_ratio_one_equals_teacher_forcing(tmp_path, tokenizer, arch):
    src, tgt = toy_pairs(8, seed=1)
    ds = toy_dataset(tokenizer, src, tgt)
    results = []
    for kind in ("ss", "plain"):
        model = tiny_model(arch, seed=3)
        if kind == "ss":
            args = make_args(tmp_path, schedule="constant", min_teacher_forcing_ratio=1.0)
            trainer = ScheduledSamplingTrainer(model=model, args=args, train_dataset=ds, processing_class=tokenizer)
        else:
            trainer = Seq2SeqTrainer(model=model, args=make_args(tmp_path, "plain"), train_dataset=ds,
                                     processing_class=tokenizer,
                                     data_collator=__import__("transformers").DataCollatorForSeq2Seq(tokenizer,
                                                                                                     model=model))
        trainer.train()
        results.append((trainer.state.log_history[0]["loss"], {k: v.clone() for k, v in model.state_dict().items()}))
    assert results[0][0] == pytest.approx(results[1][0], abs=1e-6)
    for key in results[0][1]:
        torch.testing.assert_close(results[0][1][key], results[1][1][key], atol=1e-6, rtol=1e-6)


def test_ratio_zero_feeds_only_predictions_and_logs(tmp_path, tokenizer, monkeypatch):
    import hf_seqrl.trainers.scheduled_sampling as ss

    seen = {}
    original = ss.mix_decoder_inputs

    def spy(gold, pred, labels, ratio, generator=None):
        mixed, replaced = original(gold, pred, labels, ratio, generator)
        seen.update(gold=gold, pred=pred, labels=labels, mixed=mixed, ratio=ratio)
        return mixed, replaced

    monkeypatch.setattr(ss, "mix_decoder_inputs", spy)
    src, tgt = toy_pairs(8, seed=2)
    args = make_args(tmp_path, schedule="constant", min_teacher_forcing_ratio=0.0, max_steps=2)
    trainer = ScheduledSamplingTrainer(model=tiny_model("t5"), args=args,
                                       train_dataset=toy_dataset(tokenizer, src, tgt), processing_class=tokenizer)
    trainer.train()
    assert seen["ratio"] == 0.0
    real = seen["labels"][:, :-1] != -100
    # every decoder input after the start token that follows a real target token is a pass-1 prediction
    assert torch.equal(seen["mixed"][:, 1:][real], seen["pred"][:, :-1][real])
    assert (seen["mixed"][:, 0] == 0).all()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs[-1]["ss/teacher_forcing_ratio"] == 0.0 and logs[-1]["ss/replaced_fraction"] == 1.0


def test_schedule_decays_after_warmup(tmp_path, tokenizer):
    src, tgt = toy_pairs(16, seed=4)
    args = make_args(tmp_path, schedule="linear", schedule_k=4, min_teacher_forcing_ratio=0.0, max_steps=5,
                     warmup_xe_steps=2, learning_rate=1e-3)
    trainer = ScheduledSamplingTrainer(model=tiny_model("marian"), args=args,
                                       train_dataset=toy_dataset(tokenizer, src, tgt), processing_class=tokenizer)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["rl/phase"] for h in logs] == [0, 0, 1, 1, 1]
    # ε = 1 - (step - warm-up)/k at steps 2, 3, 4 (global_step before the update)
    assert [h["ss/teacher_forcing_ratio"] for h in logs[2:]] == pytest.approx([1.0, 0.75, 0.5])


def test_config_errors(tmp_path):
    with pytest.raises(ValueError, match="schedule='cosine'"):
        make_args(tmp_path, schedule="cosine")
    with pytest.raises(ValueError, match="sampling must be"):
        make_args(tmp_path, sampling="beam")


def test_resume_restores_the_schedule_position(tmp_path, tokenizer):
    src, tgt = toy_pairs(24, seed=6)
    ds = toy_dataset(tokenizer, src, tgt)

    def run(resume=None):
        args = make_args(tmp_path, schedule="linear", schedule_k=4, min_teacher_forcing_ratio=0.0, max_steps=6,
                         warmup_xe_steps=1, learning_rate=1e-3, save_strategy="steps", save_steps=3)
        trainer = ScheduledSamplingTrainer(model=tiny_model("t5", seed=4), args=args, train_dataset=ds,
                                           processing_class=tokenizer)
        trainer.train(resume_from_checkpoint=resume)
        ratios = {h["step"]: h["ss/teacher_forcing_ratio"] for h in trainer.state.log_history
                  if "ss/teacher_forcing_ratio" in h}
        return ratios, {k: v.clone() for k, v in trainer.model.state_dict().items()}

    full_ratios, full = run()
    resumed_ratios, resumed = run(resume=str(tmp_path / "ss" / "checkpoint-3"))
    # ε after the resume continues from step 3: 1 - (step - 1)/4 for steps 4..6, as in the uninterrupted run.
    assert [resumed_ratios[s] for s in (4, 5, 6)] == [full_ratios[s] for s in (4, 5, 6)] == [0.5, 0.25, 0.0]
    for key in full:
        torch.testing.assert_close(resumed[key], full[key], atol=1e-6, rtol=1e-6)
