"""Metrics: byte model and roofline, statistics, memory estimate, timers and the NVML sampler.

Expected values are worked out by hand in the comments, independently of the code under test.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

from sfibench.core.device import available_device_memory
from sfibench.metrics.bytes_model import (
    embedding_gather_bytes,
    kv_append_bytes,
    kv_read_bytes,
    roofline_ratio,
    step_bytes,
    weight_bytes,
)
from sfibench.metrics.nvml import NvmlSampler, best_energy, energy_per_token
from sfibench.metrics.stats import percentiles, spread
from sfibench.metrics.timing import StepTimer, measure_copy_bandwidth, time_region
from sfibench.models.presets import get_preset
from sfibench.sfi.config import SFIConfig
from sfibench.sfi.geometry import candidates
from sfibench.sfi.traffic import refresh_bytes

# tiny-llama: vocab 320, hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV heads, head_dim 16, tied.
TINY = get_preset("tiny-llama")


# ---------------------------------------------------------------- bytes model


def test_weight_bytes_tiny_tied():
    # per layer: q 64*64 + k 64*32 + v 64*32 + o 64*64 = 12288; MLP 3*64*128 = 24576; 2 norms = 128
    per_layer = 4096 + 2048 + 2048 + 4096 + 24576 + 128  # 36992
    # 2 layers + final norm 64 + LM head 320*64 (tied: the embedding table is that same matrix)
    params_read = 2 * per_layer + 64 + 320 * 64  # 94528
    assert weight_bytes(TINY, dtype_bytes=2) == params_read * 2 == 189056


def test_weight_bytes_untied_excludes_embedding_table():
    untied = dataclasses.replace(TINY, tie_word_embeddings=False)
    # The untied table (320*64 more params) is stored but only one row per sequence is gathered.
    assert untied.num_params() == 94528 + 320 * 64
    assert weight_bytes(untied, dtype_bytes=2) == 189056
    assert embedding_gather_bytes(untied, batch=3, dtype_bytes=2) == 3 * 64 * 2


def test_kv_read_bytes_scalar_and_arrays():
    per_token = 2 * 16 * 2  # K and V, head_dim 16, 2 bytes = 64 bytes per (layer, head, sequence)
    # scalar 10 tokens, 2 layers x 2 heads x 3 sequences
    assert kv_read_bytes(TINY, 10, batch=3, dtype_bytes=2) == 10 * 2 * 2 * 3 * per_token == 7680
    # [layers, kv_heads], same for both sequences: (1+2+3+4) * 2 sequences
    assert kv_read_bytes(TINY, [[1, 2], [3, 4]], batch=2) == 20 * per_token == 1280
    # [layers, batch, kv_heads]: 0+1+...+7 = 28
    per_sequence = torch.arange(8).reshape(2, 2, 2)
    assert kv_read_bytes(TINY, per_sequence, batch=2) == 28 * per_token == 1792
    # fractional mean tokens are allowed
    assert kv_read_bytes(TINY, 2.5, batch=1) == 2.5 * 4 * per_token


def test_kv_read_bytes_rejects_bad_shapes():
    with pytest.raises(ValueError, match="layers, kv_heads"):
        kv_read_bytes(TINY, np.ones((3, 2)), batch=1)
    with pytest.raises(ValueError, match="layers, batch, kv_heads"):
        kv_read_bytes(TINY, np.ones((2, 5, 2)), batch=2)
    with pytest.raises(ValueError, match="non-negative"):
        kv_read_bytes(TINY, -1, batch=1)


def test_refresh_bytes_by_hand():
    # G = 4 / 2 = 2 evidence rows; C = 100 candidates, K = min(40, 100) = 40
    evidence = 2 * 2 * 100 * 4  # written by the dense pass, read by the Selector: 1600
    norms = 100 * 4  # 400
    selection = 40 * 8  # int64 positions: 320
    rebuild = 2 * 40 * (2 * 16 * 2)  # optimized: read + write the K and V rows: 5120
    per_layer_head = evidence + norms + selection + rebuild  # 7440
    assert refresh_bytes(TINY, 100, k_head=40, batch=1) == per_layer_head * 2 * 2 == 29760
    assert refresh_bytes(TINY, 100, k_head=40, batch=1, layers_refreshed=1) == 14880
    # a second sequence with C = 30 < k_head selects all 30: 480 + 120 + 240 + 3840 = 4680
    assert refresh_bytes(TINY, [100, 30], k_head=40, batch=2) == (7440 + 4680) * 4
    # the reference path reads K over the candidates again instead of building a compact copy
    second_k_read = 100 * 16 * 2
    assert refresh_bytes(TINY, 100, 40, 1, path="reference") == (1600 + 400 + 320 + second_k_read) * 4
    with pytest.raises(ValueError, match="unknown path"):
        refresh_bytes(TINY, 100, 40, 1, path="fast")


def test_step_bytes_sums_parts():
    parts = step_bytes(TINY, 10, batch=3, dtype_bytes=2, refresh=100.0)
    assert parts.weights == 189056
    assert parts.kv_read == 7680
    assert parts.kv_append == kv_append_bytes(TINY, 3) == 3 * 2 * 2 * (2 * 16 * 2 + 4) == 816
    assert parts.embedding_gather == 384
    assert parts.total == 189056 + 7680 + 816 + 384 + 100
    assert parts.to_dict()["total"] == parts.total


def test_sfi_geometry():
    sfi = SFIConfig()  # sinks 4, recent 256, k_head 2048, page 16
    assert sfi.tokens_read(1000) == 1000  # too short: dense
    assert sfi.tokens_read(8192) == 4 + 2048 + 256
    # L = 8200: recent_start = floor(7944 / 16) * 16 = 7936, so the window holds 264 tokens
    assert candidates(8200, sfi) == 7936 - 4
    assert sfi.tokens_read(8200) == 4 + 2048 + 264


def test_roofline_ratio_by_hand():
    # dense step: 100 + 2 * 50 = 200; SFI: 100 + 2 * 10 + 200 / 20 = 130
    assert roofline_ratio(100, 50, 10, batch=2, n_slow=20) == pytest.approx(200 / 130)
    assert roofline_ratio(100, 50, 10, batch=2, n_slow=float("inf")) == pytest.approx(200 / 120)
    with pytest.raises(ValueError):
        roofline_ratio(100, 50, 10, batch=2, n_slow=0)


# ---------------------------------------------------------------- stats


def test_percentiles_linear_interpolation():
    # 1..10: p50 at rank 4.5 -> 5.5; p90 at rank 8.1 -> 9.1; p99 at rank 8.91 -> 9.91
    out = percentiles(range(1, 11))
    assert out == pytest.approx({"p50": 5.5, "p90": 9.1, "p99": 9.91, "max": 10.0, "mean": 5.5, "n": 10})


def test_spread_by_hand():
    # sorted 1, 2, 3, 4: median 2.5, range 3, p25 at rank 0.75 -> 1.75, p75 at rank 2.25 -> 3.25
    out = spread([3.0, 1.0, 2.0, 4.0])
    assert out == pytest.approx({"median": 2.5, "min": 1.0, "max": 4.0, "rel_spread": 1.2, "iqr": 1.5, "n": 4})
    assert spread([0.0, 0.0])["rel_spread"] == 0.0


def test_stats_reject_empty():
    with pytest.raises(ValueError, match="empty"):
        percentiles([])
    with pytest.raises(ValueError, match="empty"):
        spread(x for x in ())


# ---------------------------------------------------------------- memory


def test_available_device_memory_cpu():
    assert available_device_memory("cpu") > 0


# ---------------------------------------------------------------- timers and sampler


def test_time_region_cpu_returns_repeats():
    calls = []
    seconds = time_region(lambda: calls.append(time.sleep(0.001)), "cpu", warmup=2, repeats=3)
    assert len(seconds) == 3 and all(isinstance(s, float) and s > 0 for s in seconds)
    assert len(calls) == 5
    with pytest.raises(ValueError):
        time_region(lambda: None, "cpu", repeats=0)


def test_step_timer_cpu_groups_by_kind_and_drops_failed_steps():
    timer = StepTimer("cpu")
    for kind in ("fast", "fast", "slow"):
        with timer.step(kind):
            time.sleep(0.001)
    with pytest.raises(RuntimeError), timer.step("fast"):
        raise RuntimeError("step failed")
    grouped = timer.by_kind()
    assert [len(grouped["fast"]), len(grouped["slow"])] == [2, 1]
    assert all(s > 0 for s in grouped["fast"] + grouped["slow"])
    assert [kind for kind, _ in timer.durations()] == ["fast", "fast", "slow"]


def test_copy_bandwidth_cpu_positive():
    assert measure_copy_bandwidth("cpu", nbytes=1 << 20, repeats=3) > 0


def test_nvml_sampler_never_raises():
    with NvmlSampler(interval_s=0.01) as sampler:
        time.sleep(0.03)
    summary = sampler.summary()
    if not summary["available"]:
        assert summary["reason"]
    else:
        assert summary["samples"] >= 2


def test_energy_prefers_the_driver_counter():
    # The counter read 338 J where the lagging power samples integrate to 264 J: 338 J / 400 tokens.
    both = {"energy_j": 264.0, "energy_j_counter": 338.0}
    assert best_energy(both) == (338.0, "energy counter")
    assert energy_per_token(both, 400) == {"joules_per_token": 0.845, "joules_per_token_from": "energy counter"}
    only_samples = {"energy_j": 264.0, "energy_j_counter": None}
    assert energy_per_token(only_samples, 400)["joules_per_token_from"] == "integrated power samples"
    assert energy_per_token({"available": False, "reason": "no GPU"}, 400) == {}


def test_nvml_sampler_unstarted_summary():
    assert NvmlSampler().summary() == {"available": False, "reason": "sampler was never started"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_timers_and_sampler():
    x = torch.randn(4096, 4096, device="cuda")
    assert len(time_region(lambda: x @ x, "cuda", warmup=1, repeats=3)) == 3
    timer = StepTimer("cuda")
    with NvmlSampler(interval_s=0.01) as sampler:
        for _step in range(5):
            with timer.step("fast"):
                x @ x
    assert len(timer.by_kind()["fast"]) == 5 and all(s > 0 for s in timer.by_kind()["fast"])
    assert measure_copy_bandwidth("cuda", nbytes=64 << 20) > 0
    assert sampler.summary()["available"]
