"""Background sampling of GPU power, clocks and memory through NVML, for energy per token.

`NvmlSampler` polls NVML from a daemon thread at a fixed interval while a run decodes. NVML reads are
host-side driver queries, so they do not touch the CUDA stream being timed. On a machine without
NVML (no driver, no `pynvml`, no GPU) the sampler does nothing and its summary says why; it never
raises, because a missing power meter must not stop a throughput run.

Two energy figures are reported. `energy_j` integrates the sampled power (trapezoid rule); recent
drivers report power averaged over about a second, so it lags short bursts. `energy_j_counter` is
the driver's cumulative energy counter (Volta and newer) read at start and stop; prefer it when
present. On an H200, a 0.4 s matmul burst read 64 J integrated against 198 J from the counter; the
lag matters less the longer the run is compared with the averaging window.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

import numpy as np
from typing_extensions import Self

_FIELDS = ("power_w", "sm_clock_mhz", "mem_clock_mhz", "memory_used_bytes")


def _nvml_handle(pynvml, cuda_index: int):
    """NVML numbers every GPU on the host; CUDA numbers only the visible ones. Map the latter."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if cuda_index < len(entries):
        entry = entries[cuda_index]
        if entry.isdigit():
            return pynvml.nvmlDeviceGetHandleByIndex(int(entry))
        if entry.startswith(("GPU-", "MIG-")):
            return pynvml.nvmlDeviceGetHandleByUUID(entry)
    return pynvml.nvmlDeviceGetHandleByIndex(cuda_index)


def best_energy(summary: dict) -> tuple[float | None, str | None]:
    """(joules, which figure) from a sampler summary: the driver's counter when it was read, else the
    integrated power samples (see the module docstring for why the counter is trusted first)."""
    if summary.get("energy_j_counter") is not None:
        return summary["energy_j_counter"], "energy counter"
    if summary.get("energy_j") is not None:
        return summary["energy_j"], "integrated power samples"
    return None, None


def energy_per_token(summary: dict, tokens: int) -> dict:
    """{"joules_per_token", "joules_per_token_from"} for `tokens` generated while sampling, or {}."""
    joules, source = best_energy(summary)
    return {"joules_per_token": joules / tokens, "joules_per_token_from": source} if joules else {}


def _trapezoid(values: np.ndarray, times: np.ndarray) -> float:
    return float(np.sum((values[1:] + values[:-1]) / 2 * np.diff(times)))


class NvmlSampler:
    """Samples one GPU every `interval_s` seconds between `start()` and `stop()`.

        with NvmlSampler(device_index=0) as sampler:
            run_decode()
        sampler.summary()  # {"available": True, "power_w_mean": ..., "energy_j": ..., ...}
    """

    def __init__(self, device_index: int = 0, interval_s: float = 0.05):
        self.device_index = device_index
        self.interval_s = interval_s
        self.reason: str | None = None  # why sampling is unavailable, None while it works
        self._times: list[float] = []
        self._samples: dict[str, list[float | None]] = {name: [] for name in _FIELDS}
        self._energy_mj: list[int] = []  # the driver's cumulative energy counter at start and stop
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._handle = None

    def _open(self) -> None:
        try:
            import pynvml
        except ImportError as error:
            self.reason = f"NVML unavailable: nvidia-ml-py is not installed ({error})"
            return
        try:
            pynvml.nvmlInit()
            self._handle = _nvml_handle(pynvml, self.device_index)
        except pynvml.NVMLError as error:  # no driver, no device, or no such index
            self.reason = f"NVML unavailable: {type(error).__name__}: {error}"
            return
        self._nvml = pynvml

    def _query(self, name: str, *args):
        """One NVML reading, or None when this GPU does not support it (e.g. power on some boards)."""
        try:
            return getattr(self._nvml, name)(self._handle, *args)
        except self._nvml.NVMLError:
            return None

    def _sample(self) -> None:
        nvml = self._nvml
        power_mw = self._query("nvmlDeviceGetPowerUsage")
        memory = self._query("nvmlDeviceGetMemoryInfo")
        self._times.append(time.perf_counter())
        self._samples["power_w"].append(None if power_mw is None else power_mw / 1e3)
        self._samples["sm_clock_mhz"].append(self._query("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM))
        self._samples["mem_clock_mhz"].append(self._query("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_MEM))
        self._samples["memory_used_bytes"].append(None if memory is None else memory.used)

    def _record_energy_counter(self) -> None:
        energy_mj = self._query("nvmlDeviceGetTotalEnergyConsumption")  # Volta and newer
        if energy_mj is not None:
            self._energy_mj.append(energy_mj)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> Self:
        self._open()
        if self._nvml is None:
            return self
        self._stop.clear()
        self._record_energy_counter()
        self._sample()  # a sample at each end, so even a short run integrates over its whole span
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._sample()
        self._record_energy_counter()
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def summary(self) -> dict:
        if self._nvml is None or not self._times:
            return {"available": False, "reason": self.reason or "sampler was never started"}
        times = np.asarray(self._times) - self._times[0]
        out: dict = {"available": True, "samples": len(times), "interval_s": self.interval_s,
                     "duration_s": float(times[-1])}
        for name in _FIELDS:
            readings = [(t, v) for t, v in zip(times, self._samples[name]) if v is not None]
            if not readings:
                out[f"{name}_mean"] = out[f"{name}_max"] = None
                continue
            t, values = map(np.asarray, zip(*readings))
            out[f"{name}_mean"] = float(values.mean())
            out[f"{name}_max"] = float(values.max())
            if name == "power_w":
                # Energy = integral of power over time, trapezoid rule over the sample instants.
                out["energy_j"] = _trapezoid(values, t)
        out.setdefault("energy_j", None)
        out["sm_clock_mhz_min"] = min((v for v in self._samples["sm_clock_mhz"] if v is not None),
                                      default=None)
        # The driver's own energy counter, when supported; best_energy prefers it to the integral.
        out["energy_j_counter"] = ((self._energy_mj[-1] - self._energy_mj[0]) / 1e3
                                   if len(self._energy_mj) == 2 else None)
        return out
