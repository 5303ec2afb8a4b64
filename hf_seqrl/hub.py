"""Model cards: `huggingface_hub.ModelCard`s rendered from the template in `model_cards/`, written on save and pushed
with the model. The card names the algorithm that actually ran (a `Method`, from the trainer: for a policy-gradient
trainer it depends on the baseline), shows the settings that differ from their defaults (`card_settings`), and links
only to the papers and to the project URL the installed package declares.
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path
from dataclasses import dataclass
from typing import Any

PROJECT = "hf-seqrl"
# `hf_seqrl/model_cards` links to the top-level `model_cards/`, so a checkout and an installed wheel read the same file.
TEMPLATE_DIR = Path(__file__).resolve().parent / "model_cards"
TEMPLATE = "seqrl.md"

# What a card says of a method: its name, tag, one-line description, the baseline that ran (policy gradients) and
# the papers it cites. Each trainer class carries its own (`SeqRLBaseTrainer.method`, as TRL's `_name` / `_paper`).


@dataclass(frozen=True)
class Paper:
    """A paper a card cites: `key` (its BibTeX key), `cite` (the in-text form), `title`, `url` (a stable address:
    DOI, arXiv, ACL Anthology, OpenReview) and `citation` (the BibTeX entry shown under "Citation")."""

    key: str
    cite: str
    title: str
    url: str
    citation: str


@dataclass(frozen=True)
class Method:
    """The algorithm a card names: `name`, `tag` (a Hub tag), `description` (loss and baseline), `papers`, and
    `baseline` (the baseline that ran; None without a policy gradient)."""

    name: str
    tag: str
    description: str = ""
    papers: tuple[Paper, ...] = ()
    baseline: str | None = None


PIPELINES = {"translation": "translation", "summarization": "summarization"}
PIPELINE_VARIABLES = {"translation": "translator", "summarization": "summarizer"}
EXAMPLE_INPUTS = {"translation": "Ein Hund läuft im Park."}
# The `TrainingArguments` fields that say how the optimization ran, shown on every card next to the hf-seqrl fields
# that differ from their defaults.
TRAINING_SETTINGS = ("learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "max_steps",
                     "num_train_epochs", "seed", "bf16", "fp16")
SECRET_PATTERN = re.compile(r"(hf_[A-Za-z0-9]{20,}|api[_-]?key|token|secret|password)", re.IGNORECASE)
# Setting names that hold credentials (`hub_token`), not ones that merely mention tokens (`max_new_tokens`).
SECRET_KEY = re.compile(r"(^|_)(token|secret|password|api_key)$", re.IGNORECASE)
# A Hub dataset id (`wmt16`, `wmt/wmt16`); model-index results need one, a free-text description cannot serve.
HUB_DATASET_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
EVAL_SPLITS = {"eval_": "validation", "test_": "test"}


def card_settings(args) -> dict[str, Any]:
    """Returns the settings a card shows of a trainer's `args`: `TRAINING_SETTINGS`, then every field declared by a
    config class outside transformers (the hf-seqrl configs, a user's subclass) whose value differs from its default.
    Fields that hold credentials are left out (`SECRET_KEY`)."""
    settings = {name: getattr(args, name) for name in TRAINING_SETTINGS if hasattr(args, name)}
    own = [name for cls in reversed(type(args).__mro__) if not cls.__module__.startswith("transformers")
           for name in vars(cls).get("__annotations__", {})]
    fields = getattr(type(args), "__dataclass_fields__", {})
    for name in dict.fromkeys(own):
        if name not in fields or SECRET_KEY.search(name):
            continue
        default = fields[name].default_factory() if callable(fields[name].default_factory) else fields[name].default
        value = getattr(args, name)
        if value != default:
            settings[name] = value
    return settings


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
    method: Method,
    task: str = "translation",
    base_model: str | None = None,
    datasets: list[str] | None = None,
    reward: str = "",
    settings: dict[str, Any] | None = None,
    metrics: dict[str, float] | None = None,
    curve: list[tuple[str, float, float]] | None = None,
    repo_id: str | None = None,
    example_input: str | None = None,
    algorithm_detail: str | None = None,
    license: str | None = None,
    model_class: str = "AutoModelForSeq2SeqLM",
    adapter: bool = False,
) -> str:
    """Returns the markdown model card (YAML metadata + body) for a model trained with hf-seqrl.

    `method` is the algorithm that ran (`trainer.run_method()`, or `TrainerClass.method_for(baseline)`).
    `algorithm_detail` is appended to its name; `license` (an SPDX id such as
    `"apache-2.0"`) goes into the metadata when known. `model_class` is the transformers Auto class that loads the
    model (`"AutoModelForCausalLM"` for a decoder-only model: its card shows a text-generation pipeline); `adapter`: the
    saved weights are a PEFT adapter of `base_model` (a Hub id or a local folder), loaded with `PeftModel`.
    """
    from huggingface_hub import ModelCard, ModelCardData

    causal = model_class == "AutoModelForCausalLM"
    pipeline_tag = "text-generation" if causal else PIPELINES.get(task, "text2text-generation")
    datasets = list(datasets or [])
    base_path = base_model if base_model and hub_id(base_model) is None else None  # a local folder
    base_model = hub_id(base_model)
    metrics = sorted((k, float(v)) for k, v in (metrics or {}).items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool))
    results = eval_results(task, datasets, metrics)
    # The metadata lists Hub dataset ids only; a free-text description of the data stays in the body.
    hub_datasets = [d for d in datasets if HUB_DATASET_ID.match(d)]
    card_data = ModelCardData(
        library_name="transformers", pipeline_tag=pipeline_tag, license=license or None,
        tags=list(dict.fromkeys([PROJECT, method.tag, "sequence-level-training", task])),
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
        references=[dict(key=p.key, cite=p.cite, url=p.url, bibtex=p.citation) for p in method.papers],
        project=PROJECT,
        project_url=project_url(),
        project_version=_version(PROJECT) or "unknown",
        task=task,
        pipeline_tag=pipeline_tag,
        pipeline_var=PIPELINE_VARIABLES.get(pipeline_tag, "generator"),
        model_class=model_class,
        causal=causal,
        base_model=base_model,
        base_path=base_path,
        adapter=adapter,
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
