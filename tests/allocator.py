"""The CPU allocator's peak, for memory tests: torch tracks no host peak, but its profiler records every
allocation and free of a tensor's storage (the `[memory]` events), so replaying them in time order gives
the bytes live at each moment. It sees what torch's CPU allocator hands out (tensor storages, Triton's
interpreter buffers made as tensors), not Python objects or numpy arrays."""

from __future__ import annotations

import contextlib

from torch.profiler import ProfilerActivity, profile


class AllocatorPeak:
    """`with AllocatorPeak() as seen:` ... then `seen.peak` (most bytes live at once, counted from the
    block's start) and `seen.live` (bytes still live at its end)."""

    peak = 0
    live = 0

    @contextlib.contextmanager
    def _profiled(self):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            yield
        events = sorted((event.start_ns(), event.nbytes()) for event in prof.profiler.kineto_results.events()
                        if event.name() == "[memory]")
        live = peak = 0
        for _, nbytes in events:
            live += nbytes
            peak = max(peak, live)
        self.peak, self.live = peak, live

    def __enter__(self):
        self._context = self._profiled()
        self._context.__enter__()
        return self

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)
