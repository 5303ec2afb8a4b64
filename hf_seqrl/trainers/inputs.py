"""What a trainer takes in: the model family check and the tokenizer it loads when none is given."""

from __future__ import annotations


def check_model_family(family, supported: tuple[str, ...], trainer: str) -> None:
    """Raises a clear error unless `family` (from `hf_seqrl.models.family_for`) is one that `trainer` supports."""
    if family.name not in supported:
        kinds = {"seq2seq": "encoder-decoder (AutoModelForSeq2SeqLM)", "causal": "decoder-only (AutoModelForCausalLM)"}
        raise ValueError(f"{trainer} supports {' and '.join(kinds[k] for k in supported)} models only; got a "
                         f"{kinds[family.name]} model.")


def forward_arguments(model, label_names: list[str]) -> set[str]:
    """Returns the names a batch may hold for `model`: its `forward`'s arguments (the base model's under a peft
    adapter), `label_names` and the collator's label names."""
    import inspect

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return set(inspect.signature(inner.forward).parameters) | {"label", "label_ids", *label_names}


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
