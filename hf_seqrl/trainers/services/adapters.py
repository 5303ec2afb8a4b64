"""PEFT adapters (LoRA, ...) as TRL takes them: `peft_config=` wraps the model, a `PeftModel` passed in is used as
it is, and the KL reference is the same network with its adapter off (or a frozen copy of an adapter it came
with), never a second copy of the base weights. `peft` is an optional extra: imported only when an adapter is used.

A saved adapter reproduces the trained model only with the base it was trained on. The weights transformers
initialised while loading the base (a warm-started encoder-decoder's cross-attention, a new head) differ at every
load, so they train in full and are saved with the adapter (peft's `modules_to_save`); a base that nothing can load
by name (built in memory) is saved beside the adapter, in `BASE_SUBFOLDER`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

from transformers.utils import logging

REFERENCE_ADAPTER = "reference"
BASE_SUBFOLDER = "base_model"
logger = logging.get_logger(__name__)


def is_peft_model(model) -> bool:
    """Returns True for a `peft.PeftModel` (checked without importing `peft`)."""
    return any(cls.__module__.startswith("peft.") and cls.__name__ == "PeftModel" for cls in type(model).__mro__)


def base_model_name(model) -> str | None:
    """Returns the Hub id or folder the model (the base model of an adapter) was loaded from, None when it was built
    from a config."""
    if is_peft_model(model):
        name = getattr(model.peft_config.get(model.active_adapter), "base_model_name_or_path", None)
        if name:
            return name
    return getattr(model.config, "_name_or_path", None) or None


def with_adapter(model, peft_config):
    """Returns `model` wrapped with a new adapter of `peft_config` (`peft.get_peft_model`), or `model` itself when
    `peft_config` is None.

    The modules transformers initialised when it loaded `model` (`newly_initialized_modules`) join the config's
    `modules_to_save`: they train in full and are saved with the adapter. The adapter config records the folder or
    Hub id the base came from; a base with none is announced here and saved beside the adapter by `save_base_beside`.
    """
    if peft_config is None:
        if is_peft_model(model):
            warn_if_base_unloadable(model)
        return model
    if is_peft_model(model):
        raise ValueError("peft_config= was given for a model that already is a PeftModel: pass the PeftModel alone "
                         "(its adapter is trained) or the base model with peft_config.")
    try:
        from peft import get_peft_model
    except ImportError as err:
        raise ImportError("peft_config= needs the peft package: pip install 'hf-seqrl[peft]'.") from err
    new_modules = newly_initialized_modules(model)
    if new_modules:
        logger.warning(f"{len(new_modules)} modules of the model hold weights that transformers initialised instead "
                       f"of loading ({', '.join(new_modules[:4])}{', ...' if len(new_modules) > 4 else ''}): they "
                       "train in full and are saved with the adapter (peft modules_to_save), since no load of the base "
                       "gives them again.")
        saved = list(peft_config.modules_to_save or [])
        peft_config = dataclasses.replace(peft_config, modules_to_save=saved + [m for m in new_modules
                                                                                 if m not in saved])
    name = base_model_name(model)
    check_target_modules(model, peft_config)
    try:
        wrapped = get_peft_model(model, peft_config)
    except ValueError as err:  # no target_modules and no default of peft's for this model type, or a regex that misses
        if "target_modules" not in str(err) and "Target modules" not in str(err):
            raise
        raise ValueError(target_modules_error(model, peft_config, str(err))) from err
    for config in wrapped.peft_config.values():
        config.base_model_name_or_path = config.base_model_name_or_path or name
    warn_if_base_unloadable(wrapped)
    return wrapped


def linear_module_names(model) -> list[str]:
    """Returns the last name of every linear layer of `model` (`torch.nn.Linear`, transformers' `Conv1D`), each once,
    sorted: the names `target_modules` of a LoRA config takes (T5: `k, lm_head, o, q, v, wi, wo`)."""
    import torch
    from transformers.pytorch_utils import Conv1D

    return sorted({name.rpartition(".")[2] for name, module in model.named_modules()
                   if name and isinstance(module, (torch.nn.Linear, Conv1D))})


def target_modules_error(model, peft_config, problem: str) -> str:
    """Returns the message of an error in `peft_config.target_modules`: the field, its flag, `problem` and the names
    of the model's linear layers it may take."""
    return (f"peft_config.target_modules={getattr(peft_config, 'target_modules', None)!r} (hf-seqrl train "
            f"--lora_target_modules): {problem}. The linear layers of {type(model).__name__}, by the names "
            f"target_modules takes: {', '.join(linear_module_names(model))}.")


def check_target_modules(model, peft_config) -> None:
    """Raises a ValueError (`target_modules_error`) when a name in a list of `peft_config.target_modules` matches no
    module of `model`, a name or a dotted suffix as peft matches them: peft refuses a list that matches nothing, but
    wraps the modules of a list that matches some and drops the others without a word. A regex, `"all-linear"` and
    None (peft's default for the model type) are left to peft."""
    targets = getattr(peft_config, "target_modules", None)
    if targets is None or isinstance(targets, str):
        return
    names = [name for name, _ in model.named_modules()]
    missing = sorted(t for t in targets if not any(n == t or n.endswith(f".{t}") for n in names))
    if missing:
        raise ValueError(target_modules_error(model, peft_config, f"{', '.join(map(repr, missing))} "
                                                                  f"{'is' if len(missing) == 1 else 'are'} no module "
                                                                  "of the model"))


def newly_initialized_modules(model) -> list[str]:
    """Returns the names of the smallest set of modules that hold every parameter transformers initialised rather than
    loaded in `from_pretrained` (its MISSING keys), each module as large as possible while all its parameters are new;
    empty for a model built from a config (then no parameter was loaded)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    # `from_pretrained` marks what it loaded (and what it tied to a loaded weight) with `_is_hf_initialized`.
    new = {name for name, p in params.items() if not getattr(p, "_is_hf_initialized", False)}
    if not new or len(new) == len(params):
        return []
    modules = dict(model.named_modules())

    def all_new(module: str) -> bool:
        return all(f"{module}.{name}" in new for name, _ in modules[module].named_parameters(remove_duplicate=False))

    owners = set()
    for name in new:
        owner = name.rpartition(".")[0]
        while "." in owner and all_new(owner.rpartition(".")[0]):
            owner = owner.rpartition(".")[0]
        owners.add(owner)
    return sorted(m for m in owners if m and not any(m.startswith(f"{o}.") for o in owners))


def base_loadable(model) -> bool:
    """Returns True when a folder or Hub id names the base model of the adapter `model`."""
    return bool(base_model_name(model))


def warn_if_base_unloadable(model) -> None:
    """Logs a warning when nothing can load the base model of the adapter `model` (`base_loadable`)."""
    if not base_loadable(model):
        logger.warning(f"The base model of this adapter was built in memory: no folder or Hub id loads it, so the "
                       f"adapter alone cannot reproduce the trained model. save_model writes the base beside the "
                       f"adapter, in {BASE_SUBFOLDER}/, and the model card loads it from there.")


def warm_start_of(config) -> tuple[str, str] | None:
    """Returns the (encoder, decoder) checkpoints an `EncoderDecoderModel` built in memory was warm-started from
    (`from_encoder_decoder_pretrained`), or None."""
    encoder, decoder = getattr(config, "encoder", None), getattr(config, "decoder", None)
    names = [getattr(part, "_name_or_path", "") or "" for part in (encoder, decoder)]
    return tuple(names) if all(names) else None


def card_fields(model) -> dict:
    """Returns the `hf_seqrl.hub.render_model_card` fields that say where `model` (a `PeftModel` or a transformers
    model) came from and how its card loads it: `base_model`, `adapter`, `base_class` and `base_subfolder` (a base
    saved beside its adapter), `warm_start`."""
    import transformers

    adapter = is_peft_model(model)
    base = model.get_base_model() if adapter else model
    name = base_model_name(model)
    fields = dict(base_model=name, adapter=adapter)
    if not name:
        fields["warm_start"] = warm_start_of(base.config)
        if adapter:  # loaded with its own class: an Auto class would follow the adapter config to the base's name
            cls = type(base).__name__
            fields.update(base_subfolder=BASE_SUBFOLDER, base_class=cls if hasattr(transformers, cls) else None)
    return fields


def save_base_beside(accelerator, model, folder: str, should_save: bool) -> None:
    """Saves the base model of the adapter `model` in `folder/BASE_SUBFOLDER` when nothing else can load it: its
    weights as they were before training (the base layers, the original copies of `modules_to_save`). Called on every
    process (a sharded state is gathered); the processes that `should_save` write."""
    unwrapped = accelerator.unwrap_model(model)
    if not is_peft_model(unwrapped) or base_loadable(unwrapped):
        return
    state = accelerator.get_state_dict(model)
    if not should_save:
        return
    prompt_learning = unwrapped.peft_config[unwrapped.active_adapter].is_prompt_learning
    prefix = "base_model." if prompt_learning else "base_model.model."
    adapters = set(unwrapped.peft_config)
    base_state = {}
    for key, value in state.items():
        if not key.startswith(prefix) or adapters & set(key.split(".")):
            continue  # the adapter's own weights (`lora_A.default`, `modules_to_save.default`) and prompt encoders
        base_state[key[len(prefix):].replace(".base_layer.", ".").replace(".original_module.", ".")] = value
    unwrapped.get_base_model().save_pretrained(os.path.join(folder, BASE_SUBFOLDER), state_dict=base_state)


def add_reference_adapter(model) -> str | None:
    """Returns the name of a frozen copy of `model`'s active adapter (added to it) when the model came with trained
    adapter weights, None when its adapter is new (then the reference is the model with the adapter off).

    A new LoRA adapter starts as the identity (its B matrices are zero), so disabling it gives the initial model;
    an adapter trained before is part of the initial model, so the reference keeps it, frozen.
    """
    adapter = model.active_adapter
    lora_b = [p for name, p in model.named_parameters() if "lora_B" in name and f".{adapter}." in name]
    if lora_b and all(p.count_nonzero() == 0 for p in lora_b):
        return None
    model.add_adapter(REFERENCE_ADAPTER, model.peft_config[adapter])
    state = {k.replace(f".{adapter}.", f".{REFERENCE_ADAPTER}."): v for k, v in model.state_dict().items()
             if f".{adapter}." in k}
    model.load_state_dict(state, strict=False)
    activate(model, adapter, frozen=REFERENCE_ADAPTER)  # the trained adapter stays the active, trainable one
    return REFERENCE_ADAPTER


def activate(model, adapter: str, frozen: str) -> None:
    """Makes `adapter` the active adapter of `model` and keeps the adapter `frozen` out of training (peft's
    `set_adapter` marks the adapter it activates trainable)."""
    model.set_adapter(adapter)
    for name, p in model.named_parameters():
        if f".{frozen}." in name:
            p.requires_grad_(False)


@contextlib.contextmanager
def reference_of(model, reference_adapter: str | None):
    """Within the context, `model` (a `PeftModel`) computes the KL reference: its adapter off, or the frozen copy
    `reference_adapter` active."""
    if reference_adapter is None:
        with model.disable_adapter():
            yield model
        return
    active = model.active_adapter
    activate(model, reference_adapter, frozen=reference_adapter)
    try:
        yield model
    finally:
        activate(model, active, frozen=reference_adapter)
