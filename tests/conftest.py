"""Fixtures shared by the test suite. The real smollm2-135m model is loaded once per session.

Without CUDA the Triton kernels run in Triton's interpreter on CPU tensors. The interpreter is chosen
when a kernel is decorated, i.e. when its module is first imported, so the variable is set here, before
any test module imports sfibench (`setdefault`: an explicit TRITON_INTERPRET from the caller wins).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from sfibench.models.loading import load_model  # noqa: E402  (after the interpreter is chosen)


@pytest.fixture(scope="session")
def smollm2():
    torch.manual_seed(0)
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_models():
    return {name: load_model(name) for name in ("tiny-llama", "tiny-qwen2", "tiny-qwen3")}
