"""The fields every trainer shares (`SeqRLBaseConfig`), the length limit of every trainer that decodes on its own
(`max_new_tokens_field`), and the checks the configs share: every numeric field declares its valid values once, as a
`Range` in the `FIELD_RANGES` of the class that declares the field, and `check_ranges` enforces them all at
construction. (Not in the fields' metadata: `HfArgumentParser` hands every metadata key to argparse.)"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field
from typing import NamedTuple

from transformers import Seq2SeqTrainingArguments

TASKS = ("translation", "summarization")


class _NoSecretsInPickle:
    """Keeps credentials out of `training_args.bin`, which the Trainer pickles into every checkpoint."""

    def __getstate__(self):
        state = self.__dict__.copy()
        for key in state:
            if key.endswith("_token") and state[key] is not None:
                state[key] = None
        return state


def check_choice(config, name: str, choices: tuple) -> None:
    """Raises a ValueError naming `type(config).name` unless the field `name` holds one of `choices`."""
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(f"{type(config).__name__}.{name}={value!r} is not one of {choices}: {name} must be one of "
                         "these.")


class Range(NamedTuple):
    """The valid values of a numeric config field, declared once in the `FIELD_RANGES` of its class
    (`FIELD_RANGES = {"top_k": Range(0), ...}`): from `low` to `high` (None: unbounded on that side), each end
    included unless `low_open` / `high_open`.
    A field annotated `int` takes integers only; one annotated `... | None` takes None too."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def __str__(self) -> str:
        if self.low is None and self.high is None:
            return "a finite number"
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


def _type_names(config_class: type, name: str) -> set[str]:
    """Returns the names of the types the annotation of field `name` joins (`{"int", "None"}` for `int | None`), read
    from the class that declares it: `HfArgumentParser` rewrites the dataclass field's own `type` (`int | None` to
    `int`)."""
    for owner in config_class.__mro__:
        kind = vars(owner).get("__annotations__", {}).get(name)
        if kind is not None:
            break
    if not isinstance(kind, str):
        parts = typing.get_args(kind) or (kind,)
        return {"None" if part is type(None) else getattr(part, "__name__", str(part)) for part in parts}
    return {part.strip() for part in kind.split("|")}


def field_range(config_class: type, name: str) -> Range | None:
    """Returns the `Range` of the field `name` of `config_class`: the first in its MRO's `FIELD_RANGES`, None when none
    declares one."""
    for owner in config_class.__mro__:
        valid = vars(owner).get("FIELD_RANGES", {}).get(name)
        if valid is not None:
            return valid
    return None


def check_ranges(config) -> None:
    """Raises a ValueError naming the class, the field, the value and the valid values for the first numeric field of
    `config` outside its declared `Range` (`field_range`; or not a finite number, or not an integer where the field
    is an `int`); integral floats of `int` fields (`4.0` from a YAML file) become ints."""
    for config_field in dataclasses.fields(config):
        name = config_field.name
        valid = field_range(type(config), name)
        if valid is None:
            continue
        value, types = getattr(config, name), _type_names(type(config), name)
        none_ok = "None" in types
        if value is None and none_ok:
            continue
        integer = "int" in types
        if integer and isinstance(value, float) and value.is_integer():
            value = int(value)
            setattr(config, name, value)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (integer and not isinstance(value, int)) or not math.isfinite(value) or value not in valid:
            what = "an integer" if integer else "a number"
            problem = "is out of range" if number and (not integer or isinstance(value, int)) else f"is not {what}"
            raise ValueError(f"{type(config).__name__}.{name}={value!r} {problem}: {name} must be {valid} "
                             f"({what}{' or None' if none_ok else ''}). {config_field.metadata.get('help', '')}")


@dataclass
class SeqRLBaseConfig(_NoSecretsInPickle, Seq2SeqTrainingArguments):
    r"""
    The fields every hf-seqrl trainer shares, on top of `Seq2SeqTrainingArguments`; each trainer's config extends it.

    warmup_xe_steps (`int`, *optional*, defaults to `0`):
        Optimizer steps of plain teacher-forced cross-entropy (the `Seq2SeqTrainer` loss) before the trainer's own
        loss takes over.
    disable_dropout (`bool`, *optional*, defaults to `None`):
        Set every dropout probability of the model to 0 when the trainer is built (TRL's name). `None` takes the
        trainer's default: `True` for minimum risk training and distillation, `False` for every other trainer. The
        policy gradients (SCST, REINFORCE, MIXER) keep the checkpoint's dropout as TRL does. Rollouts decode without
        dropout, so with it on the scoring pass takes the log-probs of a randomly thinned network rather than of the
        distribution the samples came from (a biased gradient); the KL reference and a reused rollout's ratios replay
        the policy pass's dropout masks and stay exact. docs/math.md ("Dropout and the estimator") has the
        measurements behind these defaults.
    model_init_kwargs (`dict` or `str`, *optional*, defaults to `None`):
        Keyword arguments of `from_pretrained` when the trainer's `model` is a Hub id or a folder (TRL's name), e.g.
        `{"dtype": "bfloat16"}`; a JSON string on the command line. `trust_remote_code` stays off unless set here.
    task (`str`, *optional*, defaults to `None`):
        `"translation"` or `"summarization"`: what the model card says the model does (its Hub `pipeline_tag`).
        `hf-seqrl train --task` sets it.
    generation_selection (`dict` or `str`, *optional*, defaults to `None`):
        MBR or QE decoding of the trainer's own evaluation (`predict_with_generate`) in place of greedy / beam search:
        the selection keywords of `hf_seqrl.evaluation.generate_texts`, e.g. `{"decode": "mbr", "num_candidates":
        16, "utility": "chrf"}` or `{"decode": "qe", "qe_reward": "Unbabel/wmt22-cometkiwi-da"}` (`candidates`,
        `epsilon_cutoff`, `seed`: default the run's `seed`); a JSON string on the command line. Saved in
        `seqrl_run.json`, so `hf-seqrl evaluate` decodes the saved model the same way; docs/mbr.md.
    remove_unused_columns (`bool`, *optional*, defaults to `False`):
        `False` (TRL's default for its RL trainers): every dataset column the model does not take reaches the rewards
        as a keyword argument. `True` drops those columns before training, as `Seq2SeqTrainer` does, keeping only
        the model's inputs, the labels and the `references` / `sources` texts.

    > Text datasets (a dataset without `input_ids` is tokenized when the trainer is built)

    source_column (`str`, *optional*, defaults to `None`):
        Encoder-decoder models: the column of the source texts (`None`: `"source"`, else `"prompt"`).
    target_column (`str`, *optional*, defaults to `None`):
        Encoder-decoder models: the column of the targets, a string or a list of references per row (`None`:
        `"target"`, else `"completion"`). Optional when a `references` column gives what rewards compare with.
    eval_target_column (`str`, *optional*, defaults to `None`):
        The target column of the evaluation splits (`eval_dataset`; `hf-seqrl train`'s validation and test files), whose
        labels give the evaluation loss and whose references the metrics (`None`: `target_column`'s). Sequence-level
        knowledge distillation trains on a teacher's outputs (`target_column="teacher_target"`, `hf-seqrl
        distill-data`) and validates on the gold references (`eval_target_column="target"`).
    max_source_length (`int`, *optional*, defaults to `None`), max_target_length (`int`, *optional*, defaults to
    `None`):
        Encoder-decoder models: truncate sources / targets to this many tokens.
    max_prompt_length (`int`, *optional*, defaults to `None`), max_completion_length (`int`, *optional*, defaults
    to `None`):
        Decoder-only models (TRL's names): keep the last `max_prompt_length` tokens of a prompt (`prompt` column, text
        or chat messages) and the first `max_completion_length` of a completion (`completion`, EOS kept).
    """

    warmup_xe_steps: int = field(default=0, metadata={"help": "Teacher-forced cross-entropy steps before the "
                                                              "trainer's own loss."})
    disable_dropout: bool | None = field(default=None, metadata={
        "help": "Set the model's dropout to 0 (default: True for MRT and distillation, False for the others)."})
    model_init_kwargs: dict | str | None = field(default=None, metadata={
        "help": "from_pretrained keyword arguments (JSON) when the model is given as a Hub id or folder."})
    generation_selection: dict | str | None = field(default=None, metadata={
        "help": 'MBR / QE decoding of the evaluation, as JSON: {"decode": "mbr", "num_candidates": 16, "utility": '
                '"chrf"} (docs/mbr.md).'})
    remove_unused_columns: bool = field(default=False, metadata={
        "help": "Drop the dataset columns the model does not take (references / sources kept); False passes them "
                "to the rewards."})
    task: str | None = field(default=None, metadata={"help": "translation | summarization: what the model card "
                                                             "says the model does."})
    source_column: str | None = field(default=None, metadata={"help": "Source column (default: source)."})
    target_column: str | None = field(default=None, metadata={"help": "Target column (default: target)."})
    eval_target_column: str | None = field(default=None, metadata={
        "help": "Target column of the evaluation splits (default: target_column's), e.g. the gold references when "
                "training on a teacher's outputs."})
    max_source_length: int | None = field(default=None, metadata={"help": "Truncate sources to this many tokens."})
    max_target_length: int | None = field(default=None, metadata={"help": "Truncate targets to this many tokens."})
    max_prompt_length: int | None = field(default=None, metadata={"help": "Decoder-only: keep the prompt's last "
                                                                           "tokens."})
    max_completion_length: int | None = field(default=None, metadata={"help": "Decoder-only: keep the completion's "
                                                                               "first tokens."})

    FIELD_RANGES = {"warmup_xe_steps": Range(0), "max_source_length": Range(1), "max_target_length": Range(1),
                    "max_prompt_length": Range(1), "max_completion_length": Range(1)}

    def __post_init__(self):
        check_ranges(self)  # every numeric field of every subclass, before the slower set-up below
        super().__post_init__()
        if self.task is not None:
            check_choice(self, "task", TASKS)
        parse_init_kwargs(self, "model_init_kwargs")
        parse_json_field(self, "generation_selection", '\'{"decode": "mbr", "num_candidates": 16}\'',
                         "the selection keywords of generate_texts")
        for key, value in (self.generation_selection or {}).items():
            if not isinstance(value, (str, int, float, bool, type(None))):
                raise ValueError(f"generation_selection[{key!r}]={value!r}: the config holds plain data (it is saved "
                                 "with the run and its checkpoints); name the reward instead: a built-in name, a "
                                 "checkpoint folder or 'module:function'.")


def parse_json_field(config, name: str, example: str, what: str) -> None:
    """Reads field `name` of `config`, a dict or None: a JSON string (the command line's form) becomes a dict;
    anything else is refused with `example`, the form to write, and `what` the dict holds."""
    value = getattr(config, name)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"{type(config).__name__}.{name}={value!r} is not a JSON object: write it as "
                             f"{example}.") from err
        setattr(config, name, value)
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"{type(config).__name__}.{name} must be a dict of {what}, got {value!r}.")


def parse_init_kwargs(config, name: str) -> None:
    """Reads the `from_pretrained` keyword arguments of field `name` (`model_init_kwargs` and its kin): a JSON string
    (the command line's form) becomes a dict; anything but a dict or None is refused with the form to write."""
    parse_json_field(config, name, '\'{"dtype": "bfloat16"}\'', "from_pretrained arguments")


# The length limit of a trainer that decodes its own outputs during training (the rewarded trainers, professor
# forcing): one declaration, and one range for the `FIELD_RANGES` of the configs that hold it.
MAX_NEW_TOKENS_RANGE = {"max_new_tokens": Range(1)}


def max_new_tokens_field():
    """Returns the dataclass field `max_new_tokens` of a config whose trainer decodes during training (its range:
    `MAX_NEW_TOKENS_RANGE`)."""
    return field(default=None, metadata={"help": "Length limit of the sequences the model writes during training."})
