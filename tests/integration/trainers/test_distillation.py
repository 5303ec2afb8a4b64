"""`DistillationTrainer`: tiny T5 / Marian / Llama students trained toward tiny teachers of their family (dropout on,
text columns), on-policy and off, with both estimators, LoRA students, a sequence reward beside the teacher, the
teacher loaded from a folder, and the refusals at build."""

from functools import partial

import pytest
import torch

from helpers import (bpe_tokenizer, byt5_tokenizer, make_config, overlap_reward, step_context, text_pairs,
                     tiny_causal_model, tiny_model)
from hf_seqrl import DistillationConfig, DistillationTrainer
from hf_seqrl.functional.divergences import generalized_jsd, reverse_kl
from hf_seqrl.models import heads
from hf_seqrl.models.tiny import build_tiny_model

config = partial(make_config, DistillationConfig, max_steps=2, num_samples=2, logging_steps=1)


def sharp(model, scale: float = 4.0):
    """The model with its output layer scaled: a peaked distribution, far from a random student's."""
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    return model


def record_stage(trainer) -> list:
    """Returns the list that collects `(scored, batch, inputs)` at each of the trainer's loss stages from now on."""
    seen, stage = [], trainer.objective.loss
    trainer.objective.loss = lambda scored, batch, ctx: seen.append((scored, batch, ctx.inputs)) or stage(
        scored, batch, ctx)
    return seen


def heldout_kl(student, teacher, tok, causal: bool) -> float:
    """The mean token-level KL(student || teacher) over the gold targets of held-out pairs (teacher-forced)."""
    total, count = 0.0, 0
    student.eval()
    for row in text_pairs(causal, n=8, seed=7):
        if causal:
            prompt = tok(row["prompt"], add_special_tokens=False)["input_ids"]
            ids = torch.tensor([prompt + tok(row["completion"])["input_ids"]])
            with torch.no_grad():
                s, t = student(input_ids=ids).logits[0], teacher(input_ids=ids).logits[0]
            s, t = s[len(prompt) - 1:-1], t[len(prompt) - 1:-1]  # the positions that predict the completion
        else:
            enc = tok([row["source"]], return_tensors="pt")
            labels = tok(text_target=[row["target"]], return_tensors="pt")["input_ids"]
            with torch.no_grad():
                s, t = student(**enc, labels=labels).logits[0], teacher(**enc, labels=labels).logits[0]
        total += reverse_kl(s, t).sum().item()
        count += s.shape[0]
    return total / count


@pytest.mark.parametrize("arch,causal,settings", [
    pytest.param("t5", False, dict(beta=1.0), marks=pytest.mark.slow),  # on-policy reverse KL over the vocabulary
    pytest.param("marian", False, dict(beta=0.5, lmbda=0.5), marks=pytest.mark.slow),  # GKD's mixed setting
    ("llama", True, dict(beta=0.0, lmbda=0.0)),  # word-level KD on gold prefixes
    # the reverse KL at the sampled tokens
    pytest.param("t5", False, dict(divergence_estimator="sampled", num_samples=4), marks=pytest.mark.slow),
], ids=["t5-reverse", "marian-jsd", "llama-forward", "t5-sampled"])
def test_distillation_halves_the_heldout_kl_to_the_teacher(tmp_path, arch, causal, settings):
    tok = byt5_tokenizer()
    sampled = settings.get("divergence_estimator") == "sampled"
    scale = 1.0 if sampled else 4.0  # a policy gradient needs a teacher the student's samples are not far from
    if causal:
        student, teacher = tiny_causal_model(arch, seed=1), sharp(tiny_causal_model(arch, seed=2, d_model=64), scale)
    else:
        student = tiny_model(arch, seed=1, dropout=0.1)
        teacher = sharp(tiny_model(arch, seed=2, dropout=0.1, d_model=64, layers=2), scale)
    before = heldout_kl(student, teacher, tok, causal)
    args = config(tmp_path, max_steps=40, learning_rate=1e-2, per_device_train_batch_size=8, logging_steps=10,
                  **settings)
    trainer = DistillationTrainer(model=student, args=args, train_dataset=text_pairs(causal, n=32),
                                  processing_class=tok, teacher_model=teacher)
    trainer.train()
    after = heldout_kl(trainer.model, teacher, tok, causal)
    assert after <= 0.5 * before, (before, after)
    metric = "distill/reverse_kl" if sampled else "distill/divergence"
    logs = [h for h in trainer.state.log_history if metric in h]
    assert len(logs) == 4 and all(h[metric] >= 0 or sampled for h in logs)
    assert all(h["rl/teacher_logprob"] < 0 for h in logs) if sampled else True
    share = sum(h["distill/on_policy"] for h in logs) / len(logs)  # each log: the mean over its window's steps
    lmbda = settings.get("lmbda", 1.0)
    assert share == lmbda if lmbda in (0.0, 1.0) else 0.0 < share < 1.0
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())


def test_sequence_level_kd_trains_on_the_teachers_beams_and_a_reward_joins(tmp_path):
    tok = byt5_tokenizer()
    student, teacher = tiny_model("bart", seed=1, dropout=0.1), tiny_model("bart", seed=2)
    args = config(tmp_path, lmbda=0.0, seq_kd=True, seq_kd_num_beams=2, rl_weight=0.5, max_steps=1)
    trainer = DistillationTrainer(model=student, args=args, train_dataset=text_pairs(False), processing_class=tok,
                                  teacher_model=teacher)
    trainer.train()
    log = next(h for h in trainer.state.log_history if "distill/divergence" in h)
    assert log["distill/on_policy"] == 0.0 and "rl/xe_loss" in log
    rewarded = DistillationTrainer(model=tiny_model("t5", seed=1), args=config(tmp_path, baseline="mean"),
                                   train_dataset=text_pairs(False), processing_class=tok,
                                   teacher_model=tiny_model("t5", seed=2), reward_funcs=overlap_reward)
    rewarded.train()
    log = next(h for h in rewarded.state.log_history if "distill/divergence" in h)
    assert "rl/reward" in log and "rl/pg_loss" in log


def test_a_lora_student_distills_from_a_separate_teacher_loaded_from_a_folder(tmp_path):
    peft = pytest.importorskip("peft")
    tok = byt5_tokenizer()
    teacher = tiny_model("t5", seed=2)
    teacher.save_pretrained(tmp_path / "teacher")
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q", "v"], task_type="SEQ_2_SEQ_LM")
    args = config(tmp_path, teacher_model_init_kwargs='{"dtype": "float32"}')
    trainer = DistillationTrainer(model=tiny_model("t5", seed=1, dropout=0.1), args=args,
                                  train_dataset=text_pairs(False), processing_class=tok,
                                  teacher_model=str(tmp_path / "teacher"), peft_config=lora)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items() if "lora_B" in k}
    trainer.train()
    after = trainer.model.state_dict()
    assert before and any(not torch.equal(v, after[k]) for k, v in before.items())
    loaded = trainer.frozen_models["teacher"].model
    assert not hasattr(loaded, "peft_config") and all(torch.equal(v, teacher.state_dict()[k])
                                                      for k, v in loaded.state_dict().items())


def test_a_teacher_of_another_vocabulary_or_family_or_none_is_refused(tmp_path):
    tok = byt5_tokenizer()
    other = build_tiny_model("t5", vocab_size=512, d_model=32, layers=1, pad_token_id=0, eos_token_id=1)
    build = partial(DistillationTrainer, args=config(tmp_path), train_dataset=text_pairs(False), processing_class=tok)
    with pytest.raises(ValueError, match="teacher_model has an output layer of 512 tokens and the policy one of 384"):
        build(model=tiny_model("t5"), teacher_model=other)
    with pytest.raises(ValueError, match="teacher_model is a causal model and the student a seq2seq one"):
        build(model=tiny_model("t5"), teacher_model=tiny_causal_model())
    with pytest.raises(ValueError, match="DistillationTrainer needs teacher_model="):
        build(model=tiny_model("t5"))
    # As wide as the student's output layer, but saved with another tokenizer: the same ids name other tokens.
    from transformers import ByT5Tokenizer

    others = {"bpe": bpe_tokenizer(["abcd", "dcba", "a b c"]), "no_extra_ids": ByT5Tokenizer(extra_ids=0), "own": tok}
    for folder, saved in others.items():
        tiny_model("t5", seed=2).save_pretrained(tmp_path / folder)
        saved.save_pretrained(tmp_path / folder)
    with pytest.raises(ValueError, match=r"whose ids name other tokens .* ids differ, the first 3\."):
        build(model=tiny_model("t5"), teacher_model=str(tmp_path / "bpe"))
    for folder in ("no_extra_ids", "own"):  # ByT5 without its 125 sentinel tokens only lacks ids: no conflict
        teacher = build(model=tiny_model("t5"), teacher_model=str(tmp_path / folder)).frozen_models["teacher"]
        assert type(teacher.model).__name__ == "T5ForConditionalGeneration" and teacher.width is None


@pytest.mark.parametrize("fields,message", [
    (dict(beta=1.5), r"beta=1.5 is out of range: beta must be in \[0, 1\]"),
    (dict(lmbda=-0.1), r"lmbda=-0.1 is out of range: lmbda must be in \[0, 1\]"),
    (dict(divergence_estimator="sampled", beta=0.5), "needs beta=1.0 and lmbda=1.0"),
    (dict(seq_kd=True), "lower lmbda"),
])
def test_config_refuses_settings_that_do_not_go_together(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, **fields)


def test_a_teacher_whose_output_layer_pads_the_tokenizer_further_distills_over_the_students_rows(tmp_path):
    """A teacher with more output rows than the student, the extra ones beyond the tokenizer (as Qwen2.5-7B's 152,064
    against Qwen2.5-0.5B's 151,936): the divergence compares its distribution over the student's rows, as the same
    teacher with its extra rows cut off does."""
    import copy

    tok = byt5_tokenizer()
    wide = build_tiny_model("llama", vocab_size=400, d_model=32, layers=2, max_positions=128, pad_token_id=0,
                            eos_token_id=1, seed=2)
    cut = copy.deepcopy(wide)
    cut.resize_token_embeddings(384)  # the first 384 rows of the embedding and the output layer
    wide.save_pretrained(tmp_path / "wide")
    tok.save_pretrained(tmp_path / "wide")  # saved with the student's tokenizer: its extra rows only pad it
    divergences = []
    for teacher in (str(tmp_path / "wide"), cut):
        trainer = DistillationTrainer(model=tiny_causal_model(seed=1), args=config(tmp_path, max_steps=1, beta=0.5,
                                                                                   learning_rate=0.0),
                                      train_dataset=text_pairs(True), processing_class=tok, teacher_model=teacher)
        seen = record_stage(trainer)
        trainer.train()
        divergences += [scored.divergence[batch.sample_mask].detach() for scored, batch, _ in seen]
    torch.testing.assert_close(divergences[0], divergences[1])
    narrow = build_tiny_model("llama", vocab_size=300, d_model=32, layers=1, pad_token_id=0, eos_token_id=1)
    for refused in (narrow, wide):  # narrower; or wider without the tokenizer that says its extra rows are padding
        with pytest.raises(ValueError, match="the policy one of 384"):
            DistillationTrainer(model=tiny_causal_model(), args=config(tmp_path), train_dataset=text_pairs(True),
                                processing_class=tok, teacher_model=refused)


def test_tokens_the_students_generation_config_bans_are_out_of_both_distributions(tmp_path):
    """A student that bans tokens (as every opus-mt Marian bans pad): they are out of the student's and the
    teacher's distributions alike, so the divergence stays finite and no sample holds them."""
    tok = byt5_tokenizer()
    student = tiny_model("marian", seed=1, dropout=0.1)
    student.generation_config.bad_words_ids = [[5], [6]]
    trainer = DistillationTrainer(model=student, args=config(tmp_path, max_steps=1, beta=0.0),
                                  train_dataset=text_pairs(False), processing_class=tok,
                                  teacher_model=tiny_model("marian", seed=2))
    seen = record_stage(trainer)
    trainer.train()
    ((scored, batch, _),) = seen
    assert torch.isfinite(scored.divergence).all() and scored.divergence[batch.sample_mask].gt(0).all()
    assert not torch.isin(batch.sample_ids[batch.sample_mask], torch.tensor([5, 6])).any()


@pytest.mark.parametrize("arch,causal", [("t5", False), ("llama", True)])
def test_word_level_kd_scores_each_gold_row_once_with_the_loss_of_two_passes(tmp_path, arch, causal):
    tok = byt5_tokenizer()
    build = tiny_causal_model if causal else tiny_model
    student, teacher = build(arch, seed=1), build(arch, seed=2)
    args = config(tmp_path, lmbda=0.0, beta=0.0, rl_weight=0.5, max_steps=1, disable_dropout=True)
    trainer = DistillationTrainer(model=student, args=args, train_dataset=text_pairs(causal), processing_class=tok,
                                  teacher_model=teacher)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    assert heads.knows_head(student)  # its head's check forward (one row, once per model) runs before the count
    rows = []
    hook = student.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: rows.append((kwargs.get("input_ids", args[0] if args else None)
                                                  if kwargs.get("input_ids", args[0] if args else None) is not None
                                                  else kwargs["inputs_embeds"]).shape[0]), with_kwargs=True)
    assert trainer.objective.gold_step(step_context(trainer), label_smoothing=False)
    once = trainer.compute_loss(student, dict(batch))
    trainer.objective.gold_step = lambda ctx, label_smoothing: False  # the gold rows scored again for the cross-entropy
    twice = trainer.compute_loss(student, dict(batch))
    hook.remove()
    sources = len(batch["input_ids"])
    assert rows == [sources, 2 * sources]
    torch.testing.assert_close(once, twice, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch,causal", [("t5", False), ("marian", False), ("llama", True)])
def test_the_trainers_divergence_is_the_full_logits_formula_at_temperature_with_bans(tmp_path, arch, causal):
    """The scoring pass reduces the divergence a slice of the vocabulary at a time from hidden states; at each of the
    student's sampled tokens it equals `generalized_jsd` of the two models' whole logits, at the temperature,
    with the student's banned tokens out of both distributions."""
    tok = byt5_tokenizer()
    build = tiny_causal_model if causal else tiny_model
    student, teacher = build(arch, seed=1), sharp(build(arch, seed=2))
    student.generation_config.bad_words_ids = [[5], [6]]
    args = config(tmp_path, max_steps=1, beta=0.25, temperature=0.7, learning_rate=0.0)  # the weights stay as scored
    trainer = DistillationTrainer(model=student, args=args,
                                  train_dataset=text_pairs(causal), processing_class=tok, teacher_model=teacher)
    seen = record_stage(trainer)
    trainer.train()
    ((scored, batch, inputs),) = seen
    ids, mask = batch.sample_ids, batch.sample_mask
    student.eval()  # dropout is off in the trainer's passes (disable_dropout)
    with torch.no_grad():
        if causal:  # the prompt (the gold completion cut off), then the sample: whole logits at its positions
            from hf_seqrl.models.causal import completion_forward, split_prompts

            prompt = split_prompts(inputs["input_ids"], inputs["attention_mask"], inputs["labels"], tok.pad_token_id)
            logits = [completion_forward(m, *prompt, ids.masked_fill(~mask, tok.pad_token_id), batch.group).logits
                      for m in (student, teacher)]
        else:
            sources = {k: inputs[k].repeat_interleave(batch.group, 0) for k in ("input_ids", "attention_mask")}
            labels = ids.masked_fill(~mask, tok.pad_token_id)
            logits = [m(**sources, labels=labels).logits for m in (student, teacher)]
    banned = torch.zeros(logits[0].shape[-1], dtype=torch.bool)
    banned[[5, 6]] = True
    expected = generalized_jsd(*logits, beta=0.25, temperature=0.7, banned=banned)
    other = generalized_jsd(*logits, beta=0.75, temperature=0.7, banned=banned)
    assert not torch.allclose(expected[mask], other[mask], rtol=1e-3)  # beta is told from 1 - beta
    assert mask.any() and scored.divergence.shape == expected.shape
    torch.testing.assert_close(scored.divergence[mask], expected[mask], rtol=1e-4, atol=1e-5)
