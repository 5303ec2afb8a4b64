"""A sharded model made whole for a decode: its weights gathered once, the decode run without collectives, then
resharded, so that ranks decode on their own (not in lockstep) and a sharded model decodes as fast as a whole one.

Under FSDP2 (`fully_shard`) every sharded module is unsharded once and kept unsharded across the decode's forwards,
then resharded. Under DeepSpeed ZeRO-3 the parameters are gathered (`deepspeed.zero.GatheredParameters`) and the
engine's per-module fetch and release hooks are off for the decode, then registered again (as TRL's
`unwrap_model_for_generation` does); the trainer registers its engine (`register_zero3`). `decode_per_layer()` keeps
the per-layer path (each forward gathers what it runs, every rank in lockstep): for a model too large to hold whole
on one device.
"""

from __future__ import annotations

import contextlib
import contextvars

from torch.distributed.fsdp import FSDPModule

_gather = contextvars.ContextVar("gather_for_decode", default=True)
_whole = contextvars.ContextVar("decoding_whole", default=False)


@contextlib.contextmanager
def decode_per_layer(per_layer: bool = True):
    """Within the context (with `per_layer`), `whole_for_decode` leaves a sharded model sharded."""
    token = _gather.set(not per_layer)
    try:
        yield
    finally:
        _gather.reset(token)


def decoding_whole() -> bool:
    """Returns whether the current decode runs on a model made whole (its forwards make no collectives)."""
    return _whole.get()


# The DeepSpeed ZeRO-3 parameter offload (the engine's module hooks) of each model a trainer registered, by id.
_zero3_offloads: dict[int, object] = {}


def register_zero3(model, engine) -> bool:
    """Records the DeepSpeed `engine` that partitions `model` (its module), so that `whole_for_decode` can gather it;
    returns whether the engine holds ZeRO-3 module hooks."""
    optimizer = getattr(engine, "optimizer", None)
    offload = getattr(optimizer, "parameter_offload", None)
    if offload is None or not hasattr(offload, "forward_hooks"):
        return False
    _zero3_offloads[id(model)] = offload
    return True


@contextlib.contextmanager
def whole_for_decode(model):
    """Within the context, `model`'s (unwrapped) weights are whole on this rank when it is sharded (FSDP2, or ZeRO-3
    with its engine registered) and `decode_per_layer` is not in force; `decoding_whole()` then says so."""
    if not _gather.get() or _whole.get():
        yield
        return
    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    offload = _zero3_offloads.get(id(model))
    if sharded:
        with _fsdp2_whole(sharded):
            yield
    elif offload is not None:
        with _zero3_whole(model, offload):
            yield
    else:
        yield


def _param_group(module):
    return module._get_fsdp_state()._fsdp_param_group


@contextlib.contextmanager
def _fsdp2_whole(modules):
    groups = [_param_group(module) for module in modules]
    # What each module does after a forward, restored as it was; the root (the first, outermost) keeps its weights
    # after a forward, as FSDP2 sets it at its lazy init (which may run only in this decode's first forward).
    kept = [None if group is None or i == 0 else group.post_forward_mesh_info for i, group in enumerate(groups)]
    for module in modules:
        module.unshard()
        module.set_reshard_after_forward(False, recurse=False)
    token = _whole.set(True)
    try:
        yield
    finally:
        _whole.reset(token)
        for module, group, after in zip(modules, groups, kept):
            if group is not None:
                group.post_forward_mesh_info = after
            module.reshard()


@contextlib.contextmanager
def _zero3_whole(model, offload):
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        for hook in (*offload.forward_hooks, *offload.backward_hooks):
            hook.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        token = _whole.set(True)
        try:
            yield
        finally:
            _whole.reset(token)
            offload._register_deepspeed_module(offload.module)
