"""Triton decode-attention kernels against their float64 torch references.

Without CUDA the kernels run under the Triton interpreter on CPU tensors. The interpreter is chosen
when a kernel is *decorated*, so TRITON_INTERPRET is set here before the kernel module is imported
(`setdefault`: an explicit TRITON_INTERPRET=0/1 from the command line wins). With CUDA and no
TRITON_INTERPRET=1, the same tests run the compiled kernels on the GPU.

Every run starts from a NaN-poisoned output, and every cache slot a kernel must not read holds NaN
(keys) or 1e30 (values), so a stray read or an unwritten output shows up as a mismatch.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from sfibench.optimized.decode_attention import (  # after the env setup, on purpose
    FILLED_SMS,
    KernelConfig,
    default_config,
    default_num_splits,
    dense_decode,
    sparse_decode,
)
from sfibench.optimized.decode_reference import dense_decode_reference, sparse_decode_reference
from sfibench.optimized.split_merge import merges_at_once

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}
NEVER_READ_KEY, NEVER_READ_VALUE = float("nan"), 1e30


def random_qkv(batch, kv_heads, group, head_dim, slots, dtype, seed, head_major=False, device=DEVICE):
    """q `[B, H_q, D]` and K/V `[B, H_kv, S, D]`; head_major gives K/V non-contiguous batch/head strides."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, kv_heads * group, head_dim, generator=gen)
    shape = (kv_heads, batch, slots, head_dim) if head_major else (batch, kv_heads, slots, head_dim)
    k, v = (torch.randn(shape, generator=gen) for _ in range(2))
    if head_major:
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def assert_matches(out, reference, dtype):
    tol = TOLERANCE[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), reference, rtol=tol, atol=tol)


DENSE_CASES = [  # batch, kv_heads, group, head_dim, slots, lengths, dtype, num_splits, seed, head_major
    (1, 1, 1, 64, 64, [64], torch.float32, None, 0, False),
    (3, 2, 4, 128, 300, [300, 1, 131], torch.float32, 4, 1, False),
    (3, 2, 4, 128, 300, [300, 1, 131], torch.float32, 4, 2, True),
    (3, 3, 3, 64, 257, [200, 65, 1], torch.bfloat16, 3, 3, False),
    (3, 3, 3, 64, 257, [257, 1, 70], torch.bfloat16, 5, 4, True),
    (1, 2, 3, 128, 200, [199], torch.bfloat16, None, 5, False),
    (3, 1, 4, 64, 300, [7, 300, 129], torch.float16, 7, 6, False),
    (1, 3, 1, 128, 150, [150], torch.float32, 2, 7, True),
    (3, 2, 1, 64, 260, [255, 64, 2], torch.float32, 1, 8, False),
    (2, 2, 2, 64, 600, [600, 33], torch.float32, 37, 9, False),  # merged in 3 chunks of 16; empty splits
]


@pytest.mark.parametrize("batch,kv_heads,group,head_dim,slots,lengths,dtype,num_splits,seed,head_major",
                         DENSE_CASES)
def test_dense_decode_matches_reference(batch, kv_heads, group, head_dim, slots, lengths, dtype, num_splits,
                                        seed, head_major):
    q, k, v = random_qkv(batch, kv_heads, group, head_dim, slots, dtype, seed, head_major)
    lengths = torch.tensor(lengths, device=DEVICE, dtype=torch.int32 if seed % 2 else torch.int64)
    reference = dense_decode_reference(q, k, v, lengths)
    for b, n in enumerate(lengths.tolist()):  # the unused tail of the static cache must never be read
        k[b, :, n:], v[b, :, n:] = NEVER_READ_KEY, NEVER_READ_VALUE
    out = torch.full_like(q, float("nan"))
    dense_decode(q, k, v, lengths, num_splits, out=out)
    assert_matches(out, reference, dtype)


SPARSE_CASES = [  # batch, kv_heads, group, head_dim, slots, width N, dtype, num_splits, seed
    (1, 1, 1, 64, 100, 40, torch.float32, None, 10),
    (3, 2, 4, 128, 300, 150, torch.float32, 3, 11),
    (3, 3, 3, 64, 280, 200, torch.bfloat16, 4, 12),
    (1, 2, 1, 128, 128, 128, torch.bfloat16, 2, 13),
]


@pytest.mark.parametrize("batch,kv_heads,group,head_dim,slots,width,dtype,num_splits,seed", SPARSE_CASES)
def test_sparse_decode_matches_reference(batch, kv_heads, group, head_dim, slots, width, dtype, num_splits, seed):
    q, k, v = random_qkv(batch, kv_heads, group, head_dim, slots, dtype, seed)
    gen = torch.Generator().manual_seed(seed)
    positions = torch.stack([torch.randperm(slots, generator=gen)[:width] for _ in range(batch * kv_heads)])
    positions = positions.view(batch, kv_heads, width)
    counts = torch.randint(1, width + 1, (batch, kv_heads), generator=gen)
    counts.view(-1)[0] = width  # a full row, a one-slot row and (if there are more rows) an empty one
    if counts.numel() > 1:
        counts.view(-1)[1] = 1
    if counts.numel() > 2:
        counts.view(-1)[2] = 0
    chosen = torch.zeros(batch, kv_heads, slots, dtype=torch.bool)
    for b in range(batch):
        for h in range(kv_heads):
            chosen[b, h, positions[b, h, :counts[b, h]]] = True
            positions[b, h, counts[b, h]:] = -(10**9) if (b + h) % 2 else 10**9  # padding: never followed
    positions = positions.to(device=DEVICE, dtype=torch.int32 if seed % 2 else torch.int64)
    counts = counts.to(DEVICE)
    reference = sparse_decode_reference(q, k, v, positions, counts)
    unread = ~chosen.to(DEVICE)
    k[unread], v[unread] = NEVER_READ_KEY, NEVER_READ_VALUE
    out = torch.full_like(q, float("nan"))
    sparse_decode(q, k, v, positions, counts, num_splits, out=out)
    assert_matches(out, reference, dtype)
    if counts.numel() > 2:  # the KV head with no keys gives zeros, not NaN
        b, h = divmod(2, kv_heads)
        assert not out[b, h * group:(h + 1) * group].any()


MERGE_CASES = [  # batch, kv_heads, group, head_dim, slots, lengths, num_splits, all partials in one load
    (2, 2, 3, 64, 400, [400, 90], 6, True),  # 4 (3 heads padded) x 8 splits x 64 values
    (1, 2, 4, 128, 1100, [1100], 16, True),  # at the limit: 4 x 16 x 128 values
    (2, 1, 2, 64, 900, [900, 5], 37, False),  # more splits than one load holds: head by head, 16 at a time
    (1, 1, 8, 256, 300, [300], 8, False),  # 8 x 8 x 256 values: too many registers for one load
]


@pytest.mark.parametrize("batch,kv_heads,group,head_dim,slots,lengths,num_splits,at_once", MERGE_CASES)
def test_every_merge_form_gives_the_reference(batch, kv_heads, group, head_dim, slots, lengths, num_splits,
                                              at_once):
    # The last split to finish merges (all partials at once, or head by head) or a second kernel does:
    # all three must give the reference, with empty splits (short rows) neutral.
    assert merges_at_once(group, num_splits, head_dim) == at_once
    q, k, v = random_qkv(batch, kv_heads, group, head_dim, slots, torch.float32, num_splits)
    lengths = torch.tensor(lengths, device=DEVICE)
    reference = dense_decode_reference(q, k, v, lengths)
    base = default_config(head_dim, torch.float32)
    for in_kernel in (True, False):
        config = KernelConfig(base.block_n, base.num_warps, base.num_stages, merge_in_kernel=in_kernel)
        out = torch.full_like(q, float("nan"))
        dense_decode(q, k, v, lengths, num_splits, config=config, out=out)
        assert_matches(out, reference, torch.float32)


def test_output_is_allocated_in_input_dtype_and_layout():
    q, k, v = random_qkv(2, 2, 2, 64, 80, torch.bfloat16, 20)
    out = dense_decode(q, k, v, torch.tensor([80, 3], device=DEVICE))
    assert out.shape == q.shape and out.dtype == torch.bfloat16 and out.is_contiguous()


def test_lengths_past_the_cache_are_clamped_to_it():
    q, k, v = random_qkv(2, 1, 2, 64, 70, torch.float32, 22)
    out = dense_decode(q, k, v, torch.tensor([1000, 5], device=DEVICE))
    assert_matches(out, dense_decode_reference(q, k, v, torch.tensor([70, 5])), torch.float32)


def test_bad_shapes_are_refused_with_the_reason():
    q, k, v = random_qkv(1, 2, 2, 64, 16, torch.float32, 21)
    lengths = torch.tensor([16], device=DEVICE)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        dense_decode(q[:, :3], k, v, lengths)
    with pytest.raises(ValueError, match="one shape"):
        dense_decode(q, k, v[:, :, :8], lengths)
    with pytest.raises(ValueError, match="share a dtype"):
        dense_decode(q, k.double(), v.double(), lengths)
    with pytest.raises(ValueError, match=r"lengths must be \[B\]"):
        dense_decode(q, k, v, lengths.view(1, 1))
    with pytest.raises(ValueError, match="counts"):
        sparse_decode(q, k, v, torch.zeros(1, 2, 4, dtype=torch.long, device=DEVICE), lengths)


def test_split_count_fills_the_gpu_but_keeps_splits_long_enough():
    assert default_num_splits(1, 8, 131072, sm_count=132) == 16  # 128 programs: one per SM
    assert default_num_splits(5, 8, 131072, sm_count=132) == 3  # 120, not 200 (one wave and a half)
    assert default_num_splits(8, 8, 131072, sm_count=132) == 2
    assert default_num_splits(64, 8, 131072, sm_count=132) == 1
    assert default_num_splits(9, 8, 131072, sm_count=132) == 3  # 216 in two waves of 108, not 72 or 144
    assert default_num_splits(6, 8, 131072, sm_count=132) == 5  # 240 in two waves of 120, not 96
    assert default_num_splits(1, 8, 1024, sm_count=132) == 8  # >= 128 keys per split at capacity
    assert default_num_splits(4, 4, 100) == 1


@pytest.mark.parametrize("sm_count", [108, 132])
def test_the_default_split_count_keeps_most_sms_busy_in_every_wave(sm_count):
    for batch in range(1, 65):
        for kv_heads in (2, 4, 8):
            splits = default_num_splits(batch, kv_heads, 131072, sm_count=sm_count)
            programs = batch * kv_heads * splits
            waves = -(-programs // sm_count)
            assert programs / waves >= FILLED_SMS * sm_count, (batch, kv_heads, splits)


def test_repeated_launches_merge_correctly_and_leave_the_counters_zeroed():
    # The last split to finish merges; its counter must be back at zero for the next launch.
    from sfibench.optimized.decode_attention import _done_counters

    q, k, v = random_qkv(2, 3, 2, 64, 500, torch.float32, 11)
    lengths = torch.tensor([500, 77], device=DEVICE)
    for trial in range(3):
        q = q + trial
        out = dense_decode(q, k, v, lengths, num_splits=6)
        assert_matches(out, dense_decode_reference(q, k, v, lengths), torch.float32)
        assert int(_done_counters(torch.device(DEVICE), 2 * 3).abs().sum()) == 0


def test_kernel_config_holds_about_32kb_of_kv_per_stage():
    assert default_config(128, torch.bfloat16).block_n == 64
    assert default_config(64, torch.bfloat16).block_n == 128
    assert default_config(128, torch.float32).block_n == 32
    assert default_config(128, torch.bfloat16).num_stages == 4  # H100/H200: 227 KB per block
    assert default_config(128, torch.bfloat16, shared_memory=100 * 1024).num_stages == 2  # 4 x 32 KB won't fit


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or DEVICE != "cuda", reason="needs CUDA (compiled kernels)")
def test_long_context_bf16_on_gpu_and_under_cuda_graph_replay():
    batch, kv_heads, group, head_dim, slots = 2, 8, 4, 128, 32768
    q, k, v = random_qkv(batch, kv_heads, group, head_dim, slots, torch.bfloat16, 30, device="cuda")
    lengths = torch.tensor([slots, 20001], device="cuda")
    expected = dense_decode_reference(q, k, v, lengths)
    for splits in (None, 3, 16, 40):  # default, few, 16 (merged at once in the kernel), many (a second kernel)
        assert_matches(dense_decode(q, k, v, lengths, splits), expected, torch.bfloat16)

    width = 4 + 2048 + 271  # sinks + selected + the widest recent window of SPEC section 2
    positions = torch.stack([torch.randperm(slots, device="cuda")[:width] for _ in range(batch * kv_heads)])
    positions = positions.view(batch, kv_heads, width).to(torch.int32)
    counts = torch.randint(1, width + 1, (batch, kv_heads), device="cuda")
    assert_matches(sparse_decode(q, k, v, positions, counts),
                   sparse_decode_reference(q, k, v, positions, counts), torch.bfloat16)

    # Captured at short lengths, replayed after the lengths grew in place: the graph must follow.
    out = torch.empty_like(q)
    lengths.copy_(torch.tensor([100, 3000]))
    dense_decode(q, k, v, lengths, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dense_decode(q, k, v, lengths, out=out)
    lengths.copy_(torch.tensor([slots, 20001]))
    graph.replay()
    assert_matches(out, dense_decode_reference(q, k, v, lengths), torch.bfloat16)

    # Back-to-back replays with new queries: the in-kernel merge must never read a stale partial.
    for trial in range(50):
        q.copy_(torch.randn_like(q))
        graph.replay()
        if trial % 10 == 0:
            assert_matches(out, dense_decode_reference(q, k, v, lengths), torch.bfloat16)
