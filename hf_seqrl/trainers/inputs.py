"""What a trainer takes in: the model and tokenizer checks, the dataset checks, and the text columns of a batch."""

from __future__ import annotations

from typing import NamedTuple


def check_model_family(family, supported: tuple[str, ...], trainer: str) -> None:
    """Raises a clear error unless `family` (from `hf_seqrl.families.family_for`) is one that `trainer` supports."""
    if family.name not in supported:
        kinds = {"seq2seq": "encoder-decoder (AutoModelForSeq2SeqLM)", "causal": "decoder-only (AutoModelForCausalLM)"}
        raise ValueError(f"{trainer} supports {' and '.join(kinds[k] for k in supported)} models only; got a "
                         f"{kinds[family.name]} model.")


class BatchText(NamedTuple):
    """The columns of a batch that stay out of the model: what rewards and evaluation read."""

    references: list[list[str]] | None
    sources: list[str] | None
    columns: dict[str, list]  # every other non-model column, one entry per row


def repeat_rows(text: BatchText, n: int) -> BatchText:
    """Returns `text` with each row repeated `n` times in place (the layout of `n` samples per source)."""
    def repeat(values):
        return None if values is None else [v for v in values for _ in range(n)]

    return BatchText(repeat(text.references), repeat(text.sources),
                     {key: repeat(values) for key, values in text.columns.items()})


def load_tokenizer_for(model):
    """Returns `AutoTokenizer.from_pretrained(model.name_or_path)`, or raises an error saying what to pass."""
    from transformers import AutoTokenizer

    name = getattr(model.config, "_name_or_path", "") or getattr(model, "name_or_path", "")
    if not name:
        raise ValueError(
            "processing_class was not given, and the model has no name_or_path to load a tokenizer from (it was built "
            "from a config): pass processing_class=<the tokenizer of its vocabulary>.")
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=False)
    except Exception as err:
        raise ValueError(
            f"processing_class was not given, and no tokenizer could be loaded from the model's name_or_path {name!r} "
            f"({type(err).__name__}: {err}). Pass processing_class=AutoTokenizer.from_pretrained(...) yourself."
        ) from err
