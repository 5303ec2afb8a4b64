"""What a trainer takes in, as users bring it: a model or its Hub id / folder, a tokenizer (loaded when none is
given, its pad token checked), and the names of the batch keys that are the model's inputs or the tokenizer's own
outputs rather than dataset columns."""

from __future__ import annotations

from transformers.utils import logging

logger = logging.get_logger(__name__)

# What tokenizers write besides `input_ids` / `attention_mask`: never a dataset column a reward should read.
TOKENIZER_OUTPUTS = frozenset({"token_type_ids", "special_tokens_mask", "offset_mapping",
                               "overflow_to_sample_mapping", "num_truncated_tokens"})


def load_model(model, args):
    """Returns `model`, or the model that the Hub id or folder `model` names, loaded with the Auto class of its
    family and `args.model_init_kwargs` (TRL's name; `trust_remote_code` stays off unless they set it)."""
    if not isinstance(model, str):
        return model
    from ..models import load_pretrained

    kwargs = dict(args.model_init_kwargs or {})
    kwargs.setdefault("trust_remote_code", False)
    return load_pretrained(model, **kwargs)


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


def tokenizer_outputs(tokenizer) -> set[str]:
    """Returns the keys `tokenizer` writes besides the model's inputs (`TOKENIZER_OUTPUTS` and its own
    `model_input_names`): batch keys that are no dataset column."""
    return set(TOKENIZER_OUTPUTS) | set(getattr(tokenizer, "model_input_names", None) or ())


def check_tokenizer(tokenizer, family, model, trainer: str):
    """Gives a decoder-only model's tokenizer without a pad token its EOS as pad (as TRL does, with a logged note);
    raises for an encoder-decoder one, whose padded rows the model must tell from its EOS."""
    if getattr(tokenizer, "pad_token_id", 0) is not None:
        return
    if family.name == "causal" and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
        logger.warning(f"{trainer}: the tokenizer has no pad token; padding with its EOS token "
                       f"{tokenizer.eos_token!r} (padded positions are masked).")
        if getattr(model.generation_config, "pad_token_id", None) is None:
            model.generation_config.pad_token_id = tokenizer.eos_token_id
        return
    raise ValueError(
        f"{trainer}: the tokenizer ({type(tokenizer).__name__}) has no pad token, which batches of sources and "
        "targets need: set one the model knows, e.g. processing_class.pad_token = <its pad token> (an "
        "encoder-decoder checkpoint's config names it as pad_token_id).")


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
