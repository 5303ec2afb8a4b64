"""The training pipeline shared by the recipes and `hf-seqrl train --config FILE.yaml`.

parse (`--config file.yaml` + CLI overrides) → model and tokenizer → data → trainer → train → evaluate with
generation (corpus BLEU / chrF for translation, ROUGE for summarization) → save (model, tokenizer, card) → push.
Nothing here assumes a single process: run it as is under `accelerate launch`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any

import transformers
from transformers import HfArgumentParser

from ..data import tokenize_for, tokenize_source_rows
from ..data.tokenization import report_cut
from ..data.files import check_pairs, load_text_files, select_pair_columns
from ..evaluation import RUN_SETTINGS_FILE, build_compute_metrics
from ..models import FAMILIES, family_for
from ..models.tiny import ARCHITECTURES
from ..trainers import TRAINER_CLASSES, CrossEntropyTrainer, RolloutTrainer
from . import UsageError, closing_block, flag_name, parse_dataclasses, suggest
from .processes import destroy_process_group, no_accelerator, process_group_initialized

# algorithm -> trainer class; each trainer names its config class (`config_class`)
TRAINERS = {trainer.algorithm_id: trainer for trainer in TRAINER_CLASSES}
ALGORITHMS = tuple(TRAINERS)
OTHER_FIELDS = {f.name for trainer in TRAINER_CLASSES for f in dataclasses.fields(trainer.config_class)}
SPLITS = (("train", "train"), ("validation", "eval"), ("test", "test"))  # (split, metric prefix)


@dataclass
class ScriptArguments:
    r"""
    What to train, on what data, with which algorithm; the training settings are the fields of the algorithm's
    config (`SeqRLConfig`, `MRTConfig`, `MixerConfig`, `DistillationConfig`, `ScheduledSamplingConfig`,
    `PrefixCorruptionConfig`, `KStepRolloutConfig`, `ProfessorForcingConfig`). Each field has its `--help`. Notes:

    - The model: `model_name_or_path` (Hub id or folder; encoder-decoder models load with AutoModelForSeq2SeqLM,
      decoder-only ones with AutoModelForCausalLM), or `tiny_model` (`"t5"`, `"bart"`, `"marian"`, or the decoder-only
      `"llama"`, `"qwen2"`): a small random model built from a config over `tokenizer_name`'s vocabulary (default:
      `ByT5Tokenizer`, no download).
    - Decoder-only models read each source as a prompt, `prompt_template` (a `{prompt}` field takes the source)
      wrapped in the tokenizer's chat template when `use_chat_template`; the target is the completion, and the loss,
      the rewards and the evaluation cover the completion only. `max_target_length` and `generation_max_length` count
      completion tokens.
    - The data: `dataset_name` (+ `dataset_config`) with `train` / `validation` / `test` splits, or local files:
      `.json`/`.jsonl` and `.csv`/`.tsv` (a header line) name their columns; `.txt` holds one example a line,
      `source<TAB>reference[<TAB>reference ...]`. A target cell may be a list of references; all of them are used
      by rewards and metrics. A `translation` column of dicts (wmt16) is read with `source_lang` / `target_lang`.
    - The task (`task`, a field of every config: `translation`, the default here, or `summarization`) picks the
      default reward and the reported corpus metrics, and what the model card says.
    """

    config: str | None = field(default=None, metadata={"help": "YAML file of settings; CLI flags override it."})
    algorithm: str = field(default="scst", metadata={"choices": ALGORITHMS, "help": (
        "The trainer: " + " | ".join(name for name, trainer in TRAINERS.items() if issubclass(trainer, RolloutTrainer))
        + f" (rewarded), {CrossEntropyTrainer.algorithm_id} (plain cross-entropy: a teacher, a sequence-level KD "
        "student), " + " | ".join(name for name, trainer in TRAINERS.items()
                                  if not issubclass(trainer, (RolloutTrainer, CrossEntropyTrainer)))
        + " (cross-entropy on changed inputs).")})
    reward_funcs: list[str] | None = field(default=None, metadata={
        "help": "Reward names (bleu chrf rouge1 rouge2 rougeL rougeLsum, or module:function), weighted by "
                "reward_weights; default: bleu for translation, rougeL for summarization."})
    teacher_model: str | None = field(default=None, metadata={
        "help": "Teacher: Hub id or folder of the model's family and tokenizer (--algorithm distill; any rewarded "
                "algorithm logs its log-probs of the samples). Loaded with teacher_model_init_kwargs."})
    model_name_or_path: str | None = field(default=None, metadata={"help": "Hub id or local folder."})
    tiny_model: str | None = field(default=None, metadata={
        "help": "t5 | bart | marian | llama | qwen2, built from a config (llama, qwen2: decoder-only)."})
    tiny_d_model: int = field(default=32, metadata={"help": "Width of the tiny model."})
    tiny_layers: int = field(default=1, metadata={"help": "Encoder and decoder layers of the tiny model."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer (default: the model's)."})
    trust_remote_code: bool = field(default=False, metadata={
        "help": "Run model/tokenizer code shipped in a Hub repo. Off unless you trust that repo."})
    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset id."})
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration."})
    train_file: str | None = field(default=None, metadata={"help": "json/jsonl/csv/tsv/txt training file."})
    validation_file: str | None = field(default=None, metadata={"help": "Validation file."})
    test_file: str | None = field(default=None, metadata={"help": "Test file (final evaluation)."})
    source_lang: str | None = field(default=None, metadata={"help": "Source key of a translation column."})
    target_lang: str | None = field(default=None, metadata={"help": "Target key of a translation column."})
    src_lang: str | None = field(default=None, metadata={
        "help": "Multilingual tokenizers (NLLB deu_Latn, mBART de_DE, M2M100 de): the sources' language code."})
    tgt_lang: str | None = field(default=None, metadata={
        "help": "The targets' language code: it marks the targets, and the decode starts with it (the generation "
                "config's forced_bos_token_id) unless the model forces another."})
    source_prefix: str = field(default="", metadata={"help": "Prepended to every source (T5 task prefix)."})
    prompt_template: str | None = field(default=None, metadata={
        "help": "Decoder-only models: the prompt, with a {prompt} field that receives the source."})
    use_chat_template: bool = field(default=False, metadata={
        "help": "Decoder-only models: send the prompt as a user message through the tokenizer's chat template."})
    drop_invalid_rows: bool = field(default=False, metadata={
        "help": "Drop the rows the trainers cannot take (an empty source, no reference) with a warning that counts "
                "them, instead of stopping with an error that names them."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first N validation rows."})
    max_test_samples: int | None = field(default=None, metadata={"help": "Keep the first N test rows."})
    eval_num_beams: int | None = field(default=None, metadata={"help": "Beams of the final evaluation."})
    use_peft: bool = field(default=False, metadata={"help": "Train a LoRA adapter instead of every weight."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator (scale = alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA input (0 under disable_dropout)."})
    lora_target_modules: list[str] | None = field(default=None, metadata={
        "help": "Module names the adapter wraps (default: peft's choice for the architecture)."})

    def __post_init__(self):
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"ScriptArguments.algorithm={self.algorithm!r} is not one of {ALGORITHMS}.")
        if (self.model_name_or_path is None) == (self.tiny_model is None):
            raise ValueError("Set exactly one of model_name_or_path (Hub id or folder) and tiny_model "
                             f"({'|'.join(ARCHITECTURES)}).")
        if self.tiny_model is not None and self.tiny_model not in ARCHITECTURES:
            raise ValueError(f"ScriptArguments.tiny_model={self.tiny_model!r} is not one of {', '.join(ARCHITECTURES)}.")
        if self.prompt_template is not None and "{prompt}" not in self.prompt_template:
            raise ValueError(f"ScriptArguments.prompt_template={self.prompt_template!r} has no {{prompt}} field for "
                             "the source.")
        if self.dataset_name is None and self.train_file is None:
            raise ValueError("Give the data: dataset_name (a Hub dataset) or train_file (a local file).")
        if self.teacher_model is not None and not takes_rewards(self.algorithm):
            raise ValueError(f"ScriptArguments.teacher_model applies to the rewarded algorithms; algorithm="
                             f"{self.algorithm!r} takes no teacher.")
        if self.reward_funcs and not takes_rewards(self.algorithm):
            warnings.warn(f"ScriptArguments.reward_funcs={self.reward_funcs} apply to the rewarded algorithms; "
                          f"algorithm={self.algorithm!r} trains without a reward: ignored.")
        needs_teacher = getattr(getattr(trainer_class(self.algorithm), "defaults", None), "needs_teacher", False)
        if self.teacher_model is None and needs_teacher:
            raise ValueError(f"algorithm={self.algorithm!r} needs teacher_model: a Hub id or folder of the model's "
                             "family and tokenizer.")


def trainer_class(algorithm: str) -> type:
    """Returns the trainer class of `algorithm`."""
    if algorithm not in TRAINERS:
        raise UsageError(f"algorithm={algorithm!r} is not one of {ALGORITHMS}{suggest(str(algorithm), ALGORITHMS)}.")
    return TRAINERS[algorithm]


def config_class(algorithm: str) -> type:
    """Returns the training-arguments dataclass of `algorithm`."""
    return trainer_class(algorithm).config_class


def takes_rewards(algorithm: str) -> bool:
    """Returns whether `algorithm`'s trainer is rewarded (takes `reward_funcs`)."""
    return issubclass(trainer_class(algorithm), RolloutTrainer)


def parse_args(argv: list[str] | None = None, defaults: dict[str, Any] | None = None) -> tuple[ScriptArguments, Any]:
    """Returns `(ScriptArguments, config)` from `--config file.yaml` and CLI flags.

    Precedence: CLI flag > YAML file > `defaults` (a recipe's, e.g. its task) > the dataclasses' defaults.
    """
    import yaml

    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    pre.add_argument("--algorithm")
    known, _ = pre.parse_known_args(argv)
    values: dict[str, Any] = dict(defaults or {})
    if known.config:
        with open(known.config, encoding="utf-8") as f:
            from_file = yaml.safe_load(f) or {}
        if not isinstance(from_file, dict):
            raise UsageError(f"{known.config} must hold a mapping of setting: value, got {type(from_file).__name__}.")
        values.update(from_file)
    algorithm = known.algorithm or values.get("algorithm", "scst")
    parser = HfArgumentParser((ScriptArguments, config_class(algorithm)), allow_abbrev=False)
    dests = {f.name for dataclass in (ScriptArguments, config_class(algorithm)) for f in dataclasses.fields(dataclass)
             if f.init}
    # A setting of another algorithm's config, in the file or on the command line, is dropped with a warning: one
    # config or command line serves every algorithm (e.g. `--algorithm mrt` on an SCST config with `--baseline`).
    ignored = sorted(k for k in values if k not in dests and k in OTHER_FIELDS)
    argv, dropped = drop_flags(argv, lambda name: name not in dests and name in OTHER_FIELDS)
    if ignored or dropped:
        where = " and ".join(part for part, names in ((known.config, ignored), ("the command line", dropped)) if names)
        warnings.warn(f"{where}: {sorted({*ignored, *dropped})} do not apply to algorithm={algorithm!r} "
                      f"({config_class(algorithm).__name__}); ignored.", stacklevel=2)
        values = {k: v for k, v in values.items() if k not in ignored}
    unknown = sorted(set(values) - set(dests))
    if unknown:
        named = ", ".join(f"{name!r}{suggest(name, dests)}" for name in unknown)
        raise UsageError(f"{known.config}: unknown setting(s) {named}; `hf-seqrl train --help` lists the accepted "
                         "names.")
    parser.set_defaults(**values)
    if "use_cpu" not in values and int(os.environ.get("WORLD_SIZE", "1")) > 1 and no_accelerator():
        # `accelerate launch --multi_gpu` on a machine without GPUs: run the processes on CPU over gloo.
        parser.set_defaults(use_cpu=True)
    script_args, training_args = parse_dataclasses(parser, argv)
    # The pipeline's defaults fill the config fields it needs and the config leaves open.
    for name, default in PIPELINE_DEFAULTS.items():
        if getattr(training_args, name) is None:
            setattr(training_args, name, default)
    return script_args, training_args


def drop_flags(argv: list[str], drop) -> tuple[list[str], list[str]]:
    """Returns `(argv without the flags whose name `drop(name)` is true, with their values; those names)`: a flag's
    values are the tokens after it up to the next `--flag`."""
    kept, dropped, dropping = [], [], False
    for token in argv:
        name = flag_name(token)
        if name is not None:
            dropping = drop(name)
            if dropping:
                dropped.append(name)
        if not dropping:
            kept.append(token)
    return kept, dropped


# Config fields the pipeline needs, with its defaults where the config has None.
PIPELINE_DEFAULTS = {"task": "translation", "max_source_length": 256, "max_target_length": 128}


def peft_config_of(script_args: ScriptArguments, family):
    """Returns the `peft.LoraConfig` that `use_peft` and the `lora_*` fields ask for, or None."""
    if not script_args.use_peft:
        return None
    from peft import LoraConfig

    return LoraConfig(task_type="SEQ_2_SEQ_LM" if family.name == "seq2seq" else "CAUSAL_LM", r=script_args.lora_r,
                      lora_alpha=script_args.lora_alpha, lora_dropout=script_args.lora_dropout,
                      target_modules=script_args.lora_target_modules)


def load_model_and_tokenizer(script_args: ScriptArguments, training_args=None):
    """Returns `(model, tokenizer)`: from the Hub / a folder, or a tiny model built from a config (with position
    embeddings for `training_args`' source and target lengths, by default the pipeline's)."""
    from transformers import AutoTokenizer, ByT5Tokenizer

    from ..models import load_pretrained
    from ..models.languages import set_language_codes
    from ..models.tiny import build_tiny_model

    remote = bool(script_args.trust_remote_code)
    if script_args.tiny_model is not None:
        tokenizer = AutoTokenizer.from_pretrained(script_args.tokenizer_name, trust_remote_code=remote) \
            if script_args.tokenizer_name else ByT5Tokenizer()
        lengths = [getattr(training_args, name, None) or PIPELINE_DEFAULTS[name]
                   for name in ("max_source_length", "max_target_length")]
        positions = max(1024, *lengths) + 2
        model = build_tiny_model(script_args.tiny_model, tokenizer=tokenizer, d_model=script_args.tiny_d_model,
                                 layers=script_args.tiny_layers, max_positions=positions)
    else:
        name = script_args.tokenizer_name or script_args.model_name_or_path
        try:
            tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=remote)
            model = load_pretrained(script_args.model_name_or_path, trust_remote_code=remote)
        except OSError as error:
            raise UsageError(f"--model_name_or_path {script_args.model_name_or_path!r} (--tokenizer_name "
                             f"{script_args.tokenizer_name!r}) could not be loaded: {error} Pass a local folder or a "
                             "Hub id that exists (offline, one already in the Hub cache).") from error
    try:
        set_language_codes(model, tokenizer, script_args.src_lang, script_args.tgt_lang)
    except ValueError as error:
        raise UsageError(str(error)) from error
    return model, tokenizer


def load_splits(script_args: ScriptArguments, training_args, tokenizer, decoder_start_token_id: int | None = None,
                family=None) -> dict:
    """Returns the tokenized splits present among train / validation / test (with `references`, `sources`), their
    columns and lengths from `training_args`' data fields.

    `family` (an `hf_seqrl.models` family, default seq2seq) says how the pairs are tokenized: source → target for
    encoder-decoders, prompt + completion rows for decoder-only models.
    """
    family = family or FAMILIES["seq2seq"]()
    from datasets import load_dataset

    s, data_args = script_args, training_args
    # validation and test read the gold references of a model trained on a teacher's outputs (eval_target_column)
    target_columns = {split: (split != "train" and data_args.eval_target_column) or data_args.target_column
                      for split, _ in SPLITS}
    if s.dataset_name is not None:
        raw = load_dataset(s.dataset_name, s.dataset_config)
    else:
        files = {"train": s.train_file, "validation": s.validation_file, "test": s.test_file}
        raw = {split: load_text_files({split: path}, data_args.source_column or "source",
                                      target_columns[split] or "target")[split]
               for split, path in files.items() if path}
    limits = {"train": s.max_train_samples, "validation": s.max_eval_samples, "test": s.max_test_samples}
    out = {}
    for split, _ in SPLITS:
        if split not in raw:
            continue
        where = f"{split} split of {s.dataset_name or getattr(s, f'{split}_file')}"
        data = raw[split]
        if limits[split] is not None:
            data = data.select(range(min(limits[split], len(data))))
        source = data_args.source_column or s.source_lang or "source"
        if split == "train" and source in data.column_names and "translation" not in data.column_names and (
                target_columns[split] or s.target_lang or "target") not in data.column_names:
            # sources alone: the trainer takes them where no setting reads a target, and names the settings otherwise
            out[split] = data.map(tokenize_source_rows, batched=True, remove_columns=data.column_names,
                                  desc=f"{where}: tokenize", fn_kwargs=dict(
                                      family=family, tokenizer=tokenizer, source_column=source,
                                      max_source_length=data_args.max_source_length, prefix=s.source_prefix,
                                      prompt_template=s.prompt_template, use_chat_template=s.use_chat_template,
                                      name=where))
            continue
        data = select_pair_columns(data, data_args.source_column, target_columns[split], s.source_lang,
                                   s.target_lang, where, "target_column" if split == "train" else "eval_target_column")
        data = check_pairs(data, where, drop=s.drop_invalid_rows)
        out[split] = data.map(
            tokenize_for, batched=True, remove_columns=["source", "target"], desc=f"{where}: tokenize",
            fn_kwargs=dict(family=family, tokenizer=tokenizer, source_column="source", target_column="target",
                           max_source_length=data_args.max_source_length,
                           max_target_length=data_args.max_target_length,
                           prefix=s.source_prefix, decoder_start_token_id=decoder_start_token_id,
                           prompt_template=s.prompt_template, use_chat_template=s.use_chat_template, count_cut=True))
        out[split] = report_cut(out[split], where, (data_args.max_source_length, data_args.max_target_length),
                                ("source", "target"))
    if "train" not in out:
        raise ValueError("The data has no 'train' split: give train_file, or a dataset_name with a train split.")
    return out


def task_metrics(task: str) -> tuple[str, ...]:
    """Returns the corpus metrics reported for `task`: BLEU and chrF for translation, ROUGE-1/2/L for summarization."""
    return ("bleu", "chrf") if task == "translation" else ("rouge1", "rouge2", "rougeL")


def task_rewards(script_args: ScriptArguments, task: str) -> list[str]:
    """Returns `reward_funcs` as given, else the task's default: sentence BLEU (translation) or ROUGE-L."""
    return script_args.reward_funcs or (["bleu"] if task == "translation" else ["rougeL"])


def build_trainer(script_args: ScriptArguments, training_args, model, tokenizer, splits: dict):
    """Returns the algorithm's trainer over the tokenized splits, evaluating with generation."""
    training_args.predict_with_generate = True
    if training_args.generation_max_length is None:
        training_args.generation_max_length = training_args.max_target_length
    validation = splits.get("validation")
    cls, extra = trainer_class(script_args.algorithm), {}
    if takes_rewards(script_args.algorithm):
        # a trainer whose loss needs no reward (distillation) takes the rewards given, and no default
        extra["reward_funcs"] = task_rewards(script_args, training_args.task) if cls.needs_rewards \
            else script_args.reward_funcs
        if script_args.teacher_model is not None:
            extra["teacher_model"] = script_args.teacher_model
    trainer = cls(
        model=model, args=training_args, train_dataset=splits["train"], eval_dataset=validation,
        processing_class=tokenizer, peft_config=peft_config_of(script_args, family_for(model)), **extra,
        compute_metrics=None if validation is None else build_compute_metrics(
            tokenizer, task_metrics(training_args.task), validation["references"]),
    )
    trainer.run_settings = {"source_prefix": script_args.source_prefix, "prompt_template": script_args.prompt_template,
                            "use_chat_template": script_args.use_chat_template}
    return trainer


def evaluate_split(trainer, dataset, prefix: str, task: str, num_beams: int | None = None) -> dict[str, float]:
    """Returns `prefix_*` metrics of generating on `dataset` (BLEU/chrF or ROUGE, `rl/reward`, loss)."""
    trainer.compute_metrics = build_compute_metrics(trainer.processing_class, task_metrics(task), dataset["references"])
    num_beams = num_beams or trainer.args.generation_num_beams
    metrics = trainer.evaluate(dataset, metric_key_prefix=prefix, num_beams=num_beams)
    trainer.log_metrics(prefix, metrics)
    return metrics


def run(script_args: ScriptArguments, training_args) -> dict[str, float]:
    """Returns the final metrics after training, evaluating, saving and (when asked) pushing."""
    transformers.utils.logging.set_verbosity(training_args.get_process_log_level())
    transformers.set_seed(training_args.seed)  # the tiny model's initial weights
    model, tokenizer = load_model_and_tokenizer(script_args, training_args)
    family = family_for(model)
    with training_args.main_process_first(desc="data"):
        splits = load_splits(script_args, training_args, tokenizer, family.label_start_id(model), family)
    if (script_args.eval_num_beams or 1) > 1 and training_args.generation_selection:
        raise UsageError(f"--eval_num_beams {script_args.eval_num_beams} asks the final evaluation for beam search and "
                         "--generation_selection for MBR / QE decoding: drop one of them.")
    try:  # what the trainer refuses when it is built (bad settings, data, ids, a teacher that does not load)
        trainer = build_trainer(script_args, training_args, model, tokenizer, splits)
    except (ValueError, OSError) as error:
        raise UsageError(str(error)) from error

    resume = training_args.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("true", "last"):
        resume = True
    result = trainer.train(resume_from_checkpoint=resume)
    metrics = dict(result.metrics)
    trainer.log_metrics("train", result.metrics)
    for split, prefix in SPLITS[1:]:
        if split in splits:
            metrics.update(evaluate_split(trainer, splits[split], prefix, training_args.task,
                                          script_args.eval_num_beams))
    trainer.save_metrics("all", metrics)
    trainer.save_state()

    card = dict(tasks=training_args.task, dataset=[script_args.dataset_name] if script_args.dataset_name else None)
    if training_args.push_to_hub:
        trainer.push_to_hub(commit_message="End of training", **card)  # saves model, tokenizer and card first
    else:
        trainer.save_model()  # every process calls it (sharded states are gathered); only the main one writes
        trainer.create_model_card(**card)
    if trainer.is_world_process_zero():
        print(closing_block(f"saved the {script_args.algorithm} model", training_args.output_dir,
                            {"model": "model.safetensors", "adapter": "adapter_model.safetensors", "card": "README.md",
                             "settings": RUN_SETTINGS_FILE, "metrics": "all_results.json"},
                            next_commands(script_args, training_args.output_dir)))
    return metrics


def next_commands(script_args: ScriptArguments, output_dir: str) -> list[str]:
    """Returns the commands that score and diagnose the saved model on the run's held-out file (a placeholder
    FILE.jsonl when the data came from the Hub)."""
    data = script_args.test_file or script_args.validation_file or "FILE.jsonl"
    return [f"hf-seqrl evaluate --model {output_dir} --data {data}",
            f"hf-seqrl diagnose --model {output_dir} --data {data} --output_dir {output_dir}/diagnostics"]


def main(argv: list[str] | None = None) -> int:
    """Returns 0 after `hf-seqrl train`: training as `recipes/translation.py` and `recipes/summarization.py` do."""
    train_main(argv)
    return 0


def train_main(argv: list[str] | None = None, task: str | None = None) -> dict[str, float]:
    """Runs `hf-seqrl train` / a recipe: parses `argv` (default `sys.argv[1:]`) and returns the final metrics.

    A recipe passes its `task`: it is the default, and a config asking for another task is refused. A process group
    that the run sets up (Accelerate does under `accelerate launch`) is destroyed before returning; one that existed
    before the call is left to its owner.
    """
    owns_process_group = not process_group_initialized()
    script_args, training_args = parse_args(argv, defaults={"task": task} if task else None)
    if task is not None and training_args.task != task:
        other = "summarization" if task == "translation" else "translation"
        raise SystemExit(f"task={training_args.task!r}: this is the {task} recipe; use recipes/{other}.py.")
    # parse → data → trainer → train → evaluate on the test split → save (model, tokenizer, card) → push
    metrics = run(script_args, training_args)
    if owns_process_group and process_group_initialized():
        destroy_process_group()
    return metrics
