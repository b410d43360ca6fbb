"""optimized/pdl.py's switch: which kernels launch with programmatic dependent launch, and bad values refused.
(That chains of PDL launches give serial launches' numbers is a GPU test: tests/test_gemv.py, test_graphs.py.)"""

from __future__ import annotations

import pytest
import torch

from sfibench.errors import UsageError
from sfibench.optimized import pdl


def test_off_by_default_and_never_on_the_cpu(monkeypatch):
    monkeypatch.delenv(pdl.ENV, raising=False)
    assert pdl.mode() == "0"
    for value in pdl.MODES:
        monkeypatch.setenv(pdl.ENV, value)
        for kind in ("products", "attention"):
            assert not pdl.enabled(torch.device("cpu"), kind)
            assert pdl.launch_options(torch.device("cpu"), kind) == {"PDL": False}


def test_modes_name_their_kernels():
    assert pdl.MODES["0"] == set()
    assert pdl.MODES["products"] == {"products"}
    assert pdl.MODES["1"] == {"products", "attention"}


def test_a_bad_value_is_refused_with_the_choices(monkeypatch):
    monkeypatch.setenv(pdl.ENV, "yes")
    with pytest.raises(UsageError, match="SFIBENCH_PDL='yes'.*0 = .*1 = .*products = "):
        pdl.mode()
    with pytest.raises(UsageError):
        pdl.enabled(torch.device("cpu"), "products")
    monkeypatch.setenv(pdl.ENV, "1")
    with pytest.raises(ValueError, match="unknown kernel kind"):
        pdl.enabled(torch.device("cpu"), "merge")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only description")
def test_reports_say_pdl_is_off_without_a_gpu():
    assert pdl.describe() == "off (no CUDA device)"
