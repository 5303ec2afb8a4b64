"""Model cards: `huggingface_hub.ModelCard`s rendered from the template in `model_cards/`, written on save and pushed
with the model. The card names the algorithm that actually ran (a `Method`, from the trainer: for a policy-gradient
trainer it depends on the baseline), the rewards as the user named them (`reward_label`), the settings that applied
(`card_settings`), and links only to the papers and to the project URL the installed package declares. Its "How to
use" code loads the model (or the adapter and the base it needs) and calls `generate`: transformers 5 has no
translation or summarization pipeline, and tests execute that code.
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path
from typing import Any

from .papers import Method

PROJECT = "hf-seqrl"
# `hf_seqrl/model_cards` links to the top-level `model_cards/`, so a checkout and an installed wheel read the same file.
TEMPLATE_DIR = Path(__file__).resolve().parent / "model_cards"
TEMPLATE = "seqrl.md"

# The Hub tasks (`pipeline_tag`) a card can claim: the task the config names, text generation for a decoder-only
# model. An encoder-decoder trained for no named task claims none (the Hub's text-generation widget would run it as a
# decoder-only model).
PIPELINE_TAGS = {"translation": "translation", "summarization": "summarization"}
CAUSAL_PIPELINE_TAG = "text-generation"
# What the "How to use" code feeds the model when no evaluation data gives a real input: a placeholder, not a claim.
PLACEHOLDER_INPUT = "Your input text."
# The `TrainingArguments` fields that say how the optimization ran, shown on every card next to the hf-seqrl fields
# that differ from their defaults, each when it applied: `max_steps` overrides the epochs when positive, and the
# mixed-precision flags only say something when set.
TRAINING_SETTINGS = {
    "learning_rate": None, "per_device_train_batch_size": None, "gradient_accumulation_steps": None,
    "max_steps": lambda args: args.max_steps > 0, "num_train_epochs": lambda args: args.max_steps <= 0,
    "seed": None, "bf16": lambda args: args.bf16, "fp16": lambda args: args.fp16,
}
SECRET_PATTERN = re.compile(r"(hf_[A-Za-z0-9]{20,}|api[_-]?key|token|secret|password)", re.IGNORECASE)
# Setting names that hold credentials (`hub_token`), not ones that merely mention tokens (`max_new_tokens`).
SECRET_KEY = re.compile(r"(^|_)(token|secret|password|api_key)$", re.IGNORECASE)
# A Hub dataset id (`wmt16`, `wmt/wmt16`); model-index results need one, a free-text description cannot serve.
HUB_DATASET_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
EVAL_SPLITS = {"eval_": "validation", "test_": "test"}


def card_settings(args, selection: dict[str, Any] | None = None) -> dict[str, Any]:
    """Returns the settings a card shows of a trainer's `args`: the `TRAINING_SETTINGS` that applied (`max_steps` or
    `num_train_epochs`, whichever ended training), then every field declared by a config class outside transformers
    (the hf-seqrl configs, a user's subclass) whose value differs from its default, `generation_selection` as
    `selection` records it when given. Fields that hold credentials are left out (`SECRET_KEY`)."""
    settings = {name: getattr(args, name) for name, applied in TRAINING_SETTINGS.items()
                if hasattr(args, name) and (applied is None or applied(args))}
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
    if selection and "generation_selection" in settings:  # as recorded: rewards by name, the seed that applied
        settings["generation_selection"] = selection
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


def eval_results(task_type: str, datasets: list[str], metrics: list[tuple[str, float]]) -> list:
    """Returns `huggingface_hub.EvalResult`s of the Hub task `task_type` for the model-index: one per `eval_*` /
    `test_*` metric of the (name, value) pairs `metrics` when the model was trained and evaluated on a single Hub
    dataset, else an empty list (results would name no dataset).
    """
    from huggingface_hub import EvalResult

    if len(datasets) != 1 or not HUB_DATASET_ID.match(datasets[0]):
        return []
    results = []
    for name, value in metrics:
        prefix = next((p for p in EVAL_SPLITS if name.startswith(p)), None)
        if prefix is None:
            continue
        results.append(EvalResult(task_type=task_type, dataset_type=datasets[0], dataset_name=datasets[0],
                                  dataset_split=EVAL_SPLITS[prefix], metric_type=name[len(prefix):],
                                  metric_value=value))
    return results


def pipeline_tag_of(task: str | None, causal: bool) -> str | None:
    """Returns the Hub task a card claims: text generation for a decoder-only model, the config's `task` for an
    encoder-decoder (`PIPELINE_TAGS`), None for an encoder-decoder trained for no named task."""
    return CAUSAL_PIPELINE_TAG if causal else PIPELINE_TAGS.get(task or "")


def reward_label(reward_funcs: Any, weights=None) -> str:
    """Returns the reward as a card names it: the names given in `reward_funcs` (a built-in's name as written, a
    callable's or an `evaluate` module's own), weighted as `reward_weights` (or equally) says: `rougeL`,
    `0.5*bleu + 0.5*chrf`."""
    from .rewards.convention import reward_name

    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    names = [reward_name(f) for f in funcs]
    if weights is None:
        if len(names) == 1:
            return names[0]
        weights = [1.0 / len(names)] * len(names)
    if len(names) == 1 and float(weights[0]) == 1.0:
        return names[0]
    return " + ".join(f"{float(w):g}*{n}" for w, n in zip(weights, names))


def chat_prompt_ids(tokenizer, content: str) -> list[int]:
    """Returns the ids of `content` sent as one user message through the tokenizer's chat template, with the
    generation prompt (the prompt a chat-trained model read), without a final EOS."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=False)
    ids = [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
    return ids[:-1] if ids and ids[-1] == tokenizer.eos_token_id else ids


def card_example(dataset, tokenizer, causal: bool, prompt_template: str | None = None,
                 use_chat_template: bool = False) -> dict[str, Any]:
    """Returns the `render_model_card` fields of the "How to use" input: `example_input`, the first source (or prompt)
    of `dataset` (the evaluation data, else the training data; the first split of a dict) as text that tokenizes back
    to the ids the model read, `prompt_special_tokens` and `prompt_ends_with_eos`; no `example_input` without data or
    a tokenizer.

    The text is the row's `sources` entry, else its decoded ids; a causal prompt decoded with its special tokens
    (a chat template's) is tokenized without adding any. A causal prompt that is the row's source (formatted by
    `prompt_template`) sent as a user message through the tokenizer's chat template gives `example_messages`
    instead: the card then builds the prompt with `apply_chat_template`, as training did (`use_chat_template`, or a
    conversational dataset). With `use_chat_template` and no data, the placeholder is such a message.
    """
    if tokenizer is None:
        return {}
    from .models.languages import decode_texts

    fields: dict[str, Any] = {"prompt_ends_with_eos": causal and ends_with_eos(tokenizer, PLACEHOLDER_INPUT)}
    if causal and use_chat_template and getattr(tokenizer, "chat_template", None):
        fields["example_messages"] = [{"role": "user", "content": PLACEHOLDER_INPUT}]
    row = first_row(dataset)
    if not row or "input_ids" not in row:
        return fields
    ids = [int(i) for i in row["input_ids"]]
    mask = [1] * len(ids) if row.get("attention_mask") is None else [int(m) for m in row["attention_mask"]]
    labels = None if not causal or row.get("labels") is None else [int(label) for label in row["labels"]]
    if labels is not None and len(labels) == len(ids):  # prompt + completion: the prompt is what precedes the labels
        ids = ids[:next((i for i, label in enumerate(labels) if label != -100), len(ids))]
    ids = [i for i, keep in zip(ids, mask) if keep]  # causal prompts are left-padded
    source = row.get("sources")
    if causal and isinstance(source, str) and getattr(tokenizer, "chat_template", None):
        for content in dict.fromkeys([prompt_template.format(prompt=source) if prompt_template else source, source]):
            if chat_prompt_ids(tokenizer, content) == ids:
                return dict(example_messages=[{"role": "user", "content": content}], prompt_ends_with_eos=False)
    readings = [(source, True)] if isinstance(source, str) else []
    readings += [(decode_texts(tokenizer, [ids])[0], True)]
    if causal:
        readings += [(tokenizer.decode(ids, skip_special_tokens=False), False)]
    for text, special in readings:
        encoded = [int(i) for i in tokenizer(text, add_special_tokens=special)["input_ids"]]
        trim = causal and special and ends_with_eos(tokenizer, text)
        if (encoded[:-1] if trim else encoded) == ids:
            return dict(example_input=text, prompt_special_tokens=special, prompt_ends_with_eos=trim)
    return {**fields, "example_input": readings[-1][0], "prompt_special_tokens": readings[-1][1]}


def ends_with_eos(tokenizer, text: str) -> bool:
    """Returns True when `tokenizer` ends `text` with its EOS (ByT5, T5): a prompt loses it, its completion follows."""
    ids = tokenizer(text)["input_ids"]
    return bool(ids) and tokenizer.eos_token_id is not None and ids[-1] == tokenizer.eos_token_id


def first_row(dataset) -> dict | None:
    """Returns the first row of `dataset` (a `datasets.Dataset`, an iterable one, or a dict of them), or None."""
    if isinstance(dataset, dict):
        dataset = next(iter(dataset.values()), None)
    if dataset is None:
        return None
    try:
        row = dataset[0] if hasattr(dataset, "__getitem__") else next(iter(dataset))
    except (IndexError, KeyError, StopIteration, TypeError):
        return None
    return dict(row) if isinstance(row, dict) else None


def render_model_card(
    *,
    model_name: str,
    method: Method,
    task: str | None = None,
    base_model: str | None = None,
    datasets: list[str] | None = None,
    reward: str | None = None,
    teacher: str | None = None,
    settings: dict[str, Any] | None = None,
    metrics: dict[str, float] | None = None,
    curve: list[tuple[str, float, float]] | None = None,
    repo_id: str | None = None,
    example_input: str | None = None,
    example_messages: list[dict] | None = None,
    prompt_special_tokens: bool = True,
    prompt_ends_with_eos: bool = False,
    max_new_tokens: int | None = None,
    algorithm_detail: str | None = None,
    license: str | None = None,
    model_class: str = "AutoModelForSeq2SeqLM",
    adapter: bool = False,
    base_class: str | None = None,
    base_subfolder: str | None = None,
    warm_start: tuple[str, str] | None = None,
    selection: dict[str, Any] | None = None,
) -> str:
    """Returns the markdown model card (YAML metadata + body) for a model trained with hf-seqrl.

    `method` is the algorithm that ran (`trainer.method`; a policy gradient's
    `objectives.policy_gradient.policy_gradient_method(baseline)`; cross-entropy, `trainers.services.run_record.CROSS_ENTROPY`,
    for a run that never reached its trainer's own loss). `algorithm_detail` is appended to its name; `reward` (None:
    no reward line) names the reward as the user gave it; `license` (an SPDX id such as `"apache-2.0"`) goes into the
    metadata when known. `task` (`"translation"`, `"summarization"` or None) is what the card says the model does:
    None claims no task. `model_class` is the transformers Auto class that loads the model
    (`"AutoModelForCausalLM"` for a decoder-only model: its code feeds `example_input` as a prompt and prints the
    completion only).

    The "How to use" code generates from `example_input` (a placeholder when None) with the model's generation config,
    `max_new_tokens` added when given; a decoder-only model trained on chat prompts gets `example_messages` (a list of
    `{"role", "content"}`), rendered by `tokenizer.apply_chat_template`. Otherwise a prompt is tokenized with the
    tokenizer's special tokens unless
    `prompt_special_tokens` is False (a prompt written with them, e.g. by a chat template), and loses its final EOS
    when `prompt_ends_with_eos` (tokenizers that end every text with EOS, as training cut it).

    `adapter`: the saved weights are a PEFT adapter of `base_model` (a Hub id or a local folder), loaded with
    `PeftModel`; with `base_subfolder` the base model is saved in that folder of the repository instead (it was built
    in memory), loaded with its class `base_class`. `warm_start` names the (encoder, decoder) checkpoints an
    encoder-decoder built in memory was warm-started from. `selection`: the MBR / QE decoding of the run's evaluation
    (`SelectionDecoding.record`, and its `max_length`: `generation_max_length`); the card then shows
    `hf_seqrl.evaluation.generate_texts` decoding that way.
    """
    from huggingface_hub import ModelCard, ModelCardData

    causal = model_class == "AutoModelForCausalLM"
    pipeline_tag = pipeline_tag_of(task, causal)
    datasets = list(datasets or [])
    base_path = base_model if base_model and hub_id(base_model) is None else None  # a local folder
    base_model = hub_id(base_model)
    warm_ids = list(dict.fromkeys(hub_id(name) for name in warm_start or () if hub_id(name)))
    metrics = sorted((k, float(v)) for k, v in (metrics or {}).items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool))
    results = eval_results(pipeline_tag or CAUSAL_PIPELINE_TAG, datasets, metrics)
    # The metadata lists Hub dataset ids only; a free-text description of the data stays in the body.
    hub_datasets = [d for d in datasets if HUB_DATASET_ID.match(d)]
    metadata_base = base_model or (warm_ids[0] if len(warm_ids) == 1 else warm_ids or None)
    card_data = ModelCardData(
        library_name="transformers", pipeline_tag=pipeline_tag, license=license or None,
        tags=list(dict.fromkeys(t for t in (PROJECT, method.tag, "sequence-level-training", task) if t)),
        base_model=metadata_base, datasets=hub_datasets or None,
        eval_results=results or None, model_name=model_name if results else None,
    )
    settings = {k: v for k, v in (settings or {}).items() if not SECRET_KEY.search(k)}
    repo_id = repo_id or model_name
    if base_subfolder:
        base_class, base_ref = base_class or model_class, repo_id
    else:
        base_class = model_class
        base_ref = base_model or base_path or "<the base model>"
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
        model_class=model_class,
        causal=causal,
        base_model=base_model,
        base_path=base_path,
        warm_start=[(part, name, hub_id(name)) for part, name in zip(("encoder", "decoder"), warm_start or ())],
        adapter=adapter,
        base_class=base_class,
        base_ref=base_ref,
        base_subfolder=base_subfolder,
        imports=", ".join(dict.fromkeys([model_class] * (not adapter) + [base_class] * adapter + ["AutoTokenizer"])),
        datasets=datasets,
        reward=_safe(reward) if reward else None,
        teacher=None if teacher is None else _safe(teacher),
        settings=[(k, _safe(v)) for k, v in settings.items()],
        metrics=metrics,
        curve=curve or [],
        repo_id=repo_id,
        example=repr(example_input if example_input is not None else PLACEHOLDER_INPUT),
        messages=repr(example_messages) if causal and example_messages else None,
        prompt_special_tokens=prompt_special_tokens,
        prompt_ends_with_eos=prompt_ends_with_eos and prompt_special_tokens,
        max_new_tokens=max_new_tokens,
        selection=selection_call(selection),
        selection_words=selection and selection_words(selection),
        versions=library_versions(),
    )
    text = str(card)
    return text if text.endswith("\n") else text + "\n"


def selection_words(selection: dict[str, Any]) -> str:
    """Returns a `SelectionDecoding.record` in words: `MBR over 16 samples (chrf)`, `QE over 8 beam (cometkiwi)`."""
    reward = selection["utility"] if selection["decode"] == "mbr" else selection["qe_reward"]
    return f"{selection['decode'].upper()} over {selection['num_candidates']} {selection['candidates']} ({reward})"


def selection_call(selection: dict[str, Any] | None) -> str | None:
    """Returns the keyword arguments of `generate_texts` that decode as `selection` (a `SelectionDecoding.record`,
    with the evaluation's `max_length` when it had one) says, as Python source (`decode='mbr', candidates='samples',
    num_candidates=16, ...`), None without one."""
    if not selection:
        return None
    names = ("decode", "candidates", "num_candidates", "utility", "qe_reward", "epsilon_cutoff", "seed",
             "max_length")
    return ", ".join(f"{name}={_safe(selection[name])!r}" if isinstance(selection[name], str) else
                     f"{name}={selection[name]!r}" for name in names if selection.get(name) is not None)


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
