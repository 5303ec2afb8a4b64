"""The README's quick start runs as written, with its model and dataset names swapped for local tiny ones."""

import json
import re
from pathlib import Path

import pytest

from helpers import byt5_tokenizer, REPO, tiny_model, toy_pairs

README = REPO / "README.md"
HUB_MODEL = '"Helsinki-NLP/opus-mt-de-en"'
HUB_DATASET = 'load_dataset("wmt16", "de-en")'


def quick_start() -> str:
    """Returns the first ```python block after the README's `## Quick start` heading."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Quick start"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_quick_start_runs_with_local_model_and_data(tmp_path, monkeypatch):
    code = quick_start()
    assert code.count(HUB_MODEL) == 1 and code.count(HUB_DATASET) == 1, "the quick start's names changed"
    model_dir = tmp_path / "opus-mt-tiny"
    tiny_model("marian").save_pretrained(model_dir)
    byt5_tokenizer().save_pretrained(model_dir)
    files = {}
    for split, seed in (("train", 0), ("validation", 1)):
        german, english = toy_pairs(16, seed=seed, alphabet="abcdef", lengths=(3, 6))
        files[split] = str(tmp_path / f"{split}.jsonl")
        with open(files[split], "w") as f:
            for de, en in zip(german, english):
                f.write(json.dumps({"translation": {"de": de, "en": en[::-1]}}) + "\n")
    code = code.replace(HUB_MODEL, repr(str(model_dir))).replace(HUB_DATASET,
                                                                 f'load_dataset("json", data_files={files!r})')
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md quick start", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 1  # one pass over 16 rows at batch 16
    assert any("rl/reward" in h and "rl/xe_loss" in h for h in trainer.state.log_history)  # SCST mixed with XE
    out = tmp_path / "opus-mt-de-en-scst"
    assert (out / "model.safetensors").exists() and (out / "README.md").exists()
    assert "bleu" in (out / "README.md").read_text()
    assert (out / "seqrl_run.json").exists()  # what `hf-seqrl evaluate` reads back
    # Its compute_metrics makes evaluation generate: corpus BLEU (0-100) beside the reward (0-1).
    metrics = trainer.evaluate()
    assert 0 <= metrics["eval_bleu"] <= 100 and 0 <= metrics["eval_chrf"] <= 100 and "eval_rl/reward" in metrics


def test_readme_names_the_test_command_ci_runs():
    ci = (README.parent / ".ci" / "run").read_text()
    if not README.exists():
        pytest.skip("no README")
    assert "python -m pytest -q" in README.read_text() and "python -m pytest -q" in ci
