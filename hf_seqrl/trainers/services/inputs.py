"""What a trainer takes in, as users bring it: a model or its Hub id / folder, a tokenizer (loaded when none is
given, its pad token checked), and the names of the batch keys that are the model's inputs or the tokenizer's own
outputs rather than dataset columns."""

from __future__ import annotations

from transformers.utils import logging

from ...data import check_dataset_columns, check_rows, tokenize_text_dataset
from .references import run_target_settings

logger = logging.get_logger(__name__)

# What tokenizers write besides `input_ids` / `attention_mask`: never a dataset column a reward should read.
TOKENIZER_OUTPUTS = frozenset({"token_type_ids", "special_tokens_mask", "offset_mapping",
                               "overflow_to_sample_mapping", "num_truncated_tokens"})


def load_model(model, args, field: str = "model_init_kwargs"):
    """Returns `model`, or the model that the Hub id or folder `model` names, loaded with the Auto class of its
    family and the keyword arguments of `args.<field>` (`model_init_kwargs`, TRL's name, or
    `teacher_model_init_kwargs`; `trust_remote_code` stays off unless they set it).

    A model passed built takes the `attn_implementation` of those keyword arguments; their other keys need a model to
    load, and a warning names them as not applied. A model that does not load raises an `OSError` naming the
    trainer argument (`model`, `teacher_model`) beside the loader's own message."""
    init_kwargs = getattr(args, field) or {}
    if not isinstance(model, str):
        kwargs = dict(init_kwargs)
        attention = kwargs.pop("attn_implementation", None)
        if attention is not None and hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(attention)
        if kwargs:
            logger.warning("%s.%s %s apply when the model is a Hub id or a folder; the model was passed built, so "
                           "they are not applied (only attn_implementation is).", type(args).__name__, field,
                           sorted(kwargs))
        return model
    from ...models import load_pretrained

    kwargs = dict(init_kwargs)
    kwargs.setdefault("trust_remote_code", False)
    try:
        return load_pretrained(model, **kwargs)
    except OSError as err:
        from huggingface_hub import is_offline_mode

        argument = field.removesuffix("_init_kwargs")
        flag = "model_name_or_path" if argument == "model" else argument
        offline = (" HF_HUB_OFFLINE is set: only a local folder or a model already in the Hub cache loads (unset it, "
                   "or download the model first)." if is_offline_mode() else "")
        raise OSError(f"{argument}={model!r} (the trainer's {argument} argument; hf-seqrl train --{flag}), loaded with "
                      f"{type(args).__name__}.{field}, could not be loaded: {err}{offline} Pass a local folder, a Hub "
                      "id that exists, or the model itself.") from err


def check_model_family(family, supported: tuple[str, ...], trainer: str) -> None:
    """Raises a clear error unless `family` (from `hf_seqrl.models.family_for`) is one that `trainer` supports."""
    if family.name not in supported:
        kinds = {"seq2seq": "encoder-decoder (AutoModelForSeq2SeqLM)", "causal": "decoder-only (AutoModelForCausalLM)"}
        raise ValueError(f"{trainer} supports {' and '.join(kinds[k] for k in supported)} models only; got a "
                         f"{kinds[family.name]} model.")


def warn_half_precision_weights(model, args, trainer: str) -> bool:
    """Logs a warning (once per trainer) and returns True when `model`'s trainable weights are bf16 or fp16: the
    optimizer then updates them in that precision (no fp32 master copy), where small updates round away. Loading in
    float32 and training with `bf16=True` (autocast) keeps fp32 weights."""
    import torch

    dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
    half = sorted(str(d).replace("torch.", "") for d in dtypes & {torch.bfloat16, torch.float16})
    if not half:
        return False
    logger.warning(
        f"{trainer}: the trainable weights are {', '.join(half)}, so the optimizer updates them in {half[0]} with no "
        "fp32 master copy, and updates smaller than the weights' rounding step are lost. Load the model in float32 "
        "(from_pretrained(..., dtype=torch.float32), or model_init_kwargs={'dtype': 'float32'}) and set "
        f"{type(args).__name__}(bf16=True) to compute in bf16 with fp32 weights; a LoRA adapter's own weights are "
        "float32 unless the base's dtype is forced on them.")
    return True


def check_not_empty(dataset, name: str) -> None:
    """Raises a clear error when `dataset` (a sized dataset; None and iterables are left alone) has no rows."""
    if dataset is not None and hasattr(dataset, "__len__") and len(dataset) == 0:
        raise ValueError(f"{name} has 0 rows, so there is nothing to train or evaluate on: check the file or split "
                         "it came from, and any filter or select applied before the trainer.")


def prepare_datasets(train_dataset, eval_dataset, family, tokenizer, args, start_id, model=None, trainer=None,
                     compute_metrics=None):
    """Returns `(train_dataset, eval_dataset)` as the Trainer takes them: each split checked not empty, text columns
    tokenized for the model family (`tokenize_text_dataset`; `start_id` the labels' start token; the evaluation
    splits' targets from `eval_target_column` when set), the train split's columns and every split's rows checked,
    with `model` their ids too (`vocabulary_sizes`). `eval_dataset` may be a dict of named splits. With `trainer` (the
    trainer being built) and its `compute_metrics`, a split of sources alone is taken where no setting reads its
    targets (`references.run_target_settings`), refused naming those settings otherwise; without, targets are
    needed."""
    named = eval_dataset.items() if isinstance(eval_dataset, dict) else [("eval_dataset", eval_dataset)]
    for name, data in (("train_dataset", train_dataset), *named):
        check_not_empty(data, name)
    train_reasons, eval_reasons = (None, None) if trainer is None else run_target_settings(trainer, args,
                                                                                            compute_metrics)
    train_dataset = tokenize_text_dataset(train_dataset, "train_dataset", family, tokenizer, args, start_id,
                                          target_reasons=train_reasons)
    evaluated = {name: tokenize_text_dataset(data, name, family, tokenizer, args, start_id, evaluation=True,
                                             target_reasons=eval_reasons)
                 for name, data in named}
    vocabulary = None if model is None else min(vocabulary_sizes(model).values(), default=None)
    if train_dataset is not None:
        check_dataset_columns(train_dataset, "train_dataset", family, train_reasons)
        check_rows(train_dataset, "train_dataset", vocabulary=vocabulary)
    for name, data in evaluated.items():
        if data is not None:
            if eval_reasons:  # a tokenized split without targets, for settings that read them
                check_dataset_columns(data, name, family, eval_reasons)
            check_rows(data, name, vocabulary=vocabulary)
    return train_dataset, evaluated if isinstance(eval_dataset, dict) else evaluated["eval_dataset"]


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


# The ids a model's configs feed it or its decode forces or bans: (config attribute, what it is).
CONFIG_IDS = (("decoder_start_token_id", "the decoder start token"), ("pad_token_id", "the pad token"),
              ("eos_token_id", "the EOS token"), ("bos_token_id", "the BOS token"),
              ("forced_bos_token_id", "the forced first token"), ("forced_eos_token_id", "the forced last token"),
              ("suppress_tokens", "a banned token"), ("begin_suppress_tokens", "a token banned first"),
              ("bad_words_ids", "a banned token"))


def _ids(value) -> list[int]:
    """Returns the ints in `value` (an id, a list of ids, a list of lists of ids, or None)."""
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [i for item in value for i in _ids(item)]


def vocabulary_sizes(model) -> dict[str, int]:
    """Returns the number of rows of each embedding matrix the model reads ids through, and the width of its output
    layer: `{"input embedding": ..., "decoder embedding": ..., "output layer": ...}` (the entries it has; the input
    embedding is an encoder-decoder's encoder's, or a decoder-only model's)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    sizes = {}
    embeddings = inner.get_input_embeddings()
    if embeddings is not None:
        sizes["input embedding"] = embeddings.num_embeddings
    decoder = inner.get_decoder() if getattr(inner.config, "is_encoder_decoder", False) else None
    decoder_embeddings = decoder.get_input_embeddings() if decoder is not None else None
    if decoder_embeddings is not None:
        sizes["decoder embedding"] = decoder_embeddings.num_embeddings
    head = inner.get_output_embeddings()
    if head is not None:
        sizes["output layer"] = getattr(head, "out_features", None) or head.weight.shape[0]
    return sizes


def largest_tokenizer_id(tokenizer) -> tuple[int, str]:
    """Returns the largest id `tokenizer` can write and what it is: `len(tokenizer) - 1`, or the id of a special,
    added or language token past it (an M2M100 tokenizer's `__en__` ... lie past `len(tokenizer)`, in its
    `lang_token_to_id`; a prefix or suffix token it writes around every text counts too)."""
    found = {len(tokenizer) - 1: f"the last of its {len(tokenizer)} tokens"}
    named = [(getattr(tokenizer, "all_special_ids", None) or [], "special token"),
             (getattr(tokenizer, "added_tokens_decoder", None) or {}, "added token"),
             *[(getattr(tokenizer, side, None) or [], f"one of its {side}")
               for side in ("prefix_tokens", "suffix_tokens")]]
    for ids, what in named:
        for token_id in ids:
            if isinstance(token_id, int) and token_id not in found:
                found[token_id] = f"{what} {tokenizer.convert_ids_to_tokens(token_id)!r}"
    for attribute, table in vars(tokenizer).items():  # lang_code_to_id, lang_token_to_id, fairseq_tokens_to_ids, ...
        if attribute.endswith(("_to_id", "_to_ids")) and isinstance(table, dict):
            for key, token_id in table.items():
                if isinstance(token_id, int) and token_id not in found:
                    found[token_id] = f"{key!r} of its {attribute}"
    top = max(found)
    return top, found[top]


def check_token_ids(tokenizer, model, trainer: str) -> None:
    """Raises a clear error, naming the id and the fix, when an id the trainer will feed the model or its decode will
    force or ban is outside the model's embedding matrices or output layer: every id the tokenizer can write
    (`largest_tokenizer_id`), and every special, forced and banned id of the model's config and generation config.
    Unchecked, such an id fails at the first step inside `torch.embedding` ("index out of range in self"). A model
    larger than its tokenizer (T5's padded vocabulary) is fine."""
    sizes = vocabulary_sizes(model)
    if not sizes:
        return
    where, size = min(sizes.items(), key=lambda item: item[1])
    tokens = len(tokenizer)
    if tokens > size:
        raise ValueError(
            f"{trainer}: the tokenizer ({type(tokenizer).__name__}) has {tokens} tokens, but the model's {where} has "
            f"{size} rows, so ids {size}..{tokens - 1} would fail at the first step. Use the model's own tokenizer, "
            f"or grow the model with model.resize_token_embeddings(len(tokenizer)) before building the trainer.")
    top, what = largest_tokenizer_id(tokenizer)
    if top >= size:
        raise ValueError(
            f"{trainer}: the tokenizer ({type(tokenizer).__name__}) writes ids up to {top} ({what}), past "
            f"len(tokenizer) = {tokens}, but the model's {where} has {size} rows (ids 0..{size - 1}), so those ids "
            f"would fail at the first step. Grow the model with model.resize_token_embeddings({top + 1}) before "
            f"building the trainer (len(tokenizer) leaves those tokens out), or build it with vocab_size={top + 1}.")
    special = {f"the tokenizer's {name}": getattr(tokenizer, name, None)
               for name in ("pad_token_id", "eos_token_id", "bos_token_id", "unk_token_id")}
    for source, config in (("model.config", model.config), ("model.generation_config",
                                                             getattr(model, "generation_config", None))):
        for name, role in CONFIG_IDS:
            for token in _ids(getattr(config, name, None)):
                if not 0 <= token < size:
                    raise ValueError(
                        f"{trainer}: {source}.{name}={token} ({role}) is outside the model's {where} of {size} rows "
                        f"(ids 0..{size - 1}). Set {name} on model.config and model.generation_config to an id the "
                        "model has (the tokenizer's own special ids, e.g. processing_class.pad_token_id), or resize "
                        "the model's embeddings.")
    for name, token in special.items():
        if token is not None and not 0 <= token < size:
            raise ValueError(f"{trainer}: {name}={token} is outside the model's {where} of {size} rows: use the "
                             "model's own tokenizer or resize the model's embeddings.")


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
