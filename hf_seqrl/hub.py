"""Model cards: `huggingface_hub.ModelCard`s rendered from the template in `model_cards/`, written on save and pushed
with the model. The card names the algorithm that actually ran (`describe_algorithm`), which for a policy-gradient
trainer depends on its baseline, and links only to the papers and to the project URL the installed package declares.
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path
from typing import Any

PROJECT = "hf-seqrl"
# `hf_seqrl/model_cards` links to the top-level `model_cards/`, so a checkout and an installed wheel read the same file.
TEMPLATE_DIR = Path(__file__).resolve().parent / "model_cards"
TEMPLATE = "seqrl.md"

# Papers a card may cite: `cite` is the in-text form, `url` a stable address of the paper (DOI, arXiv, ACL Anthology,
# OpenReview), `bibtex` the entry shown under "Citation".
REFERENCES = {
    "rennie2017scst": dict(cite="Rennie et al., 2017", url="https://arxiv.org/abs/1612.00563", bibtex="""\
@inproceedings{rennie2017scst,
  title     = {Self-critical Sequence Training for Image Captioning},
  author    = {Rennie, Steven J. and Marcheret, Etienne and Mroueh, Youssef and Ross, Jerret and Goel, Vaibhava},
  booktitle = {IEEE Conference on Computer Vision and Pattern Recognition (CVPR)},
  year      = {2017},
  url       = {https://arxiv.org/abs/1612.00563}
}"""),
    "williams1992reinforce": dict(cite="Williams, 1992", url="https://doi.org/10.1007/BF00992696", bibtex="""\
@article{williams1992reinforce,
  title   = {Simple statistical gradient-following algorithms for connectionist reinforcement learning},
  author  = {Williams, Ronald J.},
  journal = {Machine Learning},
  volume  = {8},
  pages   = {229--256},
  year    = {1992},
  doi     = {10.1007/BF00992696}
}"""),
    "kool2019buy4": dict(cite="Kool, van Hoof & Welling, 2019", url="https://openreview.net/forum?id=r1lgTGL5DE",
                         bibtex="""\
@inproceedings{kool2019buy4,
  title     = {Buy 4 {REINFORCE} Samples, Get a Baseline for Free!},
  author    = {Kool, Wouter and van Hoof, Herke and Welling, Max},
  booktitle = {ICLR 2019 Workshop on Deep Reinforcement Learning Meets Structured Prediction},
  year      = {2019},
  url       = {https://openreview.net/forum?id=r1lgTGL5DE}
}"""),
    "bengio2015scheduled": dict(cite="Bengio et al., 2015", url="https://arxiv.org/abs/1506.03099", bibtex="""\
@inproceedings{bengio2015scheduled,
  title     = {Scheduled Sampling for Sequence Prediction with Recurrent Neural Networks},
  author    = {Bengio, Samy and Vinyals, Oriol and Jaitly, Navdeep and Shazeer, Noam},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year      = {2015},
  url       = {https://arxiv.org/abs/1506.03099}
}"""),
    "mihaylova2019scheduled": dict(cite="Mihaylova & Martins, 2019", url="https://aclanthology.org/P19-2049/",
                                   bibtex="""\
@inproceedings{mihaylova2019scheduled,
  title     = {Scheduled Sampling for Transformers},
  author    = {Mihaylova, Tsvetomila and Martins, Andr{\\'e} F. T.},
  booktitle = {Proceedings of the 57th Annual Meeting of the ACL: Student Research Workshop},
  year      = {2019},
  url       = {https://aclanthology.org/P19-2049/}
}"""),
    "shen2016mrt": dict(cite="Shen et al., 2016", url="https://aclanthology.org/P16-1159/", bibtex="""\
@inproceedings{shen2016mrt,
  title     = {Minimum Risk Training for Neural Machine Translation},
  author    = {Shen, Shiqi and Cheng, Yong and He, Zhongjun and He, Wei and Wu, Hua and Sun, Maosong and Liu, Yang},
  booktitle = {Proceedings of the 54th Annual Meeting of the ACL},
  year      = {2016},
  url       = {https://aclanthology.org/P16-1159/}
}"""),
    "lamb2016professor": dict(cite="Lamb et al., 2016", url="https://arxiv.org/abs/1610.09038", bibtex="""\
@inproceedings{lamb2016professor,
  title     = {Professor Forcing: A New Algorithm for Training Recurrent Networks},
  author    = {Lamb, Alex and Goyal, Anirudh and Zhang, Ying and Zhang, Saizheng and Courville, Aaron and
               Bengio, Yoshua},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year      = {2016},
  url       = {https://arxiv.org/abs/1610.09038}
}"""),
    "chen2024diffusion": dict(cite="Chen et al., 2024", url="https://arxiv.org/abs/2407.01392", bibtex="""\
@inproceedings{chen2024diffusion,
  title     = {Diffusion Forcing: Next-token Prediction Meets Full-Sequence Diffusion},
  author    = {Chen, Boyuan and Mart{\\'i} Mons{\\'o}, Diego and Du, Yilun and Simchowitz, Max and Tedrake, Russ and
               Sitzmann, Vincent},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year      = {2024},
  url       = {https://arxiv.org/abs/2407.01392}
}"""),
    "ranzato2016mixer": dict(cite="Ranzato et al., 2016", url="https://arxiv.org/abs/1511.06732", bibtex="""\
@inproceedings{ranzato2016mixer,
  title     = {Sequence Level Training with Recurrent Neural Networks},
  author    = {Ranzato, Marc'Aurelio and Chopra, Sumit and Auli, Michael and Zaremba, Wojciech},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year      = {2016},
  url       = {https://arxiv.org/abs/1511.06732}
}"""),
}

# Trainer labels (`SeqTrainerBase.algorithm`) whose loss is a policy gradient, with the baseline each uses when
# `SeqRLConfig.baseline` is None; the baseline, not the label, decides which algorithm ran.
POLICY_GRADIENT_DEFAULT_BASELINE = {"SCST": "greedy", "REINFORCE": "moving_average", "Sequence-level RL": "greedy"}
POLICY_GRADIENT = {
    "greedy": dict(name="SCST", slug="scst", citations=["rennie2017scst"],
                   description="self-critical sequence training: policy gradient with the greedy decode's reward "
                               "as baseline"),
    "mean": dict(name="REINFORCE with leave-one-out baseline", slug="rloo",
                 citations=["williams1992reinforce", "kool2019buy4"],
                 description="policy gradient over several samples per source; each sample's baseline is the mean "
                             "reward of the other samples of its source"),
    "moving_average": dict(name="REINFORCE with a moving-average baseline", slug="reinforce",
                           citations=["williams1992reinforce"],
                           description="policy gradient; the baseline is an exponential moving average of the "
                                       "batch-mean reward"),
    "none": dict(name="REINFORCE without baseline", slug="reinforce", citations=["williams1992reinforce"],
                 description="policy gradient on the raw sequence rewards"),
}
OTHER_ALGORITHMS = {
    "Scheduled sampling": dict(name="Scheduled sampling", slug="scheduled-sampling",
                               citations=["bengio2015scheduled", "mihaylova2019scheduled"],
                               description="cross-entropy on decoder inputs that mix gold tokens with the model's own "
                                           "predictions, the gold share following a schedule"),
    "Cross-entropy": dict(name="Cross-entropy", slug="cross-entropy", citations=[],
                          description="maximum likelihood with teacher forcing"),
    "MRT": dict(name="Minimum risk training", slug="mrt", citations=["shen2016mrt"],
                description="the expected cost 1 - reward under the model's alpha-sharpened distribution over each "
                            "source's candidate set"),
    "Professor forcing": dict(name="Professor forcing", slug="professor-forcing", citations=["lamb2016professor"],
                              description="cross-entropy plus an adversarial loss that makes the decoder's "
                                          "free-running hidden states look teacher-forced to a discriminator"),
    "Prefix corruption": dict(name="Prefix corruption", slug="prefix-corruption", citations=[],
                              description="teacher forcing on decoder inputs whose tokens are replaced, with a "
                                          "probability, by random tokens or the model's own predictions"),
    "Noise-level forcing": dict(name="Noise-level forcing", slug="noise-level-forcing",
                                citations=["chen2024diffusion"],
                                description="teacher forcing on decoder inputs corrupted at an independent noise "
                                            "level per token"),
    "k-step rollout": dict(name="k-step rollout", slug="k-step-rollout", citations=[],
                           description="cross-entropy of the gold tokens after the model ran on its own outputs "
                                       "for up to k steps from gold anchors"),
    "MIXER": dict(name="MIXER", slug="mixer", citations=["ranzato2016mixer"],
                  description="cross-entropy on the first tokens of each target and REINFORCE on the sampled rest, "
                              "the sampled part growing over training"),
}

PIPELINES = {"translation": "translation", "summarization": "summarization"}
PIPELINE_VARIABLES = {"translation": "translator", "summarization": "summarizer"}
EXAMPLE_INPUTS = {"translation": "Ein Hund läuft im Park."}
# Settings shown on the card; anything that could hold a credential is never read.
CARD_SETTINGS = ("reward", "reward_weights", "baseline", "num_samples", "warmup_xe_steps", "rl_weight",
                 "temperature", "top_k", "top_p", "max_new_tokens", "length_normalize", "entropy_coef", "kl_coef",
                 "center_advantages", "scale_rewards", "schedule", "schedule_k", "min_teacher_forcing_ratio",
                 "sampling", "num_iterations", "epsilon", "epsilon_high", "loss_normalization", "mrt_alpha",
                 "mrt_include_greedy", "mrt_include_reference", "adversarial_weight", "discriminator",
                 "free_running", "corruption_rate", "replacement", "per_token_levels", "rollout_steps",
                 "rollout_sampling", "rollout_context", "mixer_delta", "mixer_increment_steps", "learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps",
                 "max_steps", "num_train_epochs", "seed", "bf16", "fp16")
SECRET_PATTERN = re.compile(r"(hf_[A-Za-z0-9]{20,}|api[_-]?key|token|secret|password)", re.IGNORECASE)
# Setting names that hold credentials (`hub_token`), not ones that merely mention tokens (`max_new_tokens`).
SECRET_KEY = re.compile(r"(^|_)(token|secret|password|api_key)$", re.IGNORECASE)
# A Hub dataset id (`wmt16`, `wmt/wmt16`); model-index results need one, a free-text description cannot serve.
HUB_DATASET_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
EVAL_SPLITS = {"eval_": "validation", "test_": "test"}


def describe_algorithm(algorithm: str, baseline: str | None = None) -> dict[str, Any]:
    """Returns `name`, `slug` (a tag), `description` (loss and baseline), `baseline` (the one that ran, None
    without policy gradient) and `citations` (keys of `REFERENCES`) of the algorithm that ran.

    `algorithm` is the trainer's label (`"SCST"`, `"REINFORCE"`, `"Scheduled sampling"`, `"Cross-entropy"`),
    `baseline` the baseline it used (`"greedy"`, `"mean"`, `"moving_average"`, `"none"`; None or `"None"` for
    trainers without one, and for a policy-gradient trainer's default).

    A policy-gradient trainer is named after its baseline: the SCST trainer with the leave-one-out baseline is
    REINFORCE with leave-one-out baseline, not SCST, and any policy gradient with the greedy baseline is SCST.
    """
    if baseline in (None, "", "None"):
        baseline = None
    if algorithm in POLICY_GRADIENT_DEFAULT_BASELINE:
        baseline = baseline or POLICY_GRADIENT_DEFAULT_BASELINE[algorithm]
        if baseline in POLICY_GRADIENT:
            return dict(POLICY_GRADIENT[baseline], baseline=baseline,
                        citations=list(POLICY_GRADIENT[baseline]["citations"]))
        # A baseline added to the trainers before it is described here still gets an honest, generic name.
        return dict(name=f"REINFORCE with a {baseline} baseline", slug="reinforce",
                    description=f"policy gradient with the `{baseline}` baseline", baseline=baseline,
                    citations=["williams1992reinforce"])
    if algorithm in OTHER_ALGORITHMS:
        return dict(OTHER_ALGORITHMS[algorithm], baseline=None,
                    citations=list(OTHER_ALGORITHMS[algorithm]["citations"]))
    return dict(name=algorithm, slug=slug(algorithm), description="", baseline=None, citations=[])


def slug(text: str) -> str:
    """Returns `text` lower-cased with every run of other characters than letters and digits replaced by `-`."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def project_url() -> str | None:
    """Returns the home page the installed hf-seqrl declares (`Home-page`, else the first `Project-URL`), or None."""
    try:
        meta = metadata.metadata(PROJECT)
    except metadata.PackageNotFoundError:
        return None
    home = (meta.get("Home-page") or "").strip()
    if home and home.upper() != "UNKNOWN":
        return home
    for entry in meta.get_all("Project-URL") or []:
        # "Homepage, https://..." — the label may itself contain commas, the URL never starts with a space
        url = entry.rsplit(", ", 1)[-1].strip()
        if url.startswith(("https://", "http://")):
            return url
    return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def library_versions() -> list[tuple[str, str]]:
    """Returns (package, version) of hf-seqrl and the libraries it builds on that are installed."""
    names = (PROJECT, "transformers", "torch", "datasets", "accelerate", "sacrebleu", "rouge-score", "huggingface_hub")
    return [(name, _version(name)) for name in names if _version(name)]


def _safe(value: Any) -> str:
    text = str(value)
    return "<redacted>" if SECRET_PATTERN.search(text) else text


def eval_results(task: str, datasets: list[str], metrics: list[tuple[str, float]]) -> list:
    """Returns `huggingface_hub.EvalResult`s for the model-index: one per `eval_*` / `test_*` metric of the
    (name, value) pairs `metrics` when the model was trained and evaluated on a single Hub dataset, else an empty
    list (results would name no dataset).
    """
    from huggingface_hub import EvalResult

    if len(datasets) != 1 or not HUB_DATASET_ID.match(datasets[0]):
        return []
    results = []
    for name, value in metrics:
        prefix = next((p for p in EVAL_SPLITS if name.startswith(p)), None)
        if prefix is None:
            continue
        results.append(EvalResult(task_type=PIPELINES.get(task, "text2text-generation"), dataset_type=datasets[0],
                                  dataset_name=datasets[0], dataset_split=EVAL_SPLITS[prefix],
                                  metric_type=name[len(prefix):], metric_value=value))
    return results


def render_model_card(
    *,
    model_name: str,
    algorithm: str,
    task: str = "translation",
    base_model: str | None = None,
    datasets: list[str] | None = None,
    reward: str = "",
    baseline: str | None = "",
    settings: dict[str, Any] | None = None,
    metrics: dict[str, float] | None = None,
    curve: list[tuple[str, float, float]] | None = None,
    repo_id: str | None = None,
    example_input: str | None = None,
    algorithm_detail: str | None = None,
    license: str | None = None,
    model_class: str = "AutoModelForSeq2SeqLM",
) -> str:
    """Returns the markdown model card (YAML metadata + body) for a model trained with hf-seqrl.

    `algorithm` is the trainer's label and `baseline` the baseline that ran; the card names the algorithm they make
    up (see `describe_algorithm`). `algorithm_detail` is appended to that name; `license` (an SPDX id such as
    `"apache-2.0"`) goes into the metadata when known. `model_class` is the transformers Auto class that loads the
    model (`"AutoModelForCausalLM"` for a decoder-only model: its card shows a text-generation pipeline).
    """
    from huggingface_hub import ModelCard, ModelCardData

    method = describe_algorithm(algorithm, baseline)
    causal = model_class == "AutoModelForCausalLM"
    pipeline_tag = "text-generation" if causal else PIPELINES.get(task, "text2text-generation")
    datasets = list(datasets or [])
    base_model = hub_id(base_model)
    metrics = sorted((k, float(v)) for k, v in (metrics or {}).items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool))
    results = eval_results(task, datasets, metrics)
    # The metadata lists Hub dataset ids only; a free-text description of the data stays in the body.
    hub_datasets = [d for d in datasets if HUB_DATASET_ID.match(d)]
    card_data = ModelCardData(
        library_name="transformers", pipeline_tag=pipeline_tag, license=license or None,
        tags=list(dict.fromkeys([PROJECT, method["slug"], "sequence-level-training", task])),
        base_model=base_model, datasets=hub_datasets or None,
        eval_results=results or None, model_name=model_name if results else None,
    )
    settings = {k: v for k, v in (settings or {}).items() if not SECRET_KEY.search(k)}
    card = ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE_DIR / TEMPLATE),
        model_name=model_name,
        method=method,
        algorithm_detail=algorithm_detail,
        references=[dict(REFERENCES[key], key=key) for key in method["citations"]],
        project=PROJECT,
        project_url=project_url(),
        project_version=_version(PROJECT) or "unknown",
        task=task,
        pipeline_tag=pipeline_tag,
        pipeline_var=PIPELINE_VARIABLES.get(pipeline_tag, "generator"),
        model_class=model_class,
        causal=causal,
        base_model=base_model,
        datasets=datasets,
        reward=_safe(reward),
        settings=[(k, _safe(v)) for k, v in settings.items()],
        metrics=metrics,
        curve=curve or [],
        repo_id=repo_id or model_name,
        example_input=example_input or EXAMPLE_INPUTS.get(task, "Your long text."),
        versions=library_versions(),
    )
    text = str(card)
    return text if text.endswith("\n") else text + "\n"


def hub_id(name: str | None) -> str | None:
    """Returns `name` if it looks like a Hub repo id, None for local paths and models built from a config."""
    if not name or os.path.isabs(name) or name.startswith((".", "~")) or os.path.isdir(name):
        return None
    return name


def write_model_card(output_dir: str, **info: Any) -> str:
    """Renders the card (see `render_model_card`) into `output_dir/README.md` and returns its path."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "README.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_model_card(**info))
    return path


def training_curve(log_history: list[dict], names=("rl/reward", "loss")) -> list[tuple[str, float, float]]:
    """Returns (metric, first logged value, last logged value) for the training metrics present in a log history."""
    curve = []
    for name in names:
        values = [h[name] for h in log_history if name in h]
        if values:
            curve.append((name, float(values[0]), float(values[-1])))
    return curve


def final_eval_metrics(log_history: list[dict], prefixes=("eval_", "test_")) -> dict[str, float]:
    """Returns the last logged metrics of each evaluation prefix (`eval_`, `test_`), runtime figures left out."""
    merged = {}
    for prefix in prefixes:
        for entry in reversed(log_history):
            metrics = {k: v for k, v in entry.items() if k.startswith(prefix) and "runtime" not in k
                       and "per_second" not in k}
            if metrics:
                merged.update(metrics)
                break
    return merged
