"""The process group of a CLI run: whether a job has an accelerator, whether a group is set up, and its tear-down."""

from __future__ import annotations

import torch


def no_accelerator() -> bool:
    """Returns True when this machine has no accelerator (the processes of a job then join over gloo)."""
    accel = getattr(torch, "accelerator", None)
    return not (accel.is_available() if accel is not None else torch.cuda.is_available())


def process_group_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def destroy_process_group() -> None:
    """Destroys the default process group once no trainer uses it, joining the backend's threads.

    Gloo's worker threads release finished collectives, and with them tensors that Python no longer references. If
    that happens once the interpreter is finalizing, the thread ends inside C++ code and the process aborts
    ("terminate called without an active exception"), so the threads must be joined before exit. torch joins them
    when the group's last reference goes, and releases the GIL (which such a release may need) only if that
    reference is a Python one: if it is a DDP reducer's, the join waits, holding the GIL, on a thread that needs it.
    Hence unreachable trainers, and their DDP wrappers, are collected first; call this with no trainer of the run
    still referenced.
    """
    import gc

    from accelerate import PartialState

    gc.collect()
    PartialState().destroy_process_group()
