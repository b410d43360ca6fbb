"""Probe (GPU only, not product code): what would one kernel for attention + o_proj save at B = 1?

Issue 11's last open item is qwen3-0.6b's B = 1 steps, ~1.35x their floor: a layer is five dependent launches
(qkv, attention, o_proj, gate_up, down) against the floor's four products, and session 18 measured ~5.8 us of
each attention launch as fixed cost. The structural move left is to stop attention being a launch of its own.
This probe measures one form of it before anyone builds it into the decoder: per layer, one persistent kernel
of 16 splits x 8 KV heads = 128 programs (one per SM, all resident) that runs the split attention exactly as
the two-segment kernel does (the same @triton.jit helpers, the same in-kernel merge), waits at a grid-wide
barrier (an atomic counter; it needs every program resident, hence GPU only and B = 1 only), and then has
each program compute 8 of o_proj's 1,024 output columns plus the residual add (gemv.linear_add_squares).
A second fused variant also hints each program's o_proj rows into L2 before the attention, so the product
after the barrier reads L2. (Session 19 ran it: the fused kernel tied the separate launches or lost by
0.006 ms; reports/attention-h200/session19/README.md.)

Both chains are a qwen3-0.6b layer's launches without its norms (28 layers, each with its own weights and
cache, bf16): qkv product -> attention -> o_proj (+ residual, sums of squares) -> gate_up + SiLU -> down
(+ residual), all through the project's kernels with PDL as the decoder launches them, against the same with
the middle two fused; and, for scale, the separate chain reading 20 rows per KV head (the attention launches'
fixed cost) and with no attention launch at all (o_proj multiplies q). Each graph is replayed and timed (CUDA
events; median of repeats). Each chain's residual stream is compared with the separate one's (the fused one
must match it to bf16 rounding; the last two compute something else and say by how much).

    python benchmarks/attention_oproj_probe.py --out probe.json [--rows 2308]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from sfibench.optimized import gemv, pdl
from sfibench.optimized.bench_fast_path import _time_ms as time_ms
from sfibench.optimized.decode_attention import (
    _attend_range,
    _load_group_queries,
    _split_range,
    default_config,
)
from sfibench.optimized.split_merge import _finish_split
from sfibench.optimized.two_segment import fast_read_launch, two_segment_decode

LAYERS, KV_HEADS, GROUP, HEAD_DIM, HIDDEN, INTERMEDIATE = 28, 8, 2, 128, 1024, 3072  # qwen3-0.6b
SPLITS = 16  # fast_read_launch's choice at B = 1 on 132 SMs (checked below)


@triton.jit
def _hint_rows_into_l2(w_ptr, cols, n_in, LINE: tl.constexpr):
    """prefetch.global.L2 for every 128-byte line of weight rows `cols` (bf16: 64 elements a line)."""
    lines_per_row = n_in // LINE
    for i in range(lines_per_row):
        address = w_ptr + cols.to(tl.int64) * n_in + i * LINE
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [address],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _attend_project_kernel(q_ptr, k_ptr, v_ptr, tail_ptr, length_ptr, part_acc_ptr, part_max_ptr,
                           part_sum_ptr, done_ptr, out_ptr, w_ptr, residual_ptr, y_ptr, squares_ptr, sync_ptr,
                           num_splits, qk_scale_log2, n_out, n_in, stride_kh, stride_ks, stride_vh, stride_vs,
                           GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, MERGE_G: tl.constexpr,
                           COLS: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr,
                           PDL: tl.constexpr):
    split = tl.program_id(0)
    kv_head = tl.program_id(1).to(tl.int64)
    program = tl.program_id(1) * tl.num_programs(0) + split
    programs = tl.num_programs(0) * tl.num_programs(1)
    cols = program * COLS + tl.arange(0, COLS)
    if PREFETCH:  # weights are never written by the step: hint them before waiting for the kernel before
        _hint_rows_into_l2(w_ptr, cols, n_in, 64)
    tail = tl.load(tail_ptr).to(tl.int32)
    n_keys = tl.load(length_ptr).to(tl.int32) - tail
    start, end = _split_range(n_keys, split, num_splits, BLOCK_N)
    pdl.wait_for_inputs(PDL)

    # 1. This split's share of the attention, then its partials; the last split of the head merges them.
    q = _load_group_queries(q_ptr, 0, kv_head, 0, HEAD_DIM, 1, GROUP, BLOCK_G, HEAD_DIM, False)  # B = 1
    running_max = tl.full([BLOCK_G], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    acc, running_max, running_sum = _attend_range(
        q, acc, running_max, running_sum, k_ptr + kv_head * stride_kh, v_ptr + kv_head * stride_vh, q_ptr,
        start + tail, end + tail, stride_ks, 1, stride_vs, 1, 0, qk_scale_log2, q_ptr, 0, 0, 0,
        GROUP=GROUP, BLOCK_G=BLOCK_G, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N, SPARSE=False, WRITE_LOGITS=False,
        DOT_PRECISION="tf32", DOT_IN_FP32=False)
    _finish_split(acc, running_max, running_sum, part_acc_ptr, part_max_ptr, part_sum_ptr, done_ptr, out_ptr,
                  0, HEAD_DIM, 1, 0, kv_head, split, num_splits, GROUP, BLOCK_G, HEAD_DIM, BLOCK_S,
                  True, MERGE_G, True)

    # 2. Grid barrier: every program has stored its partials, and each head's merging program its output.
    tl.debug_barrier()
    tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
    arrived = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    while arrived < programs:
        arrived = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    pdl.release_dependents(PDL)

    # 3. COLS columns of o_proj over the merged heads (read past L1: other programs wrote them), + residual.
    offs_k = tl.arange(0, BLOCK_K)
    product = tl.zeros([COLS], tl.float32)
    for k0 in range(0, n_in, BLOCK_K):
        x = tl.load(out_ptr + k0 + offs_k, cache_modifier=".cg").to(tl.float32)
        w = tl.load(w_ptr + cols[:, None].to(tl.int64) * n_in + (k0 + offs_k)[None, :]).to(tl.float32)
        product += tl.sum(w * x[None, :], 1)
    dtype = y_ptr.dtype.element_ty
    y = (product.to(dtype) + tl.load(residual_ptr + cols)).to(dtype)
    tl.store(y_ptr + cols, y)
    tl.store(squares_ptr + program, tl.sum(y.to(tl.float32) * y.to(tl.float32), 0))

    # 4. The last program out of the barrier zeroes it for the next launch (every other one has left it).
    if tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu") == programs - 1:
        tl.store(sync_ptr, 0)
        tl.store(sync_ptr + 1, 0)


def attend_project(q, k, v, tail, length, w_o, residual, scratch, prefetch: bool):
    """The fused launch: (residual + o_proj(attention(q)), the programs' sums of squares), B = 1;
    q `[1, H_q, D]` with unit stride in D and D between heads, k/v `[H_kv, S, D]` with unit stride in D."""
    if q.stride(1) != HEAD_DIM or q.stride(2) != 1 or k.stride(2) != 1 or v.stride(2) != 1:
        raise ValueError("attend_project indexes q heads D apart and K/V rows contiguously")
    programs = SPLITS * KV_HEADS
    y = torch.empty_like(residual)
    squares = torch.empty(programs, 1, device=q.device, dtype=torch.float32)
    config = default_config(HEAD_DIM, q.dtype)
    _attend_project_kernel[(SPLITS, KV_HEADS)](
        q, k, v, tail, length, scratch["acc"], scratch["max"], scratch["sum"], scratch["done"],
        scratch["out"], w_o, residual, y, squares, scratch["sync"], SPLITS,
        1 / math.sqrt(HEAD_DIM) * math.log2(math.e),
        HIDDEN, KV_HEADS * GROUP * HEAD_DIM, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        GROUP=GROUP, BLOCK_G=16, HEAD_DIM=HEAD_DIM, BLOCK_N=config.block_n, BLOCK_S=SPLITS,
        MERGE_G=triton.next_power_of_2(GROUP), COLS=HIDDEN // programs, BLOCK_K=512, PREFETCH=prefetch,
        num_warps=config.num_warps, num_stages=config.num_stages,
        **pdl.launch_options(q.device, "short_attention"))
    return y, squares


def build(rows: int, device) -> list[dict]:
    """Per layer: its weights, K/V cache (rows written at the end of `rows` + 64 slots) and index tensors."""
    gen = torch.Generator(device).manual_seed(0)

    def randn(*shape, scale=0.02):
        return (torch.randn(*shape, device=device, generator=gen) * scale).to(torch.bfloat16)

    slots = rows + 64
    layers = []
    for _ in range(LAYERS):
        layers.append({
            "qkv": randn((GROUP + 2) * KV_HEADS * HEAD_DIM, HIDDEN),  # q, k and v stacked
            "o": randn(HIDDEN, KV_HEADS * GROUP * HEAD_DIM),
            "gate_up": randn(2 * INTERMEDIATE, HIDDEN), "down": randn(HIDDEN, INTERMEDIATE),
            "k": randn(1, KV_HEADS, slots, HEAD_DIM, scale=1.0),
            "v": randn(1, KV_HEADS, slots, HEAD_DIM, scale=1.0)})
    return layers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=2308, help="K/V rows each KV head reads (a fast step's)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("this probe times CUDA kernels; no CUDA device here", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    launch = fast_read_launch(1, KV_HEADS, args.rows, device)
    if sms < SPLITS * KV_HEADS or launch["num_splits"] != SPLITS:
        print(f"needs {SPLITS * KV_HEADS} resident programs and a {SPLITS}-split fast read; this GPU has "
              f"{sms} SMs and fast_read_launch gives {launch['num_splits']}", file=sys.stderr)
        return 2
    layers = build(args.rows, device)
    slots = layers[0]["k"].shape[2]
    tail = torch.tensor([[slots - args.rows]], device=device, dtype=torch.int32)  # [P=1, B=1]
    length = torch.tensor([slots], device=device, dtype=torch.int32)
    counts = torch.zeros(1, 1, KV_HEADS, device=device, dtype=torch.int32)  # no compact rows: the tail only
    compact = torch.zeros(1, 1, KV_HEADS, 1, HEAD_DIM, device=device, dtype=torch.bfloat16)
    row_buffer = torch.zeros(1, device=device, dtype=torch.int32)
    q_heads = KV_HEADS * GROUP
    partials = q_heads * SPLITS
    scratch = {"acc": torch.empty(partials, HEAD_DIM, device=device),
               "max": torch.empty(partials, device=device),
               "sum": torch.empty(partials, device=device),
               "done": torch.zeros(KV_HEADS, device=device, dtype=torch.int32),
               "out": torch.empty(1, q_heads, HEAD_DIM, device=device, dtype=torch.bfloat16),
               "sync": torch.zeros(2, device=device, dtype=torch.int32)}
    source = (torch.randn(1, HIDDEN, device=device) * 0.5).to(torch.bfloat16)

    short_tail = torch.tensor([[slots - 20]], device=device, dtype=torch.int32)

    def chain(attention: str, prefetch: bool = False) -> torch.Tensor:
        """attention: "separate" (the project's launches), "fused" (attend_project), "20 rows" (the
        separate launches reading 20 rows: their fixed cost) or "none" (o_proj multiplies q: no launch)."""
        residual = source
        for layer in layers:
            qkv = gemv.linear(residual, layer["qkv"])
            q = qkv[:, :q_heads * HEAD_DIM].view(1, q_heads, HEAD_DIM)
            if attention == "fused":
                residual, _ = attend_project(q, layer["k"][0], layer["v"][0], tail, length, layer["o"],
                                             residual, scratch, prefetch)
            else:
                heads = q if attention == "none" else two_segment_decode(
                    q, compact, compact, counts, layer["k"], layer["v"], short_tail if attention == "20 rows"
                    else tail, length, row_buffer, index_before_wait=True, **launch)
                residual, _ = gemv.linear_add_squares(heads.reshape(1, -1), layer["o"], residual)
            hidden = gemv.gate_up_activation(residual, layer["gate_up"], "silu_mul")
            residual, _ = gemv.linear_add_squares(hidden, layer["down"], residual)
        return residual

    expected = chain("separate")
    rows = []
    variants = [("separate", "separate", False), ("fused", "fused", False), ("fused+prefetch", "fused", True),
                ("separate, 20 rows", "20 rows", False), ("no attention", "none", False)]
    for name, attention, prefetch in variants:
        got = chain(attention, prefetch)
        error = float((got.float() - expected.float()).abs().max())
        scale = float(expected.float().abs().max())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            chain(attention, prefetch)
        medians = time_ms(graph.replay, repeats=args.repeats, calls=20)  # per repeat: median of 20 replays
        rows.append({"variant": name, "ms_per_step": statistics.median(medians), "ms_min": min(medians),
                     "ms_max": max(medians), "max_abs_diff_vs_separate": error, "residual_scale": scale})
        print(f"{name}: {rows[-1]['ms_per_step']:.4f} ms ({min(medians):.4f}-{max(medians):.4f}), "
              f"max |diff| vs separate {error:.3g} (values up to {scale:.3g})", flush=True)
        del graph
    from sfibench.core.provenance import provenance

    payload = {"provenance": provenance(), "rows_read": args.rows, "layers": LAYERS, "splits": SPLITS,
               "pdl": pdl.describe(), "results": rows}
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
