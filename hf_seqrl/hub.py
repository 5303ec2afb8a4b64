"""Model cards: rendered from the templates in `model_cards/`, written on save and pushed with the model."""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path
from typing import Any

TEMPLATE_DIR = Path(__file__).resolve().parent / "model_cards"

BIBTEX = {
    "SCST": """@inproceedings{rennie2017scst,
  title     = {Self-critical Sequence Training for Image Captioning},
  author    = {Rennie, Steven J. and Marcheret, Etienne and Mroueh, Youssef and Ross, Jerret and Goel, Vaibhava},
  booktitle = {CVPR},
  year      = {2017}
}""",
    "REINFORCE": """@article{williams1992reinforce,
  title   = {Simple statistical gradient-following algorithms for connectionist reinforcement learning},
  author  = {Williams, Ronald J.},
  journal = {Machine Learning},
  volume  = {8},
  pages   = {229--256},
  year    = {1992}
}""",
    "Scheduled sampling": """@inproceedings{mihaylova2019scheduled,
  title     = {Scheduled Sampling for Transformers},
  author    = {Mihaylova, Tsvetomila and Martins, Andr{\\'e} F. T.},
  booktitle = {ACL Student Research Workshop},
  year      = {2019}
}""",
    "Cross-entropy": "",
}

PIPELINES = {"translation": "translation", "summarization": "summarization"}
# Settings shown on the card; anything that could hold a credential is never read.
CARD_SETTINGS = ("reward", "reward_weights", "baseline", "num_samples", "warmup_xe_steps", "rl_weight",
                 "temperature", "top_k", "top_p", "max_new_tokens", "length_normalize", "entropy_coef", "kl_coef",
                 "center_advantages", "scale_rewards", "schedule", "schedule_k", "min_teacher_forcing_ratio",
                 "sampling", "learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps",
                 "max_steps", "num_train_epochs", "seed", "bf16", "fp16")
SECRET_PATTERN = re.compile(r"(hf_[A-Za-z0-9]{20,}|api[_-]?key|token|secret|password)", re.IGNORECASE)
# Setting names that hold credentials (`hub_token`), not ones that merely mention tokens (`max_new_tokens`).
SECRET_KEY = re.compile(r"(^|_)(token|secret|password|api_key)$", re.IGNORECASE)


def library_versions() -> list[tuple[str, str]]:
    """Returns (package, version) of hf-seqrl and the libraries it builds on."""
    out = []
    for name in ("hf-seqrl", "transformers", "torch", "datasets", "accelerate", "sacrebleu", "rouge-score"):
        try:
            out.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            continue
    return out


def _safe(value: Any) -> str:
    text = str(value)
    return "<redacted>" if SECRET_PATTERN.search(text) else text


def render_model_card(
    *,
    model_name: str,
    algorithm: str,
    task: str = "translation",
    base_model: str | None = None,
    datasets: list[str] | None = None,
    reward: str = "",
    baseline: str = "",
    settings: dict[str, Any] | None = None,
    metrics: dict[str, float] | None = None,
    curve: list[tuple[str, float, float]] | None = None,
    repo_id: str | None = None,
    example_input: str | None = None,
    algorithm_detail: str | None = None,
) -> str:
    """Returns the markdown model card (YAML front matter + body) for a model trained with hf-seqrl."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(loader=FileSystemLoader(str(TEMPLATE_DIR)), undefined=StrictUndefined,
                      keep_trailing_newline=True)
    pipeline_tag = PIPELINES.get(task, "text2text-generation")
    settings = {k: v for k, v in (settings or {}).items() if not SECRET_KEY.search(k)}
    return env.get_template("seqrl.md").render(
        model_name=model_name,
        algorithm=algorithm,
        algorithm_tag=algorithm.lower().replace(" ", "-"),
        algorithm_detail=algorithm_detail,
        task=task,
        pipeline_tag=pipeline_tag,
        pipeline_var="translator" if pipeline_tag == "translation" else "summarizer"
        if pipeline_tag == "summarization" else "generator",
        base_model=hub_id(base_model),
        datasets=datasets or [],
        extra_tags=[task],
        reward=_safe(reward),
        baseline=baseline,
        settings=[(k, _safe(v)) for k, v in settings.items()],
        metrics=sorted((k, float(v)) for k, v in (metrics or {}).items() if isinstance(v, (int, float))),
        curve=curve or [],
        repo_id=repo_id or model_name,
        example_input=example_input or ("Ein Hund läuft im Park." if task == "translation" else "Your long text."),
        versions=library_versions(),
        method_bibtex=BIBTEX.get(algorithm, ""),
    )


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
