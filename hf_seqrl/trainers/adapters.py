"""PEFT adapters (LoRA, ...) as TRL takes them: `peft_config=` wraps the model, a `PeftModel` passed in is used as
it is, and the KL reference is the same network with its adapter off (or a frozen copy of an adapter it came
with), never a second copy of the base weights. `peft` is an optional extra: imported only when an adapter is used.
"""

from __future__ import annotations

import contextlib

REFERENCE_ADAPTER = "reference"


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
    `peft_config` is None."""
    if peft_config is None:
        return model
    if is_peft_model(model):
        raise ValueError("peft_config= was given for a model that already is a PeftModel: pass the PeftModel alone "
                         "(its adapter is trained) or the base model with peft_config.")
    try:
        from peft import get_peft_model
    except ImportError as err:
        raise ImportError("peft_config= needs the peft package: pip install 'hf-seqrl[peft]'.") from err
    return get_peft_model(model, peft_config)


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
