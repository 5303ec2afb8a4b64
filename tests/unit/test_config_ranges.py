"""Every numeric field that an hf-seqrl config declares has a declared range (a `configs.base.Range` in the
`FIELD_RANGES` of its class), and a value outside it, or a value that is no number, is refused when the config is
built, with an error that names the class, the field, the value and the range. A new numeric field without a range or
a row here fails `test_the_table_covers_every_numeric_field`."""

import re

import pytest

import hf_seqrl.configs as configs
from hf_seqrl.configs.base import Range, SeqRLBaseConfig, field_range

# An out-of-range value of every numeric field, by field name (the same name has the same range in every config).
OUT_OF_RANGE = {
    "warmup_xe_steps": -1, "max_source_length": 0, "max_target_length": 0, "max_prompt_length": 0,
    "max_completion_length": 0,
    "reward_workers": -1, "num_samples": 0, "temperature": 0.0, "top_k": -1, "top_p": 1.5, "rl_weight": 1.2, "epsilon_cutoff": 1.0,
    "entropy_coef": -0.1, "kl_coef": -0.1, "num_completions_to_print": -1, "max_new_tokens": 0,
    "steps_per_generation": 0, "generation_batch_size": 0,
    "baseline_ema_decay": 1.0,
    "num_iterations": 0, "epsilon": 0.0, "epsilon_high": -0.2, "delta": 1.0,
    "mrt_beam_size": 0, "max_len_a": -0.5, "max_len_b": -1, "mrt_alpha": 0.0,
    "mixer_delta": 0, "mixer_increment_steps": 0,
    "lmbda": -0.1, "beta": 1.5, "seq_kd_num_beams": 0,
    "schedule_k": 0.0, "min_teacher_forcing_ratio": 1.1, "corruption_rate": -0.1, "rollout_steps": 0,
    "adversarial_weight": -1.0, "discriminator_hidden_size": 0, "discriminator_learning_rate": 0.0,
    # Unbounded (`Range()`): every finite number is in range, so only the type checks apply.
    "best_of_n_threshold": None,
}
# Where configs are defined: `hf_seqrl.configs`, and an objective's own config in its module.
CONFIG_MODULES = ("hf_seqrl.configs", "hf_seqrl.objectives")


def config_classes():
    """Returns `SeqRLBaseConfig` and every subclass defined in `hf_seqrl.configs` or an objective's module."""
    import hf_seqrl.objectives  # noqa: F401  (defines the objectives' configs)

    found, todo = [], [SeqRLBaseConfig]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith(CONFIG_MODULES) and cls not in found:
            found.append(cls)
            todo.extend(cls.__subclasses__())
    return sorted(found, key=lambda cls: cls.__name__)


def numeric_kind(annotation) -> str | None:
    """Returns "int" or "float" for an annotation `int`, `float`, `int | None`, `float | None`; None otherwise."""
    parts = {part.strip() for part in str(annotation).split("|")} - {"None"}
    return next(iter(parts)) if parts in ({"int"}, {"float"}) else None


def declared_numeric_fields(cls) -> dict[str, str]:
    """Returns `{field: "int" | "float"}` of the numeric fields that hf-seqrl's classes in `cls`'s MRO declare (not
    those of transformers' `TrainingArguments`)."""
    fields = {}
    for owner in reversed(cls.__mro__):
        if owner.__module__.startswith(CONFIG_MODULES):
            for name, annotation in vars(owner).get("__annotations__", {}).items():
                kind = numeric_kind(annotation)
                if kind is not None:
                    fields[name] = kind
    return fields


CASES = [(cls, name, kind) for cls in config_classes() for name, kind in declared_numeric_fields(cls).items()]


def test_the_table_covers_every_numeric_field():
    assert {cls.__name__ for cls in config_classes()} >= set(configs.__all__)
    declared = {name for _, name, _ in CASES}
    assert declared == set(OUT_OF_RANGE), (declared ^ set(OUT_OF_RANGE))
    for cls, name, _ in CASES:
        assert isinstance(field_range(cls, name), Range), f"{cls.__name__}.{name}"


@pytest.mark.parametrize("cls,name,kind", CASES, ids=[f"{c.__name__}.{n}" for c, n, _ in CASES])
def test_a_value_out_of_range_or_of_another_type_is_refused_naming_the_field(cls, name, kind):
    bad = OUT_OF_RANGE[name]
    valid = str(field_range(cls, name))
    if bad is None:
        assert field_range(cls, name) == Range()
    else:
        with pytest.raises(ValueError, match=rf"^{cls.__name__}\.{name}={re.escape(repr(bad))} is out of range: {name} "
                                             rf"must be {re.escape(valid)}"):
            cls(output_dir="unused", **{name: bad})
    wrong = 1.5 if kind == "int" else "1"
    with pytest.raises(ValueError, match=rf"^{cls.__name__}\.{name}={re.escape(repr(wrong))} is not an? "
                                         rf"{'integer' if kind == 'int' else 'number'}"):
        cls(output_dir="unused", **{name: wrong})
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.{name}=True is not"):
        cls(output_dir="unused", **{name: True})


@pytest.mark.parametrize("cls", config_classes(), ids=lambda cls: cls.__name__)
def test_the_defaults_are_in_range(cls):
    config = cls(output_dir="unused", report_to=[])
    for name in declared_numeric_fields(cls):
        value = getattr(config, name)
        assert value is None or value in field_range(cls, name), name


@pytest.mark.parametrize("cls", config_classes(), ids=lambda cls: cls.__name__)
def test_every_config_parses_from_the_command_line(cls):
    # HfArgumentParser hands every metadata key of a field to argparse: a range there would break every CLI.
    from transformers import HfArgumentParser

    (config,) = HfArgumentParser(cls).parse_args_into_dataclasses(["--output_dir", "unused", "--report_to", "none"])
    assert type(config) is cls


def test_range_bounds_and_their_description():
    # (range, inside, outside, description)
    table = [(Range(0), [0, 5.5], [-1e-9], ">= 0"),
             (Range(0, low_open=True), [1e-9], [0, -1], "> 0"),
             (Range(0, 1), [0, 1, 0.5], [-0.1, 1.1], "in [0, 1]"),
             (Range(0, 1, low_open=True), [1, 0.5], [0], "in (0, 1]"),
             (Range(0, 1, high_open=True), [0, 0.9], [1], "in [0, 1)"),
             (Range(None, 2), [-5, 2], [2.1], "<= 2"),
             (Range(), [-1e9, 0, 1e9], [], "a finite number")]
    for valid, inside, outside, description in table:
        assert all(v in valid for v in inside) and not any(v in valid for v in outside), description
        assert str(valid) == description


def test_an_integral_float_of_an_integer_field_becomes_an_int():
    config = configs.KStepRolloutConfig(output_dir="unused", report_to=[], rollout_steps=3.0)
    assert config.rollout_steps == 3 and type(config.rollout_steps) is int
