"""Device-aware timing: CUDA events on a GPU, perf_counter on the CPU.

On CUDA, work is asynchronous: a host clock read right after a launch measures the launch, not the
kernel. CUDA events are recorded into the stream and timestamped by the GPU when it reaches them, so
they time the device work without forcing a synchronisation per region. Both helpers here record all
events first and synchronise once when the results are read, so timing never serialises the GPU.

Events are recorded on the *current* stream; work a timed region issues on a side stream is included
only if the region joins that stream back to the current one before it ends (as the dual-stream
refresh pipeline must anyway for correctness).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


def _is_cuda(device: torch.device | str) -> bool:
    return torch.device(device).type == "cuda"


def _cuda_event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)


def time_region(fn: Callable[[], object], device: torch.device | str, warmup: int = 2,
                repeats: int = 5) -> list[float]:
    """Call `fn` `warmup` times untimed, then `repeats` times; return seconds per timed call."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    if not _is_cuda(device):
        durations = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            durations.append(time.perf_counter() - start)
        return durations

    with torch.cuda.device(torch.device(device)):
        # Drain the warm-up so its tail does not land inside the first timed region.
        torch.cuda.synchronize()
        marks = []
        for _ in range(repeats):
            start, end = _cuda_event(), _cuda_event()
            start.record()
            fn()
            end.record()
            marks.append((start, end))
        torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in marks]


class StepTimer:
    """Per-step durations labelled by step kind, read back in one go.

        timer = StepTimer(device)
        for _ in range(steps):
            with timer.step("slow" if is_slow else "fast"):
                decode_one_step()
        timer.by_kind()  # {"fast": [s, ...], "slow": [s, ...]}

    A step whose body raises is dropped, not recorded.
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self._cuda = _is_cuda(self.device)
        self._pending: list[tuple[str, object, object]] = []  # (kind, start mark, end mark), unread
        self._done: list[tuple[str, float]] = []  # (kind, seconds), already resolved

    def _mark(self) -> object:
        if not self._cuda:
            return time.perf_counter()
        event = _cuda_event()
        with torch.cuda.device(self.device):
            event.record()
        return event

    @contextmanager
    def step(self, kind: str = "step") -> Iterator[None]:
        start = self._mark()
        yield
        self._pending.append((kind, start, self._mark()))

    def _resolve(self) -> None:
        if not self._pending:
            return
        if self._cuda:
            torch.cuda.synchronize(self.device)
            self._done += [(kind, start.elapsed_time(end) / 1e3) for kind, start, end in self._pending]
        else:
            self._done += [(kind, end - start) for kind, start, end in self._pending]
        self._pending.clear()

    def durations(self) -> list[tuple[str, float]]:
        """All recorded steps in order, as (kind, seconds); synchronises the device once."""
        self._resolve()
        return list(self._done)

    def by_kind(self) -> dict[str, list[float]]:
        grouped: dict[str, list[float]] = {}
        for kind, seconds in self.durations():
            grouped.setdefault(kind, []).append(seconds)
        return grouped

    def __len__(self) -> int:
        return len(self._pending) + len(self._done)


def measure_copy_bandwidth(device: torch.device | str, nbytes: int | None = None, warmup: int = 2,
                           repeats: int = 5) -> float:
    """Achievable memory bandwidth in bytes/s, from timing a contiguous device-to-device copy.

    A copy of n bytes reads n and writes n, so it moves 2n bytes; the result is 2n / median time.
    This is the practical ceiling the decode roofline is measured against (usually below the
    datasheet number). Defaults: 1 GiB on CUDA (large enough to defeat the L2 cache), 64 MiB on the
    CPU, where it measures a host memcpy and is only indicative.
    """
    device = torch.device(device)
    if nbytes is None:
        nbytes = (1 << 30) if device.type == "cuda" else (64 << 20)
    if nbytes <= 0:
        raise ValueError(f"nbytes must be positive, got {nbytes}")
    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    seconds = time_region(lambda: target.copy_(source), device, warmup=warmup, repeats=repeats)
    return 2 * nbytes / statistics.median(seconds)
