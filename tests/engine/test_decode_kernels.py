"""The kernels decode runs are chosen when a model is loaded for decode and are the loaded model's
`kernels`, which a throughput run records in results.json."""

from __future__ import annotations

import json

import torch
from tiny_runs import TINY_RUNS
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.engine import session
from sfibench.models import fused
from sfibench.models.fused import DecodeKernels
from sfibench.models.loading import load_for_decode


def test_loading_for_decode_records_the_kernels_it_chose():
    plain = load_for_decode("tiny-llama", torch.device("cpu"), torch.float32, fuse=False)
    assert plain.kernels == DecodeKernels(fused=False, norms_folded=False)
    assert plain.kernels.decode_gemv() == "cuBLAS (F.linear)"
    try:
        fused_run = load_for_decode("tiny-llama", torch.device("cpu"), torch.float32, fuse=True)
        # fusion on, norms left unfolded: folding pays only in a GPU's decode products
        assert fused_run.kernels == DecodeKernels(fused=True, norms_folded=False)
        assert "optimized/gemv.py" in fused_run.kernels.decode_gemv()
        assert "folded into the qkv products" not in fused_run.kernels.decode_gemv()
    finally:
        fused.enable_fusion(False)
    assert "folded into the qkv products" in DecodeKernels(fused=True, norms_folded=True).decode_gemv()


def test_a_throughput_run_records_the_loaded_models_kernels(tmp_path, monkeypatch):
    """The record is the model's own, not read back from the process's op table: a model that says it was
    loaded with fused kernels and folded norms is recorded so while the ops stay plain torch."""
    def loaded_with_fused_kernels(*args, **kwargs):
        loaded = load_for_decode(*args, **kwargs)
        loaded.kernels = DecodeKernels(fused=True, norms_folded=True)
        return loaded

    monkeypatch.setattr(session, "load_for_decode", loaded_with_fused_kernels)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*TINY_RUNS["throughput"], "--out", str(out)])
    assert result.exit_code == 0, result.output
    recorded = json.loads((out / "results.json").read_text())["results"]
    assert recorded["fused_elementwise"] is True and recorded["input_norms_folded"] is True
    assert recorded["decode_gemv"] == DecodeKernels(fused=True, norms_folded=True).decode_gemv()
    assert fused.ops["rms_norm"] is fused.rms_norm  # the ops the steps ran stayed plain torch
