"""Microbenchmarks run with pytest-benchmark, outside the default test run (pyproject's testpaths is tests/).

    python -m pytest benchmarks/micro --benchmark-save=NAME          # record a run under .benchmarks/
    python -m pytest benchmarks/micro --benchmark-compare            # against the last saved run
    python -m pytest benchmarks/micro --benchmark-compare=0001 --benchmark-compare-fail=median:10%
    pytest-benchmark compare                                         # table of every saved run

Each benchmark records its shape in `extra_info`, so saved histories stay readable.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def cuda_sync():
    """Time GPU work to its end: CUDA launches return before the kernel finishes."""
    return torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
