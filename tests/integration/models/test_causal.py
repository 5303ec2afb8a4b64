"""Decoder-only models through `hf_seqrl.models.CausalFamily`: rollouts, the loss on completion tokens only, every
trainer on a tiny Llama / Qwen2 built from a config (no Hub), and learning on a toy task."""

from functools import partial
import copy
import json
import math
import os

import pytest
import torch

from helpers import byt5_tokenizer, heldout_chrf, make_config, prompt_completion_dataset, REPO, tiny_causal_model, step_context
from hf_seqrl import (KStepRolloutConfig, KStepRolloutTrainer, MixerConfig, MixerTrainer, MRTConfig, MRTTrainer,
                      PrefixCorruptionConfig,
                      PrefixCorruptionTrainer, ProfessorForcingTrainer, ReinforceTrainer, SCSTTrainer,
                      ScheduledSamplingTrainer, SeqRLConfig)
from hf_seqrl.models.causal import causal_generation_config, completion_labels, sample_causal, split_prompts
from hf_seqrl.configs import ProfessorForcingConfig, ScheduledSamplingConfig
from hf_seqrl.models import CausalFamily, Seq2SeqFamily, family_for
from hf_seqrl.rewards import get_reward
from hf_seqrl.objectives.mixer import prefix_lengths

config = partial(make_config, SeqRLConfig, max_steps=3, use_cpu=True)  # config(tmp_path, **overrides)


def collate(tokenizer, dataset):
    from transformers import DataCollatorForSeq2Seq

    rows = [{k: dataset[i][k] for k in ("input_ids", "attention_mask", "labels")} for i in range(len(dataset))]
    return DataCollatorForSeq2Seq(tokenizer)(rows)


def test_family_for_picks_the_family(tokenizer):
    from helpers import tiny_model

    assert isinstance(family_for(tiny_model("t5")), Seq2SeqFamily)
    assert isinstance(family_for(tiny_causal_model("llama")), CausalFamily)
    assert isinstance(family_for(tiny_causal_model("qwen2")), CausalFamily)


def test_prompt_completion_rows_and_prompt_split(tokenizer):
    data = prompt_completion_dataset(tokenizer, n=3, seed=1)
    row = data[0]
    prompt = tokenizer(data[0]["sources"], add_special_tokens=False)["input_ids"]
    # prompt + completion + EOS; -100 on the prompt; the source and reference kept as text
    assert row["labels"][: len(prompt)] == [-100] * len(prompt)
    assert row["input_ids"][len(prompt):] == row["labels"][len(prompt):] and row["labels"][-1] == 1
    assert row["references"] == [row["sources"][:-1][::-1]]
    batch = collate(tokenizer, data)
    ids, mask = split_prompts(batch["input_ids"], batch["attention_mask"], batch["labels"], pad=0)
    for i in range(3):
        expected = tokenizer(data[i]["sources"], add_special_tokens=False)["input_ids"]
        assert ids[i][mask[i]].tolist() == expected and bool(mask[i, -1])  # left-padded
    completions = completion_labels(batch["labels"])
    assert tokenizer.batch_decode(completions.clamp(min=0), skip_special_tokens=True) == [r[0] for r in
                                                                                          data["references"]]


@pytest.mark.parametrize("shared_prompt_cache", [True, False])
def test_rollout_masks_and_logprobs_equal_per_sample_recomputation(tokenizer, monkeypatch, shared_prompt_cache):
    import hf_seqrl.models.causal

    # 0: every prompt's KV cache is computed once and expanded to its samples; 10**6: generate repeats the prompts
    monkeypatch.setattr(hf_seqrl.models.causal, "PROMPT_CACHE_MIN_TOKENS", 0 if shared_prompt_cache else 10**6)
    model = tiny_causal_model("llama", seed=3).eval()
    batch = collate(tokenizer, prompt_completion_dataset(tokenizer, n=3, seed=2, lengths=(1, 6)))
    torch.manual_seed(0)
    rollout = sample_causal(model, batch["input_ids"], batch["attention_mask"], batch["labels"],
                            causal_generation_config(model, 6), num_samples=3, with_greedy=True)
    scored = CausalFamily().score(model, batch, rollout.sample_ids, 3, temperature=1.0)
    prompt_ids, prompt_mask = split_prompts(batch["input_ids"], batch["attention_mask"], batch["labels"], 0)
    for row in range(rollout.sample_ids.shape[0]):
        mask = rollout.sample_mask[row]
        tokens = rollout.sample_ids[row][mask]
        eos_at = (tokens == 1).nonzero()
        # the mask ends at the first EOS (included), or covers the whole length budget
        assert (eos_at.numel() and eos_at[0].item() == len(tokens) - 1) or len(tokens) == 6
        assert (rollout.sample_ids[row][~mask] == 0).all()
        prompt = prompt_ids[row // 3][prompt_mask[row // 3]]
        full = torch.cat([prompt, tokens]).unsqueeze(0)  # unpadded, one sample alone
        with torch.no_grad():
            logits = model(full).logits[0, len(prompt) - 1: -1]
        expected = torch.log_softmax(logits.float(), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(scored.token_logprobs[row][mask], expected, atol=1e-5, rtol=1e-5)
    for source in range(3):  # the greedy row is plain greedy decoding of the prompt alone
        prompt = prompt_ids[source][prompt_mask[source]].unsqueeze(0)
        greedy = model.generate(prompt, do_sample=False, max_new_tokens=6)[0, prompt.shape[1]:]
        mask = rollout.greedy_mask[source]
        assert rollout.greedy_ids[source][mask].tolist() == greedy[: int(mask.sum())].tolist()


@pytest.mark.parametrize("settings", [dict(), dict(temperature=0.7, top_k=5, top_p=0.9)])
def test_decode_loop_draws_each_token_from_one_uniform(tokenizer, settings):
    """Every sampled token is `sample_tokens` of the logits of its own prefix at that step's uniform (one
    `torch.rand((steps, rows))` per decode); greedy rows are the argmax."""
    from hf_seqrl.models.causal import decode_causal
    from hf_seqrl.functional.sampling import draw_uniforms, sample_tokens

    model = tiny_causal_model("qwen2", seed=2).eval()
    batch = collate(tokenizer, prompt_completion_dataset(tokenizer, n=3, seed=6, lengths=(1, 6)))
    prompt_ids, prompt_mask = split_prompts(batch["input_ids"], batch["attention_mask"], batch["labels"], pad=0)
    config = causal_generation_config(model, 7, **settings)
    torch.manual_seed(11)
    ids, mask = decode_causal(model, prompt_ids, prompt_mask, config, group=3, greedy_first=True)
    torch.manual_seed(11)
    uniforms = draw_uniforms(7, 3 * 2, "cpu")  # the sampled rows: 2 of every group of 3
    with torch.no_grad():
        for row in range(ids.shape[0]):
            prompt = prompt_ids[row // 3][prompt_mask[row // 3]]
            context = prompt.tolist()
            sample_row = row // 3 * 2 + row % 3 - 1
            for step in range(int(mask[row].sum())):
                logits = model(torch.tensor([context])).logits[:, -1].float()
                if row % 3 == 0:
                    expected = int(logits.argmax())
                else:
                    expected = int(sample_tokens(logits, uniforms[step, sample_row: sample_row + 1],
                                                 config.temperature, config.top_k, config.top_p))
                assert int(ids[row, step]) == expected, (row, step)
                context.append(expected)
    # the RNG moves on: the next decode draws other tokens
    again, _ = decode_causal(model, prompt_ids, prompt_mask, config, group=3, greedy_first=True)
    assert not torch.equal(again, ids)


def test_decode_loop_samples_the_warped_distribution(tokenizer):
    """Chi-square over 20000 first tokens of one prompt against softmax(warped logits)."""
    from hf_seqrl.models.causal import decode_causal
    from hf_seqrl.functional.sampling import warp_logits
    from helpers import chi_square_p_value

    model = tiny_causal_model("llama", seed=3).eval()
    prompt = torch.tensor([tokenizer("abc=", add_special_tokens=False)["input_ids"]])
    config = causal_generation_config(model, 1, temperature=0.5, top_k=6)
    torch.manual_seed(0)
    ids, _ = decode_causal(model, prompt, torch.ones_like(prompt, dtype=torch.bool), config, group=20000)
    with torch.no_grad():
        logits = model(prompt).logits[:, -1].float()
    probs = torch.softmax(warp_logits(logits, 0.5, 6), dim=-1)[0].double()
    counts = torch.bincount(ids[:, 0], minlength=probs.shape[0]).double()
    assert counts[probs == 0].sum() == 0
    assert chi_square_p_value(counts, probs) > 1e-3


def test_prompt_tokens_never_enter_the_loss(tmp_path, tokenizer):
    """Gradients reach no logit that predicts a prompt token or padding, in the warm-up and in the RL loss."""
    model = tiny_causal_model("llama", seed=1)
    data = prompt_completion_dataset(tokenizer, n=4, seed=4)
    args = config(tmp_path, warmup_xe_steps=1, num_samples=2, rl_weight=0.5, kl_coef=0.1, entropy_coef=0.1)
    trainer = SCSTTrainer(model=model, args=args, reward_funcs="chrf", train_dataset=data, processing_class=tokenizer)
    batch = collate(tokenizer, data)
    captured = []

    def keep(module, inputs, output):
        if output.requires_grad:  # decoding runs without grad
            output.retain_grad()
            captured.append(output)

    handle = model.lm_head.register_forward_hook(keep)
    try:
        for step in (0, 1):  # 0: teacher-forced warm-up; 1: rollout + policy gradient + cross-entropy
            trainer.state.global_step = step
            captured.clear()
            model.train()
            trainer.compute_loss(model, dict(batch)).backward()
            labels = batch["labels"]
            for logits in captured:
                if logits.grad is None:
                    continue
                if logits.shape[1] == labels.shape[1]:  # full rows: position t predicts token t + 1
                    predicts_prompt = torch.nn.functional.pad(labels[:, 1:] == -100, (0, 1), value=True)
                    assert logits.grad[predicts_prompt].abs().max() == 0, step
                    assert logits.grad[~predicts_prompt].abs().max() > 0, step
                else:  # completion positions only (logits_to_keep)
                    assert logits.shape[1] <= max(8, int((labels != -100).sum(1).max())) + 1
            assert captured
    finally:
        handle.remove()


@pytest.mark.parametrize("trainer_class,arch,baseline", [(SCSTTrainer, "llama", "greedy"), (SCSTTrainer, "qwen2", "mean"),
                                                         (ReinforceTrainer, "llama", None)])
def test_policy_gradient_trainers_train_causal_models(tmp_path, tokenizer, trainer_class, arch, baseline):
    model = tiny_causal_model(arch)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    args = config(tmp_path, warmup_xe_steps=1, num_samples=2, baseline=baseline, rl_weight=0.7,
                  predict_with_generate=True, generation_max_length=8, per_device_eval_batch_size=4)
    trainer = trainer_class(model=model, args=args, reward_funcs=["chrf", "bleu"],
                            train_dataset=prompt_completion_dataset(tokenizer, n=8),
                            eval_dataset=prompt_completion_dataset(tokenizer, n=5, seed=9), processing_class=tokenizer,
                            compute_metrics=lambda pred: {"rows": float(len(pred.predictions))})
    assert trainer.baseline == (baseline or "moving_average")
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["rl/phase"] for h in logs] == [0.0, 1.0, 1.0]
    assert all(math.isfinite(logs[-1][k]) for k in ("rl/reward", "rl/pg_loss", "rl/xe_loss", "rl/entropy"))
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    metrics = trainer.evaluate()
    assert 0.0 <= metrics["eval_rl/reward"] <= 1.0 and metrics["eval_rows"] == 5.0
    assert math.isfinite(metrics["eval_loss"])


def test_references_only_prompts_train_and_extra_columns_reach_the_rewards(tmp_path, tokenizer):
    from datasets import Dataset

    prompts = ["ab=", "cab=", "dd=", "bca="]
    enc = tokenizer(prompts, add_special_tokens=False)
    data = Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                              "references": [p[:-1][::-1] for p in prompts], "hint": [len(p) for p in prompts]})
    seen = []

    def spy(predictions, references, sources, hint, **columns):
        seen.extend(zip(hint, (r[0] for r in references)))
        return [float(len(p) == h - 1) for p, h in zip(predictions, hint)]

    trainer = SCSTTrainer(model=tiny_causal_model(), args=config(tmp_path, max_steps=2, baseline="mean",
                                                                 num_samples=2), reward_funcs=spy,
                          train_dataset=data, processing_class=tokenizer)
    trainer.train()
    assert len([h for h in trainer.state.log_history if "rl/reward" in h]) == 2
    # each sample's own row: the hint (prompt length) goes with that prompt's reference
    assert seen and all(hint == len(reference) + 1 for hint, reference in seen)


CAUSAL_TRAINERS = {  # name: (trainer, config, fields)
    "scheduled_sampling": (ScheduledSamplingTrainer, ScheduledSamplingConfig,
                           dict(schedule="linear", schedule_k=1.0, min_teacher_forcing_ratio=0.3)),
    "prefix_corruption": (PrefixCorruptionTrainer, PrefixCorruptionConfig, dict(corruption_rate=0.5)),
    "noise_level_model": (PrefixCorruptionTrainer, PrefixCorruptionConfig,
                          dict(corruption_rate=0.8, per_token_levels=True, replacement="model")),
    "kstep_exact": (KStepRolloutTrainer, KStepRolloutConfig, dict(rollout_steps=3)),
    "kstep_shared_row": (KStepRolloutTrainer, KStepRolloutConfig, dict(rollout_steps=2, rollout_context="shared_row")),
    "mrt": (MRTTrainer, MRTConfig, dict(num_samples=2, mrt_include_greedy=True, mrt_include_reference=True,
                                         rl_weight=0.7, max_new_tokens=8, mrt_alpha=0.5)),
    "mixer": (MixerTrainer, MixerConfig, dict(mixer_delta=2, mixer_increment_steps=1, num_samples=2, baseline="greedy",
                                               rl_weight=0.7, max_new_tokens=8)),
}
LOGGED = {"scheduled_sampling": "ss/teacher_forcing_ratio", "prefix_corruption": "pc/replaced_fraction",
          "noise_level_model": "pc/replaced_fraction", "kstep_exact": "ks/own_token_accuracy",
          "kstep_shared_row": "ks/own_token_accuracy", "mrt": "mrt/risk", "mixer": "mixer/prefix_fraction"}


def causal_args(tmp_path, config_class, **fields):
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=2, learning_rate=1e-3,
                logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True, seed=0,
                dataloader_pin_memory=False, use_cpu=True)
    return config_class(**base, **fields)


@pytest.mark.parametrize("name", sorted(CAUSAL_TRAINERS))
def test_every_trainer_trains_causal_models(tmp_path, tokenizer, name):
    trainer_class, config_class, fields = CAUSAL_TRAINERS[name]
    model = tiny_causal_model("qwen2" if name == "mrt" else "llama", seed=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kwargs = {"reward_funcs": "chrf"} if name in ("mrt", "mixer") else {}
    trainer = trainer_class(model=model, args=causal_args(tmp_path, config_class, **fields),
                            train_dataset=prompt_completion_dataset(tokenizer, n=8), processing_class=tokenizer, **kwargs)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) and math.isfinite(h[LOGGED[name]]) for h in logs)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    if name == "scheduled_sampling":  # ε falls from 1 to its floor: the second step feeds own tokens
        assert [h["ss/teacher_forcing_ratio"] for h in logs] == pytest.approx([1.0, 0.3])
        assert logs[1]["ss/replaced_fraction"] > 0
    if name == "mrt":  # 2 samples, the greedy decode and the reference
        assert all(1.0 <= h["mrt/distinct_candidates"] <= 4.0 for h in logs)
    if name == "mixer":  # Δ = 2, then 4 tokens sampled: a smaller teacher-forced share
        assert [h["mixer/delta"] for h in logs] == [2.0, 4.0]
        assert logs[0]["mixer/prefix_fraction"] > logs[1]["mixer/prefix_fraction"]


def test_mixer_continues_each_causal_completion_from_its_gold_prefix(tmp_path, tokenizer):
    model = tiny_causal_model("llama", seed=6)
    trainer = MixerTrainer(model=model, args=causal_args(tmp_path, MixerConfig, mixer_delta=2, num_samples=3,
                                                         baseline="greedy", max_new_tokens=8),
                           reward_funcs="chrf", processing_class=tokenizer)
    batch = collate(tokenizer, prompt_completion_dataset(tokenizer, n=4, seed=8, lengths=(2, 6)))
    labels = trainer.family.target_labels(batch)
    prefixes = prefix_lengths(labels, 2)
    rollout = trainer.objective.sample_continuations(trainer, step_context(trainer, inputs=batch, unwrapped=model),
                                                     labels, prefixes)
    for row in range(rollout.sample_ids.shape[0]):
        source, length = row // 3, int(prefixes[row // 3])
        assert rollout.sample_ids[row, :length].tolist() == labels[source, :length].tolist()
        assert rollout.sample_mask[row, : length + 1].all()
    for source in range(4):  # the greedy continuation is greedy decoding of prompt + gold prefix
        length = int(prefixes[source])
        prompt = batch["input_ids"][source][(batch["labels"][source] == -100) & batch["attention_mask"][source].bool()]
        context = torch.cat([prompt, labels[source, :length]])[None]
        greedy = model.generate(context, do_sample=False, max_new_tokens=8 - length)[0, context.shape[1]:]
        mask = rollout.greedy_mask[source]
        expected = labels[source, :length].tolist() + greedy.tolist()
        assert rollout.greedy_ids[source][mask].tolist() == expected[: int(mask.sum())]


@pytest.mark.parametrize("trainer_class,config_class,fields", [
    (PrefixCorruptionTrainer, PrefixCorruptionConfig, dict(corruption_rate=0.0)),
    (KStepRolloutTrainer, KStepRolloutConfig, dict(rollout_steps=1)),
    (ScheduledSamplingTrainer, ScheduledSamplingConfig, dict(schedule="constant", min_teacher_forcing_ratio=1.0)),
])
def test_zero_rate_and_one_step_rollout_are_causal_teacher_forcing(tmp_path, tokenizer, trainer_class, config_class,
                                                                  fields):
    """σ = 0, k = 1 and ε = 1 give the loss and gradient of the causal LM's own loss on the completion tokens."""
    data = prompt_completion_dataset(tokenizer, n=4, seed=3, lengths=(1, 6))
    batch = collate(tokenizer, data)
    model = tiny_causal_model("llama", seed=4)
    model.train()
    expected = model(**batch).loss  # labels -100 on the prompt: the completion tokens' mean cross-entropy
    expected.backward()
    expected_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    trainer = trainer_class(model=model, args=causal_args(tmp_path, config_class, **fields), train_dataset=data,
                            processing_class=tokenizer)
    loss = trainer.compute_loss(model, dict(batch))
    loss.backward()
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-5)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(model.get_parameter(name).grad, grad, atol=1e-6, rtol=1e-4)


def test_causal_kstep_rows_equal_a_step_by_step_decode_from_each_anchor(tmp_path, tokenizer):
    from hf_seqrl.trainers.input_schedules import EncodedBatch

    model, k = tiny_causal_model("llama", seed=5).eval(), 3
    trainer = KStepRolloutTrainer(model=model, args=causal_args(tmp_path, KStepRolloutConfig, rollout_steps=k),
                                  processing_class=tokenizer)
    data = prompt_completion_dataset(tokenizer, n=3, seed=7, lengths=(3, 7))
    batch = collate(tokenizer, data)
    family = trainer.family
    labels = family.target_labels(batch)
    gold = torch.nn.functional.pad(labels[:, :-1].clamp(min=0), (1, 0))  # position 0: the prompt's own last token
    rows = trainer.decoder_rows(EncodedBatch(family, model, family.encode(model, batch)), gold, labels)
    lengths = (labels != -100).sum(dim=1)
    n_sources = labels.shape[0]
    anchors = [(b, a) for b in range(n_sources) for a in range(0, labels.shape[1], k) if a + 1 < lengths[b]]
    assert list(zip(rows.source_index[n_sources:].tolist(),
                    [int(l.ne(-100).nonzero()[0]) - 1 for l in rows.labels[n_sources:]])) == anchors
    for row, (b, a) in enumerate(anchors, start=n_sources):
        prompt = batch["input_ids"][b][(batch["labels"][b] == -100) & batch["attention_mask"][b].bool()]
        context = labels[b, :a].tolist()  # the gold completion prefix, then the model's own greedy tokens
        with torch.no_grad():
            for _ in range(k - 1):
                if len(context) + 1 >= int(lengths[b]):
                    break
                logits = model(input_ids=torch.cat([prompt, torch.tensor(context, dtype=torch.long)])[None]).logits
                context.append(int(logits[0, -1].argmax()))
        # the row feeds exactly that context (position t + 1 holds the token at completion position t)
        assert rows.input_ids[row, 1: len(context) + 1].tolist() == context, (b, a)
        trained = (rows.labels[row] != -100).nonzero().flatten().tolist()
        assert trained == list(range(a + 1, min(a + k, int(lengths[b]))))


def test_professor_forcing_names_what_it_supports(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="ProfessorForcingTrainer supports encoder-decoder.*only"):
        ProfessorForcingTrainer(model=tiny_causal_model(), processing_class=tokenizer,
                                args=ProfessorForcingConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[]),
                                train_dataset=prompt_completion_dataset(tokenizer, n=4))


def test_conversational_prompts_use_the_chat_template(tokenizer):
    from datasets import Dataset

    from hf_seqrl.data import tokenize_prompt_completion

    tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                               "{% if add_generation_prompt %}<assistant>{% endif %}")
    raw = Dataset.from_dict({"prompt": [[{"role": "user", "content": "abc"}]],
                             "completion": [[{"role": "assistant", "content": "cba"}]]})
    row = raw.map(tokenize_prompt_completion, batched=True, remove_columns=raw.column_names,
                  fn_kwargs=dict(tokenizer=tokenizer))[0]
    prompt = [t for t, label in zip(row["input_ids"], row["labels"]) if label == -100]
    assert tokenizer.decode(prompt) == "<user>abc<assistant>"
    assert tokenizer.decode([t for t in row["labels"] if t != -100]) == "cba</s>"
    assert row["sources"] == "abc" and row["references"] == ["cba"]


def test_misaligned_labels_are_rejected(tmp_path, tokenizer):
    from datasets import Dataset

    data = Dataset.from_dict({"input_ids": [[100, 101, 102]], "labels": [[102, 1]]})
    with pytest.raises(ValueError, match="aligned with 'input_ids'"):
        SCSTTrainer(model=tiny_causal_model(), args=config(tmp_path), reward_funcs="chrf", train_dataset=data,
                    processing_class=tokenizer)


# ---- learning: SCST raises held-out greedy chrF above the warm-up checkpoint ---------------------------------


@pytest.mark.slow
def test_causal_scst_raises_heldout_greedy_chrf_on_reversal(tmp_path):
    tokenizer = byt5_tokenizer()
    model = tiny_causal_model("llama", seed=0)
    train = prompt_completion_dataset(tokenizer, n=400, seed=0)
    heldout = prompt_completion_dataset(tokenizer, n=64, seed=99)
    args = config(tmp_path / "warm", per_device_train_batch_size=16, max_steps=WARMUP_STEPS, learning_rate=3e-3,
                  warmup_xe_steps=10**6, logging_steps=50)
    SCSTTrainer(model=model, args=args, reward_funcs="chrf", train_dataset=train, processing_class=tokenizer).train()
    warm = copy.deepcopy(model)
    before = heldout_chrf(warm, tokenizer, heldout["sources"], heldout["references"])
    args = config(tmp_path / "rl", per_device_train_batch_size=16, max_steps=RL_STEPS, learning_rate=1e-3,
                  num_samples=4, logging_steps=50)
    trainer = SCSTTrainer(model=model, args=args, reward_funcs="chrf", train_dataset=train, processing_class=tokenizer)
    trainer.train()
    after = heldout_chrf(model, tokenizer, heldout["sources"], heldout["references"])
    rewards = [h["rl/reward"] for h in trainer.state.log_history if "rl/reward" in h]
    assert rewards[-1] > rewards[0]
    assert after > before + 0.02, (before, after)


WARMUP_STEPS, RL_STEPS = 120, 150


def test_diagnostics_of_a_causal_model(tmp_path, tokenizer):
    """The exposure-bias report of a decoder-only model: prefixes are the prompt plus the first k completion tokens."""
    from datasets import Dataset

    from hf_seqrl.data import tokenize_prompt_completion
    from hf_seqrl.diagnostics import run_diagnostics, write_report

    model = tiny_causal_model(seed=1)
    sources = ["ab=", "cad=", "bbca=", "dcab="]
    references = [s[:-1][::-1] for s in sources]
    report = run_diagnostics(model, tokenizer, sources, references, max_horizon=4, batch_size=4, progress=False,
                             max_new_tokens=8, inject_positions=(0, 1))
    raw = Dataset.from_dict({"prompt": sources, "completion": references})
    batch = collate(tokenizer, raw.map(tokenize_prompt_completion, batched=True, remove_columns=raw.column_names,
                                       fn_kwargs=dict(tokenizer=tokenizer)))
    with torch.no_grad():
        loss = model(**batch).loss.item()  # mean NLL of the completion tokens (EOS included) after their prompts
    assert report["gap"]["tf_nll"] == pytest.approx(loss, rel=1e-5)
    first = report["horizon"][0]  # k = 0: the prompt alone under both prefixes
    assert first["tf_nll"] == pytest.approx(first["free_nll"]) and first["count"] == 4
    assert [r["j"] for r in report["recovery"]] == [0, 1] and all(r["count"] == 4 for r in report["recovery"])
    assert report["jacobian"]["curve"][0]["divergence"] > 0 and report["jacobian"]["growth_factor"] > 0
    paths = write_report(report, str(tmp_path))
    assert all(os.path.getsize(path) > 0 for path in paths.values())


# ---- the recipe's pipeline on the tiny offline causal config ------------------------------------------------------

def test_causal_translation_recipe_trains_evaluates_and_saves(tmp_path, monkeypatch):
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from hf_seqrl.cli.train import train_main

    repo = REPO
    monkeypatch.chdir(repo)  # the config names its data files relative to the repository root
    out = tmp_path / "causal"
    metrics = train_main(["--config", "recipes/configs/tiny_offline_causal_translation.yaml", "--output_dir",
                          str(out), "--max_steps", "4", "--warmup_xe_steps", "2", "--num_samples", "2",
                          "--tiny_d_model", "32", "--eval_strategy", "no", "--max_eval_samples", "8",
                          "--max_test_samples", "8", "--max_new_tokens", "16", "--generation_max_length", "16"])
    for prefix in ("eval", "test"):  # corpus scores of the completions, every reference
        assert 0.0 <= metrics[f"{prefix}_chrf"] <= 100.0 and 0.0 <= metrics[f"{prefix}_rl/reward"] <= 1.0
        assert 0 < metrics[f"{prefix}_gen_len"] <= 16  # completion tokens only, not the prompt
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "LlamaForCausalLM"
    card = (out / "README.md").read_text()
    assert "AutoModelForCausalLM.from_pretrained" in card and "pipeline_tag: text-generation" in card
    # `hf-seqrl evaluate` and `hf-seqrl diagnose` load the checkpoint as a causal LM and read sources as prompts
    from hf_seqrl.cli.diagnose import main as diagnose_main
    from hf_seqrl.cli.evaluate import main as evaluate_main

    data = ["--model", str(out), "--data", "recipes/data/toy_de_en.test.txt", "--max_examples", "4",
            "--max_new_tokens", "8"]
    assert evaluate_main([*data, "--output", str(tmp_path / "scores.json")]) == 0
    assert 0.0 <= json.loads((tmp_path / "scores.json").read_text())["scores"]["chrf"] <= 100.0
    assert diagnose_main([*data, "--output_dir", str(tmp_path / "diag"), "--max_horizon", "4"]) == 0
    assert (tmp_path / "diag" / "diagnostics.json").exists()


def test_decode_loop_keeps_pace_with_ranks_still_decoding(tokenizer, monkeypatch):
    """Under sharded weights every rank joins every forward: while another rank still decodes, a rank whose rows
    have ended keeps calling the model; its tokens are the ones it decodes alone."""
    import hf_seqrl.models.causal as causal
    import hf_seqrl.models.decoding as decoding  # the decode loop both families share

    model = tiny_causal_model("llama", seed=2).eval()
    prompt = torch.tensor([tokenizer("ab=", add_special_tokens=False)["input_ids"]])
    config = causal_generation_config(model, 12)
    config.do_sample = False
    choose = decoding.choose_tokens
    steps = []

    def eos_on_third_token(logits, *args):  # this rank's row ends after 3 tokens
        steps.append(1)
        return choose(logits, *args) if len(steps) < 3 else torch.ones_like(logits[:, 0], dtype=torch.long)

    monkeypatch.setattr(decoding, "choose_tokens", eos_on_third_token)
    alone, _ = causal.decode_causal(model, prompt, torch.ones_like(prompt, dtype=torch.bool), config)
    assert alone.shape[1] == 3 and alone[0, 2] == 1
    steps.clear()
    calls = []
    monkeypatch.setattr(decoding, "lockstep_group", lambda: True)

    def another_rank_runs(value, op=None):  # the limit agreed first (the same), then each look: another rank runs
        calls.append(value.item())
        value.fill_(max(value.item(), 1.0))

    monkeypatch.setattr(decoding.dist, "all_reduce", another_rank_runs)
    forwards = []
    handle = model.register_forward_hook(lambda module, args, output: forwards.append(1))
    try:
        ids, mask = causal.decode_causal(model, prompt, torch.ones_like(prompt, dtype=torch.bool), config)
    finally:
        handle.remove()
    assert len(forwards) == 12  # the prompt, then one forward per step the other rank still runs
    assert calls == [12.0, 0.0, 0.0]  # the limit, then one look every SYNC_EVERY = 4 steps (at 4 and 8; 12 ends it)
    assert ids.tolist() == alone.tolist() and mask.sum() == (alone != 0).sum()


def test_ended_rows_leave_the_causal_forward_without_changing_any_row(tokenizer):
    # As in the seq2seq decode: once at most half of the rows in the forward still run, the ended ones leave it;
    # every row's tokens equal those of the decode that keeps all rows (same uniforms: the same RNG state).
    import hf_seqrl.models.causal as causal

    model = tiny_causal_model("qwen2", seed=1).eval()
    eos = causal.eos_ids(model)[0]

    def eos_often(module, args, output):  # a sample row ends with probability about 1/4 per step
        output = output.clone()
        output[..., eos] = output.logsumexp(dim=-1) - 1.0
        return output

    model.get_output_embeddings().register_forward_hook(eos_often)
    enc = tokenizer(["ab=", "hello=", "xyz uvw="], add_special_tokens=False, padding=True, padding_side="left",
                    return_tensors="pt")
    config = causal_generation_config(model, 12)
    rows_per_step = []
    hook = model.register_forward_hook(lambda module, args, kwargs, output: rows_per_step.append(
        kwargs["input_ids"].shape[0]), with_kwargs=True)
    torch.manual_seed(0)
    compact = causal.decode_causal(model, enc["input_ids"], enc["attention_mask"].bool(), config, group=4,
                                   greedy_first=True)
    hook.remove()
    torch.manual_seed(0)
    full = causal.decode_causal(model, enc["input_ids"], enc["attention_mask"].bool(), config, group=4,
                                greedy_first=True, compact_below=0)
    assert torch.equal(compact[0], full[0]) and torch.equal(compact[1], full[1])
    lengths = full[1].sum(1)
    assert lengths.min() < lengths.max()
    assert min(rows_per_step[1:]) < 12 <= rows_per_step[1]  # ended rows left the forward
    assert all(a >= b for a, b in zip(rows_per_step[1:], rows_per_step[2:]))
