"""Datasets and models as users bring them: text columns (as TRL's trainers take them) tokenized by the trainer, and
LoRA adapters through `peft_config=` (the KL reference is the same network with its adapter off)."""

from functools import partial

import pytest
import torch
from datasets import Dataset

from helpers import byt5_tokenizer, make_config, overlap_reward, target_loss, tiny_causal_model, tiny_model, toy_pairs
from hf_seqrl import (KStepRolloutConfig, KStepRolloutTrainer, MixerConfig, MixerTrainer, MRTConfig, MRTTrainer,
                      PrefixCorruptionConfig, PrefixCorruptionTrainer, ProfessorForcingConfig, ProfessorForcingTrainer,
                      ReinforceTrainer, ScheduledSamplingConfig, ScheduledSamplingTrainer, SCSTTrainer, SeqRLConfig,
                      SeqRLTrainer)

peft = pytest.importorskip("peft")
config = partial(make_config, SeqRLConfig, max_steps=2, num_samples=2)  # config(tmp_path, **overrides)
SEEN_COLUMNS: list[dict] = []


def recording_reward(predictions, references, sources=None, **columns):
    """`overlap_reward`, recording the extra columns it receives."""
    SEEN_COLUMNS.append(columns)
    return overlap_reward(predictions, references, sources, **columns)


def pairs(n=8, seed=0, source="source", target="target"):
    src, tgt = toy_pairs(n, seed=seed, alphabet="abcd", lengths=(2, 5))
    return Dataset.from_dict({source: src, target: tgt, "domain": [f"d{i % 2}" for i in range(n)]})


TRAINERS = {
    "scst": (SCSTTrainer, SeqRLConfig, dict(num_samples=2), True),
    "reinforce": (ReinforceTrainer, SeqRLConfig, dict(num_samples=2), True),
    "mrt": (MRTTrainer, MRTConfig, dict(num_samples=2), True),
    "mixer": (MixerTrainer, MixerConfig, dict(num_samples=2, mixer_delta=1), True),
    "ss": (ScheduledSamplingTrainer, ScheduledSamplingConfig, {}, False),
    "pc": (PrefixCorruptionTrainer, PrefixCorruptionConfig, dict(corruption_rate=0.3), False),
    "ks": (KStepRolloutTrainer, KStepRolloutConfig, dict(rollout_steps=2), False),
    "pf": (ProfessorForcingTrainer, ProfessorForcingConfig, dict(discriminator_hidden_size=8), False),
}


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_every_seq2seq_trainer_trains_on_text_columns(tmp_path, name):
    trainer_class, config_class, settings, rewarded = TRAINERS[name]
    tokenizer = byt5_tokenizer()
    args = make_config(config_class, tmp_path, max_steps=2, **settings)
    rewards = {"reward_funcs": recording_reward} if rewarded else {}
    trainer = trainer_class(model=tiny_model("t5"), args=args, processing_class=tokenizer, train_dataset=pairs(),
                            **rewards)
    assert {"input_ids", "labels", "references", "sources", "domain"} <= set(trainer.train_dataset.column_names)
    trainer.train()
    assert trainer.state.global_step == 2


@pytest.mark.parametrize("arch", ["t5", "bart", "marian"])
def test_text_columns_reach_the_rewards_and_lengths_apply(tmp_path, arch):
    tokenizer = byt5_tokenizer()
    SEEN_COLUMNS.clear()
    data = pairs(source="text", target="summary")
    trainer = SCSTTrainer(model=tiny_model(arch), args=config(tmp_path, source_column="text", target_column="summary",
                                                               max_source_length=3, rl_weight=0.5),
                          reward_funcs=recording_reward, processing_class=tokenizer, train_dataset=data)
    assert max(len(ids) for ids in trainer.train_dataset["input_ids"]) <= 3
    assert trainer.train_dataset["references"][0] == [data["summary"][0]]
    trainer.train()
    assert SEEN_COLUMNS and all(set(seen) == {"domain"} for seen in SEEN_COLUMNS)


def test_remove_unused_columns_drops_the_columns_the_model_does_not_take_as_seq2seqtrainer_does(tmp_path):
    tokenizer = byt5_tokenizer()
    SEEN_COLUMNS.clear()
    trainer = SCSTTrainer(model=tiny_model("t5"), args=config(tmp_path, remove_unused_columns=True),
                          reward_funcs=recording_reward, processing_class=tokenizer, train_dataset=pairs())
    trainer.train()
    assert SEEN_COLUMNS and all(seen == {} for seen in SEEN_COLUMNS)  # "domain" is gone; the references stay


@pytest.mark.parametrize("arch,trainer_class", [("llama", SCSTTrainer), ("qwen2", SeqRLTrainer)])
def test_causal_models_train_on_prompt_completion_text(tmp_path, arch, trainer_class):
    tokenizer = byt5_tokenizer()
    data = pairs(source="prompt", target="completion")
    trainer = trainer_class(model=tiny_causal_model(arch), args=config(tmp_path, max_completion_length=4),
                          reward_funcs=recording_reward, processing_class=tokenizer, train_dataset=data)
    row = trainer.train_dataset[0]
    prompt_length = sum(label == -100 for label in row["labels"])
    assert row["input_ids"][:prompt_length] == tokenizer(data["prompt"][0])["input_ids"][:-1]  # no EOS before
    assert len(row["input_ids"]) - prompt_length <= 4
    trainer.train()
    assert any("rl/reward" in h for h in trainer.state.log_history)


def test_prompts_with_references_only_train_pure_rl(tmp_path):
    tokenizer = byt5_tokenizer()
    src, tgt = toy_pairs(8, seed=3, alphabet="abcd", lengths=(2, 5))
    messages = [[{"role": "user", "content": s}] for s in src]
    data = Dataset.from_dict({"prompt": src, "references": [[t, t + "a"] for t in tgt]})
    trainer = SCSTTrainer(model=tiny_causal_model("llama"), args=config(tmp_path), reward_funcs=recording_reward,
                          processing_class=tokenizer, train_dataset=data)
    assert "labels" not in trainer.train_dataset.column_names
    assert trainer.train_dataset["references"][0] == [tgt[0], tgt[0] + "a"]
    trainer.train()
    assert messages  # chat messages go through the tokenizer's chat template (test_causal covers templates)


def test_a_dataset_with_neither_form_names_both():
    data = Dataset.from_dict({"text": ["a"], "label": ["b"]})
    with pytest.raises(ValueError, match=r"'source' and 'target'.*'prompt' and 'completion'"):
        SCSTTrainer(model=tiny_model("t5"), args=SeqRLConfig(output_dir="unused", report_to=[]),
                    reward_funcs=recording_reward, processing_class=byt5_tokenizer(), train_dataset=data)


def test_a_student_trains_on_a_teacher_column_and_is_evaluated_on_the_gold_one(tmp_path):
    """Sequence-level KD in Python: `target_column` names the teacher's outputs (the train split), `eval_target_column`
    the gold references (the evaluation splits), whose labels give the evaluation loss. An evaluation split read
    through `target_column` alone, which lacks that column, is refused naming `eval_target_column`."""
    tokenizer = byt5_tokenizer()
    train = pairs().add_column("teacher", [t[::-1] + "a" for t in pairs()["target"]])
    gold = {"dev": pairs(n=3, seed=1), "test": pairs(n=3, seed=2)}
    args = config(tmp_path, target_column="teacher", eval_target_column="target", warmup_xe_steps=2)
    trainer = SCSTTrainer(model=tiny_model("t5"), args=args, reward_funcs=recording_reward, processing_class=tokenizer,
                          train_dataset=train, eval_dataset=gold)
    assert trainer.train_dataset["references"] == [[t] for t in train["teacher"]]
    for name, data in gold.items():
        assert trainer.eval_dataset[name]["references"] == [[t] for t in data["target"]]
    trainer.train()
    for name, data in gold.items():
        loss = trainer.evaluate(trainer.eval_dataset[name], metric_key_prefix=name)[f"{name}_loss"]
        assert loss == pytest.approx(target_loss(trainer.model, tokenizer, data["source"], data["target"]), rel=1e-5)
    with pytest.raises(ValueError, match=r"dev has no column 'teacher' \(SeqRLConfig.target_column; .*set "
                                         r"eval_target_column to the column of its targets .*target_column='teacher' "
                                         r"stays the train split's"):
        SCSTTrainer(model=tiny_model("t5"), args=config(tmp_path, target_column="teacher"),
                    reward_funcs=recording_reward, processing_class=tokenizer, train_dataset=train, eval_dataset=gold)


# ---- LoRA ------------------------------------------------------------------------------------------------------

def lora(family="seq2seq"):
    modules = ["q", "v"] if family == "seq2seq" else ["q_proj", "v_proj"]
    return peft.LoraConfig(r=4, lora_alpha=8, target_modules=modules,
                           task_type="SEQ_2_SEQ_LM" if family == "seq2seq" else "CAUSAL_LM")


@pytest.mark.parametrize("family", ["seq2seq", "causal"])
def test_lora_trains_only_the_adapter_and_the_reference_shares_the_base_weights(tmp_path, family):
    tokenizer = byt5_tokenizer()
    model = tiny_model("t5", dropout=0.1) if family == "seq2seq" else tiny_causal_model("llama")
    base = {k: v.clone() for k, v in model.state_dict().items()}
    data = pairs() if family == "seq2seq" else pairs(source="prompt", target="completion")
    trainer = SCSTTrainer(model=model, args=config(tmp_path, kl_coef=0.5, learning_rate=5e-2, max_steps=3),
                          reward_funcs=recording_reward, processing_class=tokenizer, train_dataset=data,
                          peft_config=lora(family))
    assert trainer.ref_model is None and trainer.frozen_models["reference"].adapter is None  # no second copy of the weights
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rl/kl" in h]
    assert logs[0]["rl/kl"] == 0.0 and logs[-1]["rl/kl"] > 0.0  # the adapter starts as the identity, then moves
    trained = trainer.accelerator.unwrap_model(trainer.model)
    merged_names = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
                    for k, v in trained.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(base[k], merged_names[k]) for k in base)  # the base weights did not move
    assert any(p.abs().sum() > 0 for n, p in trained.named_parameters() if "lora_B" in n)


def test_a_trained_adapter_is_its_own_frozen_reference_and_saves_as_an_adapter(tmp_path):
    tokenizer = byt5_tokenizer()
    model = peft.get_peft_model(tiny_model("t5"), lora())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # an adapter trained before
    trainer = SCSTTrainer(model=model, args=config(tmp_path, kl_coef=0.5, learning_rate=5e-2),
                          reward_funcs=recording_reward, processing_class=tokenizer, train_dataset=pairs())
    assert trainer.frozen_models["reference"].adapter == "reference"
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rl/kl" in h]
    assert logs[0]["rl/kl"] == 0.0 and logs[-1]["rl/kl"] > 0.0
    out = tmp_path / "saved"
    trainer.save_model(str(out))
    assert (out / "adapter_model.safetensors").exists() and (out / "adapter_config.json").exists()
    card = (out / "README.md").read_text()
    assert "PeftModel.from_pretrained" in card
    reloaded = peft.PeftModel.from_pretrained(tiny_model("t5"), str(out)).eval()
    ids = torch.tensor([[5, 6, 7, 1]])
    start = torch.zeros((1, 1), dtype=torch.long)
    trained = trainer.accelerator.unwrap_model(trainer.model).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids, decoder_input_ids=start).logits,
                                   trained(input_ids=ids, decoder_input_ids=start).logits)
