"""Counting what a GPU punishes, on any device: host syncs (ops that make the host wait for the device), collectives
(`torch.distributed` calls) and peak resident memory. The benchmarks print these counts and the tests hold them.

- `SyncCounter`: a `TorchDispatchMode` counting the ops that read a device value on the host or whose output shape
  depends on device values (`_local_scalar_dense` behind `.item()` / `bool()` / `int()`, `nonzero`, boolean-mask
  `index` / `index_put_`, `masked_select`, `repeat_interleave` with a tensor of repeats, `equal`, `unique`), each
  attributed to the innermost library on the Python stack: hf-seqrl's own code or transformers'.
- `CollectiveCounter`: wraps the `torch.distributed` functions that sharded models and lockstep decodes call.
- `resident_peak_bytes` / `reset_resident_peak`: the process's VmHWM (Linux), which `clear_refs` resets.
"""

from __future__ import annotations

import collections
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = frozenset({"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default",
                      "aten.repeat_interleave.Tensor", "aten._unique2.default", "aten.unique_consecutive.default",
                      "aten.equal.default", "aten.unique_dim.default"})
INDEX_OPS = ("aten.index.Tensor", "aten.index_put")
LIBRARIES = (("hf_seqrl", f"{os.sep}hf_seqrl{os.sep}"), ("transformers", f"{os.sep}transformers{os.sep}"))


def is_sync(func, args) -> bool:
    """Returns whether the aten op `func` called with `args` makes the host wait for the device."""
    name = str(func)
    if name in SYNC_OPS:
        return True
    if name.startswith(INDEX_OPS) and len(args) > 1 and isinstance(args[1], (list, tuple)):
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)
    return False


def call_site() -> str:
    """Returns the library of the innermost Python frame that belongs to hf-seqrl or transformers ("other" for
    neither: torch itself, the caller's code)."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        for library, marker in LIBRARIES:
            if marker in filename:
                return library
        frame = frame.f_back
    return "other"


class SyncCounter(TorchDispatchMode):
    """Counts host syncs while `active` (a context: `with counter.counting(): ...` inside `with counter:`), by the
    library whose code called the op (`by_site`), and where in it (`by_frame`: `library:file:line`)."""

    def __init__(self):
        super().__init__()
        self.active = False
        self.by_site: collections.Counter = collections.Counter()
        self.by_frame: collections.Counter = collections.Counter()

    @property
    def total(self) -> int:
        return sum(self.by_site.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.active and is_sync(func, args):
            site = call_site()
            self.by_site[site] += 1
            self.by_frame[library_frame(site)] += 1
        return func(*args, **(kwargs or {}))

    def counting(self):
        return _Switch(self)


class _Switch:
    def __init__(self, counter):
        self.counter = counter

    def __enter__(self):
        self.counter.active = True

    def __exit__(self, *exc):
        self.counter.active = False


def library_frame(site: str) -> str:
    """Returns `site:file:line` of the innermost frame of library `site` on the stack ("other" for neither)."""
    markers = dict(LIBRARIES)
    frame = sys._getframe(2)
    while frame is not None and site in markers:
        if markers[site] in frame.f_code.co_filename:
            return f"{site}:{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return site


COLLECTIVES = ("all_gather_into_tensor", "all_gather", "all_reduce", "reduce_scatter_tensor", "broadcast",
               "all_to_all_single", "barrier")
# Where sharded models call their collectives without going through `torch.distributed`'s module attributes: FSDP2
# gathers a module's shards with `foreach_all_gather` (counted as one all_gather), and DeepSpeed's backend calls the
# `torch.distributed` functions it bound when it started (its methods, counted by their names).
FSDP2_GATHERS = ("torch.distributed.fsdp._fully_shard._fsdp_collectives",
                 "torch.distributed.fsdp._fully_shard._fsdp_param_group")
DEEPSPEED_BACKEND = ("deepspeed.comm.torch", "TorchBackend")
DEEPSPEED_COLLECTIVES = ("all_gather_into_tensor", "all_gather", "all_gather_coalesced", "all_reduce",
                         "inference_all_reduce", "reduce_scatter_tensor", "broadcast", "all_to_all_single", "barrier")


class CollectiveCounter:
    """Within the context, counts the calls of each collective (`counts`), made by any code: `torch.distributed`'s
    functions, FSDP2's gathers (`FSDP2_GATHERS`) and DeepSpeed's backend (`DEEPSPEED_BACKEND`), where they are
    loaded. A collective that calls another counts once, by its outermost name."""

    def __init__(self):
        self.counts: collections.Counter = collections.Counter()
        self._saved: list[tuple[object, str, object]] = []
        self._depth = 0

    def _wrap(self, owner, attribute: str, name: str) -> None:
        original = getattr(owner, attribute, None)
        if original is None:
            return
        self._saved.append((owner, attribute, original))

        def counted(*args, **kwargs):
            if self._depth == 0:
                self.counts[name] += 1
            self._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1

        setattr(owner, attribute, counted)

    def __enter__(self):
        import torch.distributed as dist

        for name in COLLECTIVES:
            self._wrap(dist, name, name)
        for module in FSDP2_GATHERS:
            if module in sys.modules:
                self._wrap(sys.modules[module], "foreach_all_gather", "all_gather")
        module, backend = DEEPSPEED_BACKEND
        if module in sys.modules:
            for name in DEEPSPEED_COLLECTIVES:
                self._wrap(getattr(sys.modules[module], backend), name, name)
        return self

    def __exit__(self, *exc):
        for owner, attribute, original in reversed(self._saved):
            setattr(owner, attribute, original)
        self._saved.clear()


def _status(field: str) -> int | None:
    """Returns a `/proc/self/status` memory field (VmRSS, VmHWM) in bytes, or None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_resident_peak() -> int | None:
    """Resets the process's peak resident memory to its current resident memory (Linux `clear_refs`) and returns that
    (bytes); None where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _status("VmRSS")


def resident_peak_bytes() -> int:
    """Returns the process's peak resident memory in bytes: VmHWM, else `ru_maxrss` (no `/proc`)."""
    import resource

    peak = _status("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
