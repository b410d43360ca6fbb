"""Running out of memory, in any phase or before loading, is one `error:` line naming the phase and what
would fit, and leaves no run folder; a bug that is not out of memory keeps its traceback."""

from __future__ import annotations

import pytest
from refusals import one_line_error
from typer.testing import CliRunner

from sfibench.cli import app

# ------------------------------------------------------------------------------------ out of memory

THROUGHPUT = ["throughput", "--model", "tiny-llama", "--ctx", "1k", "--steps", "4", "--repeats", "1",
              "--methods", "full_kv", "--device", "cpu", "--no-dense-kernels", "--out", "run"]


def raises(error: BaseException):
    def double(*args, **kwargs):
        raise error
    return double


def cuda_oom() -> BaseException:
    import torch

    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity "
                                  "of 139.81 GiB of which 1.50 GiB is free.")


OOM_PHASES = {
    "load": ("sfibench.engine.session.load_for_decode", cuda_oom, "during load", "smaller model"),
    "prefill": ("sfibench.engine.prefill.causal_prefill_attention", cuda_oom, "during prefill",
                "lower --batch or --ctx"),
    "decode": ("sfibench.engine.driver.StepDriver._forward", cuda_oom, "during decode", "lower --batch or --ctx"),
    "decode, from the CUDA runtime": ("sfibench.engine.driver.StepDriver._forward",
                                      lambda: RuntimeError("CUDA error: out of memory"), "during decode",
                                      "tokens at batch 1"),
}


@pytest.mark.parametrize("target, error, phase, fix", OOM_PHASES.values(), ids=OOM_PHASES.keys())
def test_out_of_memory_in_a_phase_is_one_line_and_leaves_no_run(tmp_path, monkeypatch, target, error, phase, fix):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(target, raises(error()))
    result = CliRunner().invoke(app, THROUGHPUT)
    text = one_line_error(result, "out of device memory", phase, "did not fit", fix)
    assert "tiny-llama" in text
    assert list(tmp_path.iterdir()) == []


def test_a_bug_that_is_no_out_of_memory_keeps_its_traceback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sfibench.engine.driver.StepDriver._forward", raises(RuntimeError("shape mismatch")))
    result = CliRunner().invoke(app, THROUGHPUT)
    assert result.exit_code == 1 and isinstance(result.exception, RuntimeError)
    assert list(tmp_path.iterdir()) == []


def test_out_of_memory_while_capturing_a_graph_names_the_capture_and_no_graphs(monkeypatch):
    """Capture needs CUDA; the double makes the capture's first allocation (its side stream) run out."""
    import torch

    from sfibench import registry
    from sfibench.core.oom import DeviceOutOfMemoryError
    from sfibench.engine.driver import StepDriver
    from sfibench.engine.session import Session

    session = Session.open("tiny-llama", "cpu")
    prefilled = session.prefill([[5, 6, 7, 8]], 4)
    config = session.loaded.config
    method = registry.create_method(registry.spec("full_kv"), config, session.loaded.tokenizer)
    driver = StepDriver(session.loaded.model, session.cache, method)
    driver.use_graphs = True  # as on a GPU, where the first step of each plan is captured
    monkeypatch.setattr(torch.cuda, "Stream", raises(cuda_oom()))
    driver.start(prefilled)
    with pytest.raises(DeviceOutOfMemoryError) as raised:
        driver.step(prefilled.last_logits.argmax(-1))
    message = str(raised.value)
    assert "during graph capture" in message and "--no-graphs" in message and "batch 1 x 8 tokens" in message


# Every command that loads a model, run on a preset whose float32 weights (qwen3-8b: 30.5 GiB) exceed the host's
# memory, with the CPU's memory reported as 16 GiB (8 GiB free): refused in one line before any weight is allocated.
TOO_BIG = {
    "generate": ["generate", "--model", "qwen3-8b", "--max-new-tokens", "4"],
    "stability": ["stability", "--model", "qwen3-8b"],
    "quality": ["quality", "--model", "qwen3-8b", "--ctx", "2k"],
    "throughput": ["throughput", "--model", "qwen3-8b", "--ctx", "2k"],
    "profile": ["profile", "--model", "qwen3-8b", "--ctx", "2k"],
}


@pytest.mark.parametrize("args", TOO_BIG.values(), ids=TOO_BIG.keys())
def test_a_model_larger_than_the_memory_is_refused_before_loading(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sfibench.core.device_facts.host_memory_bytes", lambda: 16 << 30)
    monkeypatch.setattr("sfibench.core.device_facts.host_available_bytes", lambda: 8 << 30)
    monkeypatch.setattr("sfibench.engine.session.load_for_decode", raises(AssertionError("weights allocated")))
    result = CliRunner().invoke(app, [*args, "--device", "cpu"])
    one_line_error(result, "needs about", "weights 30.51 GiB", "only", "smaller model, a smaller dtype")
    assert list(tmp_path.iterdir()) == []
