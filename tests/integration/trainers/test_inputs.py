"""Inputs as users bring them: a model's Hub id or folder, `tokenizer=`, a tokenizer without a pad token, tokenizers
that write `token_type_ids`, streamed text datasets and empty prompts."""

import json
import logging

import pytest
import torch
from datasets import Dataset
from transformers import ByT5Tokenizer

from helpers import byt5_tokenizer, params, tiny_causal_model, tiny_model, toy_pairs
from hf_seqrl import SCSTTrainer, SeqRLConfig


def args_for(tmp_path, **kwargs):
    settings = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=2, learning_rate=1e-3,
                    logging_steps=1, report_to=[], save_strategy="no", max_new_tokens=6, disable_tqdm=True,
                    dataloader_pin_memory=False, seed=0, num_samples=2, baseline="mean")
    return SeqRLConfig(**{**settings, **kwargs})


def length(predictions, references, sources=None, **columns):
    """Varies between an untrained model's samples, so that every step has a gradient."""
    return [min(len(p), 12) / 12 for p in predictions]


def pairs(n=8, **columns) -> Dataset:
    sources, targets = toy_pairs(n, seed=1)
    return Dataset.from_dict({"source": sources, "target": targets, **columns})


def test_a_folder_for_model_loads_with_its_family_and_model_init_kwargs(tmp_path):
    tiny_model("t5").save_pretrained(tmp_path / "base")
    byt5_tokenizer().save_pretrained(tmp_path / "base")
    half = SCSTTrainer(model=str(tmp_path / "base"), args=args_for(tmp_path, model_init_kwargs={"dtype": "bfloat16"}),
                       reward_funcs="chrf", train_dataset=pairs())
    assert type(half.model).__name__ == "T5ForConditionalGeneration" and half.model.dtype == torch.bfloat16
    assert isinstance(half.processing_class, ByT5Tokenizer)  # loaded from the folder too
    # On the command line the same field is a JSON object.
    trainer = SCSTTrainer(model=str(tmp_path / "base"), reward_funcs=length, train_dataset=pairs(),
                          args=args_for(tmp_path, model_init_kwargs=json.dumps({"dtype": "float32"})))
    before = params(trainer.model)
    trainer.train()
    assert any(not torch.equal(before[k], v) for k, v in params(trainer.model).items())
    with pytest.raises(ValueError, match="model_init_kwargs=.*not a JSON object"):
        args_for(tmp_path, model_init_kwargs="dtype=float32")


def test_tokenizer_keyword_names_processing_class(tmp_path):
    with pytest.raises(TypeError, match="processing_class="):
        SCSTTrainer(model=tiny_model("t5"), args=args_for(tmp_path), reward_funcs="chrf", train_dataset=pairs(),
                    tokenizer=byt5_tokenizer())


def no_pad_tokenizer():
    tokenizer = ByT5Tokenizer()
    tokenizer.pad_token = None
    assert tokenizer.pad_token_id is None
    return tokenizer


def test_without_a_pad_token_decoder_only_pads_with_eos_and_encoder_decoder_is_refused(tmp_path, caplog):
    sources, targets = toy_pairs(8, seed=1)
    prompts = Dataset.from_dict({"prompt": [s + "=" for s in sources], "completion": targets})
    tokenizer = no_pad_tokenizer()
    with caplog.at_level(logging.WARNING):
        trainer = SCSTTrainer(model=tiny_causal_model(), args=args_for(tmp_path), reward_funcs="chrf",
                              train_dataset=prompts, processing_class=tokenizer)
    assert tokenizer.pad_token == tokenizer.eos_token and "padding with its EOS token" in caplog.text
    trainer.train()
    assert [h["rl/phase"] for h in trainer.state.log_history if "rl/phase" in h] == [1.0, 1.0]
    with pytest.raises(ValueError, match="has no pad token.*processing_class.pad_token"):
        SCSTTrainer(model=tiny_model("t5"), args=args_for(tmp_path), reward_funcs="chrf", train_dataset=pairs(),
                    processing_class=no_pad_tokenizer())


class TokenTypeTokenizer(ByT5Tokenizer):
    """A byte tokenizer that also writes `token_type_ids`, as BERT tokenizers do."""

    model_input_names = ["input_ids", "token_type_ids", "attention_mask"]


def test_tokenizer_outputs_reach_neither_rewards_nor_sample_logs(tmp_path):
    seen = []

    def overlap(predictions, references, sources):  # the signature the docs show: no **columns
        seen.append(len(predictions))
        return [len(set(p) & set(r[0])) / max(len(set(r[0])), 1) for p, r in zip(predictions, references)]

    tokenizer = TokenTypeTokenizer()
    assert "token_type_ids" in tokenizer(["ab"])
    trainer = SCSTTrainer(model=tiny_model("t5"), args=args_for(tmp_path, log_completions=True),
                          reward_funcs=overlap, train_dataset=pairs(), processing_class=tokenizer)
    trainer.train()
    assert seen
    rows = [json.loads(line) for line in (tmp_path / "out" / "completions" / "step-2.jsonl").read_text().splitlines()]
    assert rows and not any("token_type_ids" in row for row in rows)


def test_streamed_text_columns_are_tokenized_on_the_fly(tmp_path):
    streamed = pairs().to_iterable_dataset()
    trainer = SCSTTrainer(model=tiny_model("t5"), args=args_for(tmp_path), reward_funcs=length,
                          train_dataset=streamed, processing_class=byt5_tokenizer())
    before = params(trainer.model)
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(before[k], v) for k, v in params(trainer.model).items())


@pytest.mark.parametrize("family", ["seq2seq", "causal"])
def test_empty_prompts_are_refused_with_their_rows(tmp_path, family):
    model = tiny_model("t5") if family == "seq2seq" else tiny_causal_model()
    column = "source" if family == "seq2seq" else "prompt"
    data = Dataset.from_dict({column: ["abc", " ", "de", ""], "target": ["x", "y", "z", "w"]})
    with pytest.raises(ValueError, match=rf"train_dataset rows \[1, 3\]: the '{column}' text is empty"):
        SCSTTrainer(model=model, args=args_for(tmp_path), reward_funcs="chrf", train_dataset=data,
                    processing_class=byt5_tokenizer())


def test_attn_implementation_of_model_init_kwargs_reaches_the_policy_its_reference_and_model_rewards(tmp_path, caplog):
    from helpers import tiny_classifier
    from hf_seqrl.rewards import RewardModelReward

    reward = RewardModelReward(tiny_classifier(), tokenizer=byt5_tokenizer())
    model = tiny_model("t5", seed=0)
    assert model.config._attn_implementation != "eager"
    with caplog.at_level(logging.WARNING):
        trainer = SCSTTrainer(model=model, args=args_for(tmp_path, kl_coef=0.1, model_init_kwargs={
            "attn_implementation": "eager", "dtype": "bfloat16"}), train_dataset=pairs(),
            processing_class=byt5_tokenizer(), reward_funcs=[reward, length])
    assert trainer.model.config._attn_implementation == "eager"
    assert trainer.ref_model.config._attn_implementation == "eager"
    assert reward.model.config._attn_implementation == "eager"
    # the other keys need a model to load: named, not applied
    assert any("['dtype']" in r.getMessage() and "not applied" in r.getMessage() for r in caplog.records)
    assert next(trainer.model.parameters()).dtype == torch.float32
    trainer.train()
