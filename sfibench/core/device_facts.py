"""What can be known about this machine's devices without importing torch (seconds on a busy machine).

The command line checks `--device`, GPU-only options and memory before anything heavy loads, so a bad
command fails at once. Where torch's own build settles the question (a build without CUDA or ROCm can
never see a GPU), `device_type` answers from torch's installed version file; where only a running torch
can tell (a CUDA build: is a GPU visible now?) it answers None and core/device.py asks torch.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from pathlib import Path

CUDA_NAME = re.compile(r"^cuda(?::(\d+))?$")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class DeviceUnavailableError(RuntimeError):
    """The requested device does not exist on this machine."""


def default_dtype(device_type: str) -> str:
    """`--dtype auto`: bf16 on a GPU, float32 on a CPU (where bf16 matmuls are slow and less exact)."""
    return "bfloat16" if device_type == "cuda" else "float32"


def device_type(name: str) -> str | None:
    """'cpu' or 'cuda' for `--device name` where that is known without torch, None where torch must say.

    Raises ValueError for a name that is no device, and DeviceUnavailableError for CUDA asked of a torch
    built without GPU support."""
    requested = name.strip().lower()
    if requested == "cpu":
        return "cpu"
    if requested != "auto" and CUDA_NAME.match(requested) is None:
        raise ValueError(f"unknown device {name!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N' (N = GPU index)")
    build = None if "torch" in sys.modules else torch_build()  # an imported torch answers at once itself
    if build is None or build["gpu"]:
        return None
    if requested == "auto":
        return "cpu"
    raise DeviceUnavailableError(f"device {name!r} requested but no CUDA device is visible (torch {build['version']} "
                                 "is built without CUDA); use --device cpu, or run on a GPU machine")


def torch_build() -> dict | None:
    """{'version': ..., 'gpu': whether the build has CUDA or ROCm} from torch's version.py, read as text;
    None where the file cannot be read as one."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        tree = ast.parse((Path(spec.submodule_search_locations[0]) / "version.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    values = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    if "__version__" not in values or "cuda" not in values:
        return None  # not the file this reads: let torch answer
    gpu = any(values.get(backend) for backend in ("cuda", "hip", "rocm"))
    return {"version": values["__version__"], "gpu": gpu}


def host_memory_bytes() -> int | None:
    """MemTotal from /proc/meminfo, or None where there is none."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    match = re.search(r"^MemTotal:\s*(\d+)\s*kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def host_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (psutil may be absent), else free physical pages."""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # reported in kB
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
