"""The memory estimate: its parts by hand, the largest batch on a stated H200 (pure arithmetic), the
one-line refusal naming what fits, and the estimate against the CPU allocator's peak of real runs."""

from __future__ import annotations

import dataclasses
import io
import re
import sys
from pathlib import Path

import pytest
from allocator import AllocatorPeak
from no_model import ModelLoaded, forbid_model_loading
from rich.console import Console
from typer.testing import CliRunner

from sfibench import registry
from sfibench.cli import app
from sfibench.core.budget import Budget
from sfibench.engine.session import Session
from sfibench.metrics.memory import (
    GIB,
    MARGIN,
    MemoryEstimateError,
    check_fits,
    estimate_memory,
    largest_batch,
    planning_bytes,
)
from sfibench.models.presets import get_preset
from sfibench.runners import throughput as throughput_runner
from sfibench.runners.throughput import run_throughput
from sfibench.runners.throughput_run import ThroughputRun
from sfibench.runners.throughput_measure import measure, method_specs, prepare_cache
from sfibench.runners.throughput_memory import method_bytes, run_estimate
from sfibench.sfi.config import SFIConfig
from sfibench.workloads.replay import load_replay, step_inputs, take_rows

TINY = get_preset("tiny-llama")  # 2 layers, 4 heads, 2 KV heads, head_dim 16, vocab 320, 94,528 parameters
H200_BYTES = int(139.8 * GIB)  # what torch reports as an H200's memory
STEPS = 128
LONGEST = 131072 - STEPS  # `--ctx max` of the Qwen3 presets at the default GPU steps
FAMILY_METHODS = ("full_kv", "sfi", "streaming_llm", "snapkv")  # `sfibench throughput`'s default methods


def test_the_parts_by_hand():
    est = estimate_memory(TINY, batch=2, max_seq=100, dtype_bytes=2, method_token_bytes=8, method_sequence_bytes=50,
                          method_workspace_bytes=1000)
    assert est["weights"] == 94528 * 2  # no RoPE table off the GPU
    assert est["kv_cache"] == 2 * 100 * (2 * 2 * 16 * 2 * 2)  # B * S * layers*heads*dim*(K,V)*bytes
    assert est["key_norms"] == 2 * 100 * (2 * 2 * 4)  # float32 [L, B, H_kv, S]
    assert est["snapshot"] == 2 * (2 * 4 * 64 * 16 * 2 + 320 * 4)  # the last 64 prompt queries + logits
    assert est["method_state"] == 2 * (100 * 8 + 50)
    assert est["decode_workspace"] == 1000 + 2 * 320 * 4  # the method's, then a logits row per sequence
    assert est["prefill_workspace"] == 100 * 17 * 4  # synthetic: one chunk of keys widened, and their norms
    assert estimate_memory(TINY, batch=2, max_seq=100, dtype_bytes=4)["prefill_workspace"] == 100 * 4  # no widening
    assert est["workspace"] == max(est["decode_workspace"], est["prefill_workspace"])
    held = sum(est[part] for part in ("weights", "kv_cache", "key_norms", "snapshot"))
    assert est["decode_total"] == held + est["method_state"] + est["decode_workspace"]
    assert est["total"] == max(held + est["prefill_workspace"], est["decode_total"])  # the state comes after prefill
    real = estimate_memory(TINY, batch=2, max_seq=3000, dtype_bytes=2, synthetic_prefill=False, method_token_bytes=8)
    assert real["prefill_workspace"] > real["method_state"] + real["decode_workspace"]
    assert real["total"] == sum(real[part] for part in ("weights", "kv_cache", "key_norms", "snapshot",
                                                        "prefill_workspace"))
    gpu = estimate_memory(TINY, batch=2, max_seq=100, dtype_bytes=2, gpu=True)
    assert gpu["weights"] == est["weights"] + 4096 * 2 * 16 * 2  # the position table decode gathers from


def test_a_real_prefill_plans_for_one_chunk_of_one_sequence():
    """A real prefill runs one sequence at a time: its workspace does not grow with the batch."""
    one = estimate_memory(TINY, batch=1, max_seq=3000, dtype_bytes=4, synthetic_prefill=False)
    four = estimate_memory(TINY, batch=4, max_seq=3000, dtype_bytes=4, synthetic_prefill=False)
    assert one["prefill_workspace"] == four["prefill_workspace"] > one["decode_workspace"]


@pytest.mark.parametrize("model, expected", [("qwen3-0.6b", 8), ("qwen3-1.7b", 8), ("qwen3-4b", 6),
                                             ("qwen3-8b", 6), ("qwen3-14b", 4), ("qwen3-32b", 2)])
def test_the_largest_batch_at_128k_on_an_h200(model, expected):
    """`--batch max` at 128K for the default methods on both paths, planned with MARGIN of a 139.8 GiB
    H200, by arithmetic only. The KV cache alone allows as many on qwen3-4b, 8b and 32b (6, 6, 2); on
    qwen3-0.6b, 1.7b (9) and 14b (5) the optimized SFI's per-token state (a float32 evidence row per query
    head and slot, beside two compact K/V buffers per layer) takes one sequence's room."""
    dims = get_preset(model)
    cfg = ThroughputRun(model=model, contexts=[LONGEST], batches=["max"], steps=STEPS,
                           methods=[(name, path) for name, path in registry.available() if name in FAMILY_METHODS])
    specs, slots = method_specs(cfg, LONGEST), LONGEST + STEPS + 1

    def method_at(batch, max_seq):
        return method_bytes(specs, dims, 2, batch, max_seq, STEPS, synthetic=True, gpu=True)

    planned = planning_bytes(H200_BYTES, H200_BYTES)
    assert planned == int(MARGIN * H200_BYTES)
    first = estimate_memory(dims, 1, slots, 2, gpu=True, steps=STEPS, **method_at(1, slots))
    batch = largest_batch(first, planned, method_at)
    assert batch == expected
    fits = estimate_memory(dims, batch, slots, 2, gpu=True, steps=STEPS, **method_at(batch, slots))
    over = estimate_memory(dims, batch + 1, slots, 2, gpu=True, steps=STEPS, **method_at(batch + 1, slots))
    assert fits["total"] <= planned < over["total"]
    kv_only = (planned - dims.num_params() * 2) // (slots * dims.kv_bytes_per_token(2))
    assert batch <= kv_only


def test_a_shape_that_does_not_fit_is_one_line_naming_what_fits():
    est = estimate_memory(TINY, batch=4, max_seq=1000, dtype_bytes=2)
    check_fits(est, est["total"])  # exactly enough
    with pytest.raises(MemoryEstimateError) as info:
        check_fits(est, est["total"] - 1)
    message = str(info.value)
    assert "\n" not in message
    assert "batch 4 x 1,000 tokens" in message and "What fits: batch 3 at 1,000 tokens" in message
    allowed = int(message.split(" or ")[1].split(" tokens at batch 4")[0].replace(",", ""))
    assert estimate_memory(TINY, 4, allowed, 2)["total"] <= est["total"] - 1
    assert estimate_memory(TINY, 4, allowed + 1, 2)["total"] > est["total"] - 1
    with pytest.raises(MemoryEstimateError, match="weights and workspace alone do not fit"):
        check_fits(est, est["weights"])


def h200_run(tmp_path, batch: int) -> ThroughputRun:
    """qwen3-32b at `--ctx max` (as the command resolves it) of every registered method's optimized path, in
    bfloat16."""
    return ThroughputRun(model="qwen3-32b", device="cpu", dtype="bfloat16", contexts=(LONGEST,), batches=(batch,),
                         methods=tuple((name, "optimized") for name in registry.names()), steps=STEPS, repeats=1,
                         prefill="auto", graphs=False, length_bucket=256, dense_kernels=False,
                         k_head=Budget(tokens=SFIConfig.k_head), sfi=SFIConfig(), out=tmp_path / "run")


def test_qwen3_32b_at_128k_batch_8_is_refused_before_any_weight_is_allocated(tmp_path, monkeypatch):
    """The run's own check, with every method's state and workspace, on a device with an H200's memory: one
    line naming what fits with those methods, before the model loads or the run directory is claimed. A
    shape that fits passes the check and goes on to load the model."""
    forbid_model_loading(monkeypatch)
    planned = planning_bytes(H200_BYTES, H200_BYTES)
    monkeypatch.setattr(throughput_runner, "planned_before_loading", lambda device: planned)
    with pytest.raises(MemoryEstimateError) as info:
        throughput_runner.check_memory_before_loading(h200_run(tmp_path, 8))
    message, slots = str(info.value), LONGEST + STEPS + 1
    assert "\n" not in message and f"batch 8 x {slots:,} tokens" in message  # thousands separated
    fits = re.search(r"What fits: batch ([\d,]+) at ([\d,]+) tokens or ([\d,]+) tokens at batch 8\. Fix: ", message)
    assert fits and int(fits[2].replace(",", "")) == slots, message
    dims = get_preset("qwen3-32b")
    specs = method_specs(ThroughputRun(model="qwen3-32b", contexts=[LONGEST], batches=[8], steps=STEPS,
                                          methods=[(name, "optimized") for name in registry.names()]), LONGEST)

    def total(batch, max_seq):
        return estimate_memory(dims, batch, max_seq, 2, steps=STEPS,
                               **method_bytes(specs, dims, 2, batch, max_seq, STEPS, synthetic=True,
                                              gpu=False))["total"]

    batch, tokens = int(fits[1].replace(",", "")), int(fits[3].replace(",", ""))
    assert total(batch, slots) <= planned < total(batch + 1, slots)
    assert total(8, tokens) <= planned < total(8, tokens + 1)
    assert not (tmp_path / "run").exists()
    throughput_runner.check_memory_before_loading(h200_run(tmp_path, 1))  # batch 1 fits
    with pytest.raises(ModelLoaded):  # and the run goes on to load the model
        run_throughput(h200_run(tmp_path, 1), Console(file=io.StringIO()))


def test_models_prints_what_fits_in_a_named_memory_without_the_device():
    """`sfibench models --memory 139.8GiB` on this machine: a GPU's run (bfloat16, both paths, 128 steps) in an
    H200's memory. Every Qwen3 row's longest --ctx per batch fits by the estimate and one token more does not
    (or it is the model's limit), and its largest batch at 32K and at --ctx max fits and one more does not."""
    result = CliRunner().invoke(app, ["models", "--memory", "139.8GiB"], terminal_width=80)
    assert result.exit_code == 0, result.output
    planned, steps = planning_bytes(H200_BYTES, H200_BYTES), 128
    methods = list(registry.available())
    lines = {line.split()[0]: line.split()[1:] for line in result.output.splitlines() if line.startswith("qwen3-")
             and len(line.split()) == 7}
    assert len(lines) == 6, result.output
    for name, cells in lines.items():
        dims = get_preset(name)
        longest = dims.max_context - steps
        specs = method_specs(ThroughputRun(model=name, contexts=[longest], batches=[1], methods=methods,
                                              steps=steps), longest)

        def fits(batch, context):
            estimate = estimate_memory(dims, batch, context + steps + 1, 2, gpu=True, steps=steps,
                                       **method_bytes(specs, dims, 2, batch, context + steps + 1, steps,
                                                      synthetic=True, gpu=True))
            return estimate["total"] <= planned

        *prompts, at_32k, at_max = (int(cell.replace(",", "")) for cell in cells)
        for batch, tokens in zip((1, 2, 4, 8), prompts):
            assert fits(batch, tokens) and (tokens == longest or not fits(batch, tokens + 1)), (name, batch)
        for context, batch in ((32768, at_32k), (longest, at_max)):
            assert fits(batch, context) and not fits(batch + 1, context), (name, context)


def test_the_family_scripts_fit_plan_asks_only_for_what_fits(capsys):
    """benchmarks/fit_plan.py, planning in an H200's memory: the methods it names for qwen3-0.6b at 128K B=9 fit
    and those it leaves out (the ones keeping per-token state beside the cache) do not; at the context it names
    for qwen3-32b at B=3 every method fits, 1K more and one does not."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import fit_plan

    planned, steps = planning_bytes(H200_BYTES, H200_BYTES), 64

    def fits(model, method, context, batch):
        cfg = ThroughputRun(model=model, contexts=[context], batches=[batch], methods=[method], steps=steps)
        specs, dims = method_specs(cfg, context), get_preset(model)
        return estimate_memory(dims, batch, context + steps + 1, 2, gpu=True, steps=steps,
                               **method_bytes(specs, dims, 2, batch, context + steps + 1, steps, synthetic=True,
                                              gpu=True))["total"] <= planned

    fit_plan.main(["methods", "qwen3-0.6b", str(LONGEST), "9", str(steps), "--memory", "139.8GiB"])
    kept = capsys.readouterr().out.strip().split(",")
    methods = fit_plan.optimized_methods()
    fitting = [name for name, _ in methods if fits("qwen3-0.6b", (name, "optimized"), LONGEST, 9)]
    assert kept == fitting and 0 < len(kept) < len(methods)
    fit_plan.main(["context", "qwen3-32b", "3", str(steps), "--memory", "139.8GiB"])
    context = int(capsys.readouterr().out)
    assert context % 1024 == 0 and all(fits("qwen3-32b", method, context, 3) for method in methods)
    assert not all(fits("qwen3-32b", method, context + 1024, 3) for method in methods)


# (model, prefill, context, batch). tiny-qwen3 (3 layers, one KV head per query head) runs by default: a
# synthetic prefill, and a real one of two chunks (the second masked against the first). The full run adds
# tiny-llama (two query heads per KV head, all of its layers dense for Quest) and tiny-gemma3 (sliding-window
# layers beside a global one), and prompts the budget holds whole (SnapKV compresses nothing and reads the
# prompt through its tail) and of one chunk.
SHAPES = [pytest.param("tiny-qwen3", "synthetic", 3072, 2), pytest.param("tiny-qwen3", "real", 3072, 2)] + [
    pytest.param(model, prefill, context, batch, marks=pytest.mark.full)
    for model in ("tiny-llama", "tiny-gemma3") for prefill in ("synthetic", "real")
    for context, batch in ((1024, 1), (3072, 2))] + [pytest.param("tiny-qwen3", "real", 2048, 2, marks=pytest.mark.full)]


@pytest.mark.parametrize("model, prefill, context, batch", SHAPES)
@pytest.mark.parametrize("name, path", [case for case in registry.available() if case[1] == "reference"])
def test_the_estimate_is_the_cpu_allocators_peak(model, prefill, context, batch, name, path):
    """A throughput run of each method (the prefill, then the method's bootstrap and decode steps) on a tiny
    model in float32: the peak of torch's CPU allocator from before the cache is allocated to the end, plus
    the weights already held, is the estimate within 10%, each method's state and transients declared by its
    own MethodConfig. The optimized paths run Triton's interpreter here, whose buffers are not the GPU's;
    the GPU test (tests/support/test_memory_gpu.py) checks those."""
    session = Session.open(model, "cpu", dtype="float32")
    cfg = ThroughputRun(model=model, contexts=[context], batches=[batch], methods=[(name, path)],
                           steps=8, repeats=1, prefill=prefill, graphs=False)
    stream, tokenizer = load_replay(session.loaded.config.vocab_size, session.loaded.tokenizer)
    inputs = step_inputs(take_rows(stream, context, batch, cfg.steps + 1), session.device)
    specs = method_specs(cfg, context)
    with AllocatorPeak() as run:
        prefilled, synthetic, _ = prepare_cache(session, cfg, context, batch, stream, seed=0)
        for spec in specs:
            measure(session, prefilled, spec, cfg, inputs, tokenizer, context)
    assert synthetic == (prefill == "synthetic")
    weights = session.loaded.config.num_params() * 4
    estimate = run_estimate(session, specs, batch, context + cfg.steps + 1, synthetic, cfg.steps)["total"]
    assert run.peak + weights == pytest.approx(estimate, rel=0.10)


def test_a_real_prefill_plans_for_its_widest_chunk_mask():
    """The real prefill's workspace follows the prompt, not the cache: past one chunk, a chunk's additive mask
    on a global layer spans every key so far, the widest where the last whole chunk ends; a sliding layer's is
    two bands of the chunk and its window, however long the prompt."""
    qwen, gemma, chunk = get_preset("qwen3-0.6b"), get_preset("gemma3-270m"), 2048

    def workspace(cfg, prompt, steps=128):
        return estimate_memory(cfg, 1, prompt + steps + 1, 2, synthetic_prefill=False, steps=steps)["prefill_workspace"]

    assert workspace(qwen, chunk, steps=0) == workspace(qwen, chunk)  # decode steps do not widen the prompt's mask
    assert workspace(qwen, 64 * 1024) - workspace(qwen, 32 * 1024) == chunk * 32 * 1024 * 2  # bfloat16 entries
    assert workspace(qwen, 32 * 1024 + 100) == workspace(qwen, 32 * 1024)  # a short last chunk: fewer queries
    sliding = dataclasses.replace(gemma, layer_is_global=(False,) * gemma.num_layers)
    assert workspace(sliding, 8 * chunk) == workspace(sliding, 16 * chunk) < workspace(gemma, 16 * chunk)
