"""Running out of device memory, as one line: the phase that ran out, what it asked for, and what would fit.

The memory estimate (metrics/memory.py) refuses what it knows cannot fit before anything is allocated;
this is for what still runs out (fragmentation, another process on the GPU, a workspace the estimate
does not count). Each phase of a run (load, prefill, graph capture, decode) runs inside `memory_phase`,
which turns the allocator's error into a DeviceOutOfMemoryError, a user error the CLI prints as one line
with exit 2; the run directory is then left as any failed run leaves it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sfibench.core.errors import UsageError

# What the CUDA runtime, cuBLAS and the CPU allocator say when an allocation fails outside torch's
# caching allocator (which raises torch.OutOfMemoryError itself).
_OUT_OF_MEMORY = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "can't allocate memory")


class DeviceOutOfMemoryError(UsageError):
    """A phase of the run ran out of device memory; the message names the phase, what it asked and what fits."""


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(error, RuntimeError) and any(text in str(error) for text in _OUT_OF_MEMORY))


class memory_phase:  # noqa: N801 - used as `with memory_phase(...)`, like a function
    """`with memory_phase("prefill", asked, fits):` - an allocation failing in the body becomes one
    DeviceOutOfMemoryError: "out of memory on the device during prefill: <asked()> did not fit; <fits()>".

    `asked` and `fits` are called only after a failure, once the failed phase's tensors are released (so
    what `fits` measures as free is free). The innermost phase names a failure; enclosing ones pass it on.
    """

    def __init__(self, phase: str, asked: Callable[[], str], fits: Callable[[], str]):
        self.phase, self.asked, self.fits = phase, asked, fits

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if error is None or isinstance(error, DeviceOutOfMemoryError) or not is_out_of_memory(error):
            return False
        # The traceback holds the frames of the failed phase and, through them, its tensors; drop it so they
        # are freed before `fits` looks at free memory.
        error.__traceback__ = None
        del traceback
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        raise DeviceOutOfMemoryError(f"out of device memory during {self.phase}: {self.asked()} did not fit; "
                                     f"{self.fits()}") from None
