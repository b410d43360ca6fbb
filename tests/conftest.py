"""Fixtures shared by the test suite. The real smollm2-135m model is loaded once per session."""

from __future__ import annotations

import pytest
import torch

from sfibench.models.loading import load_model


@pytest.fixture(scope="session")
def smollm2():
    torch.manual_seed(0)
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_models():
    return {name: load_model(name) for name in ("tiny-llama", "tiny-qwen2", "tiny-qwen3")}
