"""Model cards and `push_to_hub`: what the card says (the algorithm that ran, links that exist), what reaches the
Hub client, that no token leaks, and that an installed wheel carries the card template.

The Hub is never contacted: `huggingface_hub.HfApi.create_repo` / `upload_folder` (what transformers'
`Trainer.init_hf_repo` and `Trainer.push_to_hub` call, through `transformers.utils.hub.hf_api()`) are replaced by
recorders. The code under test (trainers, hub.py, pipeline) runs unpatched.
"""

from __future__ import annotations

import email.message
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from huggingface_hub import HfApi, ModelCard, RepoUrl

from helpers import byt5_tokenizer, REPO, tiny_model, toy_dataset, toy_pairs
from hf_seqrl import SCSTTrainer, SeqRLConfig
from hf_seqrl.hub import project_url, render_model_card
from hf_seqrl.trainers import (KStepRolloutTrainer, MixerTrainer, MRTTrainer, PrefixCorruptionTrainer,
                               ProfessorForcingTrainer, ReinforceTrainer, ScheduledSamplingTrainer, SeqRLBaseTrainer,
                               SeqRLTrainer)
from hf_seqrl.objectives.policy_gradient import PolicyGradient, policy_gradient_method

# Each trainer's label, and the trainer (or method) that carries its card metadata.
TRAINERS = {"SCST": SCSTTrainer, "REINFORCE": ReinforceTrainer, "Scheduled sampling": ScheduledSamplingTrainer,
            "Cross-entropy": SeqRLBaseTrainer, "MRT": MRTTrainer, "Professor forcing": ProfessorForcingTrainer,
            "MIXER": MixerTrainer, "Prefix corruption": PrefixCorruptionTrainer, "k-step rollout": KStepRolloutTrainer}


def method_of(algorithm, baseline=None):
    """Returns the card `Method` of the trainer labelled `algorithm` run with `baseline`."""
    if algorithm == "Noise-level forcing":  # the prefix-corruption trainer with per-token levels
        return PrefixCorruptionTrainer.noise_level_method
    if algorithm == "Prefix corruption":
        return PrefixCorruptionTrainer.prefix_corruption
    trainer = TRAINERS[algorithm]
    objective = getattr(trainer, "objective_class", None)
    if objective is PolicyGradient:
        return policy_gradient_method(trainer.default_baseline if baseline in (None, "None") else baseline)
    return trainer.method if objective is None else objective.method


FAKE_TOKEN = "hf_FAKEtokenDoNotLeak0123456789abcdef"  # looks like a real token to any secret scanner


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


# ---- rendering -----------------------------------------------------------------------------------------------------

def test_card_has_model_data_method_metrics_versions_and_bibtex():
    card = render_model_card(
        model_name="opus-mt-de-en-scst", method=method_of("SCST", "greedy"), task="translation",
        base_model="Helsinki-NLP/opus-mt-de-en", datasets=["wmt/wmt16"], reward="bleu_reward",
        settings={"reward": "bleu", "num_samples": 1, "rl_weight": 0.9, "learning_rate": 1e-5},
        metrics={"eval_bleu": 31.25, "eval_chrf": 57.5}, repo_id="me/opus-mt-de-en-scst",
    )
    meta = front_matter(card)
    assert meta["base_model"] == "Helsinki-NLP/opus-mt-de-en"
    assert meta["datasets"] == ["wmt/wmt16"]
    assert meta["pipeline_tag"] == "translation" and meta["library_name"] == "transformers"
    assert {"hf-seqrl", "scst"} <= set(meta["tags"])
    # the Hub's own parser accepts the metadata
    assert ModelCard(card).data.to_dict()["pipeline_tag"] == "translation"
    assert "- Algorithm: SCST" in card
    assert "- Reward: `bleu_reward`" in card and "- Baseline: `greedy`" in card
    assert "| `rl_weight` | `0.9` |" in card
    assert "| `eval_bleu` | 31.25 |" in card and "| `eval_chrf` | 57.5 |" in card
    assert f"- transformers {transformers.__version__}" in card and f"- torch {torch.__version__}" in card
    assert "@inproceedings{rennie2017scst," in card and "@software{hf_seqrl," in card
    assert "[Rennie et al., 2017](https://arxiv.org/abs/1612.00563)" in card
    assert 'AutoModelForSeq2SeqLM.from_pretrained("me/opus-mt-de-en-scst")' in card
    # transformers 5 has no translation pipeline: the card generates with the model itself
    assert "pipeline(" not in card and "outputs = model.generate(**inputs)" in card
    # the evaluation metrics reach the model-index, on the one Hub dataset the model was trained on
    results = {(r.metric_type, r.metric_value, r.dataset_type, r.dataset_split)
               for r in ModelCard(card).data.eval_results}
    assert results == {("bleu", 31.25, "wmt/wmt16", "validation"), ("chrf", 57.5, "wmt/wmt16", "validation")}


@pytest.mark.parametrize("algorithm,bibtex", [("REINFORCE", "williams1992reinforce"),
                                              ("Scheduled sampling", "mihaylova2019scheduled")])
def test_summarization_card_is_tagged_summarization(algorithm, bibtex):
    card = render_model_card(model_name="m", method=method_of(algorithm, "moving_average"), task="summarization",
                             base_model="facebook/bart-base", reward="rougeL_reward")
    meta = front_matter(card)
    assert meta["pipeline_tag"] == "summarization"
    assert "text-generation" not in card and "text2text-generation" not in card
    assert bibtex in card and "pipeline(" not in card and "\nSummarization model fine-tuned with" in card


@pytest.mark.parametrize("algorithm,baseline,name,slug,citations", [
    ("SCST", "greedy", "SCST", "scst", ["rennie2017scst"]),
    ("SCST", None, "SCST", "scst", ["rennie2017scst"]),  # the SCST trainer's default baseline
    ("SCST", "mean", "REINFORCE with leave-one-out baseline", "rloo", ["williams1992reinforce", "kool2019buy4"]),
    ("REINFORCE", "mean", "REINFORCE with leave-one-out baseline", "rloo", ["williams1992reinforce", "kool2019buy4"]),
    # the SCST trainer without the greedy baseline is no longer self-critical
    ("SCST", "moving_average", "REINFORCE with a moving-average baseline", "reinforce", ["williams1992reinforce"]),
    ("SCST", "none", "REINFORCE without baseline", "reinforce", ["williams1992reinforce"]),
    ("REINFORCE", "moving_average", "REINFORCE with a moving-average baseline", "reinforce",
     ["williams1992reinforce"]),
    ("REINFORCE", "None", "REINFORCE with a moving-average baseline", "reinforce", ["williams1992reinforce"]),
    ("REINFORCE", "none", "REINFORCE without baseline", "reinforce", ["williams1992reinforce"]),
    ("REINFORCE", "greedy", "SCST", "scst", ["rennie2017scst"]),
    ("Scheduled sampling", "None", "Scheduled sampling", "scheduled-sampling",
     ["bengio2015scheduled", "mihaylova2019scheduled"]),
    ("Cross-entropy", None, "Cross-entropy", "cross-entropy", []),
    ("MRT", "greedy", "Minimum risk training", "mrt", ["shen2016mrt"]),  # MRT has no baseline to name
    ("Professor forcing", None, "Professor forcing", "professor-forcing", ["lamb2016professor"]),
    ("MIXER", "moving_average", "MIXER", "mixer", ["ranzato2016mixer"]),
    ("Prefix corruption", None, "Prefix corruption", "prefix-corruption", []),
    ("Noise-level forcing", None, "Noise-level forcing", "noise-level-forcing", ["chen2024diffusion"]),
    ("k-step rollout", None, "k-step rollout", "k-step-rollout", []),
])
def test_card_method_names_what_the_baseline_makes_of_the_trainer(algorithm, baseline, name, slug, citations):
    method = method_of(algorithm, baseline)
    assert (method.name, method.tag, [paper.key for paper in method.papers]) == (name, slug, citations)
    assert method.description
    assert all(paper.citation.startswith("@") and f"{{{paper.key}," in paper.citation and paper.title
               and paper.url.startswith("https://") for paper in method.papers)


def test_card_method_spells_out_scst_and_leaves_baseline_out_without_policy_gradient():
    assert method_of("SCST", "greedy").description == (
        "self-critical sequence training: policy gradient with the greedy decode's reward as baseline")
    assert method_of("Scheduled sampling", None).baseline is None
    assert method_of("REINFORCE", None).baseline == "moving_average"


def test_leave_one_out_card_says_leave_one_out_not_scst():
    card = render_model_card(model_name="tiny-rloo", method=method_of("SCST", "mean"), reward="chrf_reward",
                             settings={"baseline": "mean", "num_samples": 4})
    assert "- Algorithm: REINFORCE with leave-one-out baseline (" in card and "- Baseline: `mean`" in card
    assert "rloo" in front_matter(card)["tags"]
    assert "scst" not in card.lower() and "self-critical" not in card.lower()
    assert "@article{williams1992reinforce," in card and "@inproceedings{kool2019buy4," in card
    assert "https://openreview.net/forum?id=r1lgTGL5DE" in card and "https://doi.org/10.1007/BF00992696" in card


def test_cross_entropy_card_cites_no_method_and_shows_no_baseline():
    card = render_model_card(model_name="xe", method=method_of("Cross-entropy", "None"),
                             reward="none (cross-entropy)")
    assert "cross-entropy" in front_matter(card)["tags"]
    assert "Baseline" not in card and "@inproceedings" not in card and "@article" not in card
    assert "@software{hf_seqrl," in card


def fake_metadata(monkeypatch, **fields):
    """Makes `importlib.metadata.metadata("hf-seqrl")` answer with `fields` (`Home_page`, `Project_URL`: list)."""
    real = metadata.metadata

    def lookup(name):
        if name != "hf-seqrl":
            return real(name)
        meta = email.message.Message()
        meta["Name"] = "hf-seqrl"
        for key, value in fields.items():
            for item in value if isinstance(value, list) else [value]:
                meta[key.replace("_", "-")] = item
        return meta

    monkeypatch.setattr(metadata, "metadata", lookup)


def test_card_without_project_url_names_the_project_without_a_link(monkeypatch):
    fake_metadata(monkeypatch)
    assert project_url() is None
    card = render_model_card(model_name="m", method=method_of("SCST", "greedy"))
    assert "github.com/hf-seqrl" not in card and "hf-seqrl](" not in card
    assert "using hf-seqrl," in card
    software = card[card.index("@software{hf_seqrl,"):]
    assert "url" not in software.split("}\n```")[0]


@pytest.mark.parametrize("fields", [{"Home_page": "https://example.org/hf-seqrl"},
                                    {"Project_URL": ["Homepage, https://example.org/hf-seqrl"]}])
def test_card_links_the_project_url_the_package_declares(monkeypatch, fields):
    fake_metadata(monkeypatch, **fields)
    assert project_url() == "https://example.org/hf-seqrl"
    card = render_model_card(model_name="m", method=method_of("SCST", "greedy"))
    assert "using [hf-seqrl](https://example.org/hf-seqrl)," in card
    assert "url     = {https://example.org/hf-seqrl}" in card
    assert "github.com/hf-seqrl" not in card


def test_free_text_data_stays_out_of_the_metadata_and_the_model_index():
    card = render_model_card(model_name="demo", method=method_of("SCST", "greedy"),
                             datasets=["generated toy translation (demo, seed 0)"], metrics={"test_bleu": 12.0})
    meta = front_matter(card)
    assert "datasets" not in meta and "model-index" not in meta
    assert "- Data: generated toy translation (demo, seed 0)" in card


def test_card_of_model_built_from_config_has_no_base_model():
    card = render_model_card(model_name="tiny", method=method_of("SCST", "mean"), base_model="", reward="chrf_reward")
    assert "base_model" not in front_matter(card)
    assert "from a model built from its config" in card


# ---- push_to_hub -----------------------------------------------------------------------------------------------------

class HubRecorder:
    """Stands in for the Hub client methods; records each call and snapshots the folder when it is uploaded."""

    def __init__(self):
        self.created, self.uploads = [], []

    def create_repo(self, api, repo_id, **kwargs):
        self.created.append(dict(repo_id=repo_id, **kwargs))
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, api, *, repo_id, folder_path, **kwargs):
        files = {}
        for root, _, names in os.walk(folder_path):
            for name in names:
                path = os.path.join(root, name)
                files[os.path.relpath(path, folder_path)] = Path(path).read_bytes()
        self.uploads.append(dict(repo_id=repo_id, folder_path=folder_path, files=files, **kwargs))
        return f"https://huggingface.co/{repo_id}/commit/0"


@pytest.fixture
def hub(monkeypatch):
    recorder = HubRecorder()
    monkeypatch.setattr(HfApi, "create_repo", lambda api, repo_id, **kw: recorder.create_repo(api, repo_id, **kw))
    monkeypatch.setattr(HfApi, "upload_folder", lambda api, **kw: recorder.upload_folder(api, **kw))
    return recorder


def assert_no_token_anywhere(output_dir: Path, *texts: str) -> None:
    token = FAKE_TOKEN.encode()
    for path in output_dir.rglob("*"):
        if path.is_file():
            assert token not in path.read_bytes(), f"the token leaked into {path}"
    for text in texts:
        assert FAKE_TOKEN not in text


def test_trainer_push_to_hub_uploads_model_files_and_card_without_token(tmp_path, hub, capfd, caplog):
    tokenizer = byt5_tokenizer()
    sources, targets = toy_pairs(8, seed=0, alphabet="abcd", lengths=(2, 5))
    out = tmp_path / "out"
    args = SeqRLConfig(output_dir=str(out), per_device_train_batch_size=4, max_steps=2, logging_steps=1,
                       report_to=[], save_strategy="no", max_new_tokens=8, disable_tqdm=True,
                       push_to_hub=True, hub_model_id="someone/tiny-scst", hub_token=FAKE_TOKEN, log_level="info",
                       dataloader_pin_memory=False)
    trainer = SCSTTrainer(model=tiny_model("t5"), args=args, reward_funcs="chrf",
                          train_dataset=toy_dataset(tokenizer, sources, targets), processing_class=tokenizer)
    assert hub.created and hub.created[0]["repo_id"] == "someone/tiny-scst"
    trainer.train()
    trainer.push_to_hub(commit_message="End of training", dataset=["toy/copy"], tasks="translation")

    assert len(hub.uploads) == 1
    upload = hub.uploads[0]
    assert upload["repo_id"] == "someone/tiny-scst" and upload["folder_path"] == str(out)
    assert upload["token"] == FAKE_TOKEN  # handed to the client, which needs it ...
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer_config.json", "README.md"):
        assert name in upload["files"], sorted(upload["files"])
    card = upload["files"]["README.md"].decode()
    meta = front_matter(card)
    assert meta["pipeline_tag"] == "translation" and meta["datasets"] == ["toy/copy"]
    # the reward as reward_funcs names it, not the callable it became (`chrf_reward`)
    assert "- Algorithm: SCST" in card and "- Reward: `chrf`" in card and "- Baseline: `greedy`" in card
    assert "rl/reward" in card  # the training curve
    # ... and appears nowhere else: not in the card, the uploaded files, the output dir or the logs
    for name, content in upload["files"].items():
        assert FAKE_TOKEN.encode() not in content, name
    captured = capfd.readouterr()
    assert "Saving model checkpoint" in captured.err + caplog.text  # the logs were captured (log_level info)
    assert_no_token_anywhere(out, card, captured.out, captured.err, caplog.text)


@pytest.fixture
def restore_verbosity():
    level = transformers.utils.logging.get_verbosity()
    yield
    transformers.utils.logging.set_verbosity(level)


def test_pipeline_push_to_hub(tmp_path, hub, capfd, caplog, monkeypatch, restore_verbosity):
    from hf_seqrl.cli.train import train_main

    monkeypatch.chdir(REPO)
    out = tmp_path / "pushed"
    metrics = train_main([
        "--config", "recipes/configs/tiny_offline_translation.yaml", "--output_dir", str(out),
        "--max_steps", "2", "--warmup_xe_steps", "1", "--num_samples", "2", "--tiny_d_model", "32",
        "--eval_strategy", "no", "--max_eval_samples", "4", "--max_test_samples", "4",
        "--push_to_hub", "true", "--hub_model_id", "someone/tiny-pipeline", "--hub_token", FAKE_TOKEN,
        "--log_level", "info",
    ])
    assert "test_bleu" in metrics
    assert [u["repo_id"] for u in hub.uploads] == ["someone/tiny-pipeline"]
    files = hub.uploads[0]["files"]
    assert {"model.safetensors", "README.md", "all_results.json"} <= set(files)
    card = files["README.md"].decode()
    assert front_matter(card)["pipeline_tag"] == "translation"
    # the recipe runs the SCST trainer with the leave-one-out baseline: the card names what ran
    assert "- Algorithm: REINFORCE with leave-one-out baseline" in card and "| `eval_chrf` |" in card
    assert "rloo" in front_matter(card)["tags"] and "- Algorithm: SCST" not in card
    captured = capfd.readouterr()
    assert "Saving model checkpoint" in captured.err + caplog.text
    assert_no_token_anywhere(out, card, captured.out, captured.err, caplog.text)


def test_card_settings_keep_token_counts_but_drop_credentials():
    from hf_seqrl.hub import final_eval_metrics, render_model_card

    card = render_model_card(model_name="m", method=method_of("SCST"), settings={"max_new_tokens": 64, "hub_token": "abc"},
                             metrics=final_eval_metrics([{"eval_bleu": 1.0}, {"test_bleu": 2.0, "test_runtime": 3}]))
    assert "`max_new_tokens` | `64`" in card and "hub_token" not in card
    assert "`eval_bleu` | 1" in card and "`test_bleu` | 2" in card and "test_runtime" not in card


# ---- packaging -----------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_built_wheel_carries_the_template_and_renders_cards(tmp_path):
    # Build from a copy: an in-tree build writes build/ and *.egg-info into the checkout, and a stale build/lib
    # could hand the wheel files the checkout no longer has. The copy keeps hf_seqrl/model_cards a link.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("hf_seqrl", "model_cards"):
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    # a project URL set in setup.cfg must reach the card through the installed metadata
    setup_cfg = (src / "setup.cfg").read_text()
    url = "url = https://example.org/hf-seqrl\n"
    (src / "setup.cfg").write_text(setup_cfg.replace("[metadata]\n", "[metadata]\n" + url, 1))

    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "dist"),
                          str(src)], check=True, capture_output=True, text=True)
    (wheel,) = (tmp_path / "dist").glob("hf_seqrl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert "hf_seqrl/model_cards/seqrl.md" in archive.namelist()
    site = tmp_path / "site"
    subprocess.run(pip + ["install", "--no-deps", "--no-index", "--target", str(site), str(wheel)], check=True,
                   capture_output=True, text=True)

    script = (
        "import hf_seqrl.hub as hub\n"
        "from hf_seqrl.objectives.policy_gradient import policy_gradient_method\n"
        "print(hub.__file__)\n"
        "print(hub.render_model_card(model_name='m', method=policy_gradient_method('mean'), reward='chrf_reward',\n"
        "      settings={'num_samples': 4}, metrics={'eval_chrf': 40.0}, curve=[('rl/reward', 0.1, 0.3)]))\n"
    )
    # PYTHONPATH names only the installed copy, and the working directory is outside the checkout
    env = dict(os.environ, PYTHONPATH=str(site))
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, check=True, capture_output=True,
                         text=True)
    module_path, card = run.stdout.split("\n", 1)
    assert Path(module_path).resolve().is_relative_to(site.resolve())
    assert "rloo" in front_matter(card)["tags"]
    assert "- Algorithm: REINFORCE with leave-one-out baseline" in card and "SCST" not in card
    assert "| `num_samples` | `4` |" in card and "| `eval_chrf` | 40 |" in card and "| `rl/reward` |" in card
    assert "## How to use" in card and "## Framework versions" in card and "@inproceedings{kool2019buy4," in card
    assert "using [hf-seqrl](https://example.org/hf-seqrl)," in card


def test_card_names_the_local_folder_a_model_came_from_and_how_to_load_an_adapter(tmp_path):
    card = render_model_card(model_name="m", method=method_of("SCST"), base_model=str(tmp_path), adapter=True)
    assert f"starting from the local folder `{tmp_path}`" in card and "built from its config" not in card
    assert "base_model" not in front_matter(card)  # the metadata names Hub ids only
    assert f'base = AutoModelForSeq2SeqLM.from_pretrained("{tmp_path}")' in card
    assert 'PeftModel.from_pretrained(base, "m")' in card


def test_card_without_a_task_claims_none():
    seq2seq = render_model_card(model_name="m", method=method_of("SCST"), reward="chrf")
    meta = front_matter(seq2seq)
    assert "pipeline_tag" not in meta and "translation" not in seq2seq.lower()
    assert "\nEncoder-decoder model fine-tuned with" in seq2seq and "Ein Hund" not in seq2seq
    causal = render_model_card(model_name="m", method=method_of("SCST"), model_class="AutoModelForCausalLM")
    assert front_matter(causal)["pipeline_tag"] == "text-generation" and "\nDecoder-only model fine-tuned" in causal
    # the model-index still needs a task: the generic one, not a removed pipeline's
    results = render_model_card(model_name="m", method=method_of("SCST"), datasets=["wmt/wmt16"],
                                metrics={"eval_bleu": 3.0})
    assert [r.task_type for r in ModelCard(results).data.eval_results] == ["text-generation"]


def test_card_of_a_warm_started_model_names_its_encoder_and_decoder(tmp_path):
    card = render_model_card(model_name="m", method=method_of("SCST"),
                             warm_start=("google-bert/bert-base-cased", str(tmp_path)))
    assert ("warm-started from [`google-bert/bert-base-cased`](https://huggingface.co/google-bert/bert-base-cased) "
            f"(encoder) and `{tmp_path}` (decoder)") in card
    assert "built from its config" not in card
    assert front_matter(card)["base_model"] == "google-bert/bert-base-cased"  # Hub ids only


def test_causal_card_prompts_as_the_tokenizer_trained():
    card = render_model_card(model_name="m", method=method_of("SCST"), model_class="AutoModelForCausalLM",
                             example_input="<|user|>abc=", prompt_special_tokens=False, max_new_tokens=16)
    assert "prompt = '<|user|>abc='" in card and "add_special_tokens=False" in card
    assert "max_new_tokens=16" in card and 'completion = outputs[0, inputs["input_ids"].shape[1]:]' in card
    trimmed = render_model_card(model_name="m", method=method_of("SCST"), model_class="AutoModelForCausalLM",
                                example_input="abc=", prompt_ends_with_eos=True)
    assert "value[:, :-1]" in trimmed and "add_special_tokens" not in trimmed


def test_reward_label_names_the_rewards_as_given():
    from hf_seqrl.hub import reward_label

    def overlap(predictions, references, sources=None):
        return [0.0] * len(predictions)

    assert reward_label("rougeL") == "rougeL"
    assert reward_label(["bleu", overlap]) == "0.5*bleu + 0.5*overlap"
    assert reward_label(["bleu"], [2.0]) == "2*bleu"
