"""Which device a run uses, and what that device is.

`resolve_device` turns the CLI's `--device` string into a `torch.device`, failing early with a
message that says what to do when CUDA is asked for but absent. `device_info` describes the device
for results.json, so a number in a report can be traced back to the hardware that produced it;
`available_device_memory` is what a memory estimate may plan with.
Every probe here is best effort: a missing NVML, /proc or CUDA yields None, never an exception,
because losing a run over a provenance detail would be worse than a blank field.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
from pathlib import Path

import torch

from sfibench.core.device_facts import (
    CUDA_NAME,
    DeviceUnavailableError,
    host_available_bytes,
    host_memory_bytes,
)

__all__ = ["DeviceUnavailableError", "available_device_memory", "cpu_model", "device_info", "gpu_driver_version",
           "idle_cores_only", "resolve_device", "torch_threads", "total_device_memory"]


def resolve_device(name: str) -> torch.device:
    """Map "auto", "cpu", "cuda" or "cuda:N" to a device that really exists here.

    "auto" prefers CUDA so that a plain command on a GPU machine measures the GPU; on a CPU-only
    machine it quietly falls back to the CPU. An explicit CUDA request never falls back: silently
    timing the CPU instead would produce numbers that look valid but answer the wrong question.
    """
    requested = name.strip().lower()
    if requested == "auto":
        return _current_cuda_device() if torch.cuda.is_available() else torch.device("cpu")
    if requested == "cpu":
        return torch.device("cpu")

    match = CUDA_NAME.match(requested)
    if match is None:
        raise ValueError(f"unknown device {name!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N' (N = GPU index)")
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(
            f"device {name!r} requested but no CUDA device is visible (torch {torch.__version__}, "
            f"built for CUDA {torch.version.cuda}); use --device cpu, or run on a GPU machine"
        )
    if match.group(1) is None:
        return _current_cuda_device()
    index = int(match.group(1))
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceUnavailableError(
            f"device {name!r} requested but only {count} CUDA device(s) are visible "
            f"(valid: cuda:0..cuda:{count - 1}); pick one of those or use --device cuda"
        )
    return torch.device("cuda", index)


def idle_cores() -> int:
    """The cores this process may use that other work is not running on (the 1-minute load average read as
    busy cores, rounded), at least one."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        busy = round(os.getloadavg()[0])
    except OSError:  # no load average on this platform: assume an idle machine
        busy = 0
    return max(1, usable - busy)


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """torch's CPU threads set to `threads` for the block (None: torch's own count, as the process started
    with it: OMP_NUM_THREADS, else one per core), restored after."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def idle_cores_only(device: torch.device, threads: int | None = None):
    """Time CPU steps with torch's threads on the idle cores only, restoring the count after. torch's threads
    spin-wait on each other at every operator, so one thread sharing a core with another process stalls them
    all: on 2 cores with one busy, a 2-thread decode step took 50-100 ms against 2 ms with 1 thread (profiled
    steps alike), while 1 thread on an idle 2-core machine costs at most 2x. Never raises the count. `threads`
    (the user's --threads) is taken as given, on any device."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    elif device.type == "cpu":
        torch.set_num_threads(min(before, idle_cores()))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _current_cuda_device() -> torch.device:
    # An explicit index (rather than bare "cuda") keeps device equality checks and reports unambiguous.
    return torch.device("cuda", torch.cuda.current_device())


def device_info(device: torch.device | str) -> dict:
    """Describe `device` for results.json: name, memory and compute facts; CPU model for the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return {
            "type": "cuda",
            "index": index,
            "name": props.name,
            "total_memory_bytes": int(props.total_memory),
            "compute_capability": f"{props.major}.{props.minor}",
            "sm_count": int(props.multi_processor_count),
            "cuda_version": torch.version.cuda,
            "driver_version": gpu_driver_version(),
        }
    if device.type == "cpu":
        return {
            "type": "cpu",
            "name": "cpu",
            "cpu_model": cpu_model(),
            "cpu_count": os.cpu_count(),
            # The cores this process may use (cgroups/taskset), which is what bounds CPU timings.
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "torch_threads": torch.get_num_threads(),
            "total_memory_bytes": host_memory_bytes(),
        }
    return {"type": device.type, "name": str(device)}


def gpu_driver_version() -> str | None:
    """The NVIDIA driver version via NVML, or None without NVML or a driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver / no libnvidia-ml: a CPU machine, not a failure
        return None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        # Older nvidia-ml-py releases return bytes, newer ones str.
        return version.decode() if isinstance(version, bytes) else str(version)
    except pynvml.NVMLError:
        return None
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def cpu_model() -> str | None:
    """The CPU's marketing name from /proc/cpuinfo, falling back to what `platform` knows."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    # x86 says "model name"; some ARM kernels only give "Hardware" or "Model".
    for key in ("model name", "Hardware", "Model"):
        match = re.search(rf"^{key}\s*:\s*(.+)$", text, re.MULTILINE)
        if match and match.group(1).strip():
            return match.group(1).strip()
    return platform.processor() or platform.machine() or None


def total_device_memory(device: torch.device | str) -> int:
    """All of `device`'s memory in bytes: the GPU's, or the host's (0 where /proc cannot say)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return host_memory_bytes() or 0


def available_device_memory(device: torch.device | str) -> int:
    """Free bytes on `device`: CUDA's free memory on a GPU, available host memory otherwise."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return host_available_bytes()
