"""Each Triton layer kernel (optimized/layer_kernels.py) against its torch reference (models/fused.py) on
random inputs: q/k norm + RoPE, the KV append and both in one, the RoPE position table and a folded decode
step's first launch (decode_inputs). tests/kernels/test_fused_kernels.py runs the decoder through them.

Without CUDA the kernels run under the Triton interpreter on CPU tensors (conftest.py chooses it
before any sfibench import). The interpreter truncates float32 to bfloat16 where the GPU rounds to
nearest, hence the loose bf16 tolerance. Caches start NaN-poisoned so a stray or missing write shows
up as a mismatch.
"""

from __future__ import annotations

import os
import weakref

import pytest
import torch

from sfibench.models import fused
from sfibench.models.rope import PositionTable, inverse_frequencies, rope_cos_sin
from sfibench.optimized import layer_kernels

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


QK_CASES = [  # batch, seq, heads, kv_heads, head_dim, qk_norm, dtype, padded (qkv a slice of a wider tensor)
    (1, 1, 4, 2, 16, True, torch.float32, False),
    (3, 1, 8, 2, 128, True, torch.float32, True),
    (2, 5, 4, 4, 64, False, torch.float32, False),
    (2, 3, 6, 2, 80, True, torch.float32, True),  # half of head_dim not a power of two: masked lanes
    (3, 1, 8, 2, 128, True, torch.bfloat16, False),
    (1, 4, 4, 1, 64, False, torch.bfloat16, True),
]


@pytest.mark.parametrize("batch,seq,heads,kv_heads,head_dim,qk_norm,dtype,padded", QK_CASES)
def test_qk_norm_rope_matches_reference(batch, seq, heads, kv_heads, head_dim, qk_norm, dtype, padded):
    gen = torch.Generator().manual_seed(head_dim + seq)
    width = (heads + 2 * kv_heads) * head_dim
    qkv = torch.randn(batch, seq, width + (48 if padded else 0), generator=gen)[..., :width]
    weights = [1 + 0.1 * torch.randn(head_dim, generator=gen) for _ in range(2)] if qk_norm else [None, None]
    positions = torch.randint(0, 10_000, (batch, seq), generator=gen)
    inv_freq, _ = inverse_frequencies(head_dim, 1e6, None)
    cos, sin = rope_cos_sin(inv_freq, 1.0, positions, dtype)
    qkv, cos, sin = (t.to(DEVICE) for t in (qkv.to(dtype), cos, sin))
    weights = [w.to(DEVICE, dtype) if w is not None else None for w in weights]
    expected = fused.qk_norm_rope(qkv, *weights, 1e-6, cos, sin, heads, kv_heads)
    got = layer_kernels.qk_norm_rope(qkv, *weights, 1e-6, cos, sin, heads, kv_heads)
    for out, ref in zip(got, expected):
        assert out.shape == ref.shape and out.dtype == dtype and out.is_contiguous()
        torch.testing.assert_close(out.float(), ref.float(), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("batch,heads,kv_heads,head_dim,qk_norm,dtype,positions", [
    (1, 4, 2, 16, True, torch.float32, [3]),
    (3, 8, 2, 128, True, torch.float32, [0, 11, 19]),
    (2, 6, 2, 80, False, torch.bfloat16, [7, 19]),
    (2, 4, 1, 64, True, torch.bfloat16, [-1, 20]),  # out of the cache: that row writes nothing
])
def test_qk_norm_rope_append_is_both_kernels_in_one(batch, heads, kv_heads, head_dim, qk_norm, dtype, positions):
    gen = torch.Generator().manual_seed(head_dim + batch)
    qkv = torch.randn(batch, 1, (heads + 2 * kv_heads) * head_dim, generator=gen).to(DEVICE, dtype)
    weights = [(1 + 0.1 * torch.randn(head_dim, generator=gen)).to(DEVICE, dtype) for _ in range(2)] \
        if qk_norm else [None, None]
    inv_freq, _ = inverse_frequencies(head_dim, 1e6, None)
    cos, sin = (t.to(DEVICE) for t in rope_cos_sin(inv_freq, 1.0, torch.tensor([[9], [50], [70]])[:batch], dtype))
    positions = torch.tensor(positions, device=DEVICE)
    expected, got = (poisoned_cache(batch, kv_heads, head_dim, 20, dtype) for _ in range(2))
    ref_q = fused.qk_norm_rope(qkv, *weights, 1e-6, cos, sin, heads, kv_heads)[0]
    for row in range(batch):  # the torch reference, row by row (it has no bounds check: valid rows only)
        if 0 <= positions[row] < 20:
            rows = slice(row, row + 1)  # views, so the reference writes into `expected`
            fused.qk_norm_rope_append(qkv[rows], *weights, 1e-6, cos[rows], sin[rows], heads, kv_heads,
                                      *(t[rows] for t in expected), positions[rows])
    q = layer_kernels.qk_norm_rope_append(qkv, *weights, 1e-6, cos, sin, heads, kv_heads, *got, positions)
    assert q.shape == (batch, heads, 1, head_dim) and q.dtype == dtype
    torch.testing.assert_close(q.float(), ref_q.float(), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    for out, ref in zip(got, expected):  # NaN (never written) exactly where the reference left it
        torch.testing.assert_close(out.float(), ref.float(), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype],
                                   equal_nan=True)


APPEND_CASES = [  # batch, kv_heads, head_dim, slots, positions, dtype
    (1, 1, 16, 8, [0], torch.float32),
    (3, 2, 128, 40, [39, 0, 17], torch.float32),
    (2, 4, 64, 33, [5, 32], torch.bfloat16),
    (2, 3, 80, 16, [15, 3], torch.bfloat16),
]


def poisoned_cache(batch, kv_heads, head_dim, slots, dtype):
    k_cache = torch.full((batch, kv_heads, slots, head_dim), float("nan"), dtype=dtype, device=DEVICE)
    norms = torch.full((batch, kv_heads, slots), float("nan"), device=DEVICE)
    return k_cache, k_cache.clone(), norms


@pytest.mark.parametrize("batch,kv_heads,head_dim,slots,positions,dtype", APPEND_CASES)
def test_append_kv_matches_reference(batch, kv_heads, head_dim, slots, positions, dtype):
    gen = torch.Generator().manual_seed(slots)
    # Strided like the decoder's: k sliced from [B, H, 1, D], v from inside the qkv projection.
    k = torch.randn(batch, kv_heads, 1, head_dim, generator=gen).to(DEVICE, dtype)[:, :, 0]
    v = torch.randn(batch, 1, 3 * kv_heads, head_dim, generator=gen).to(DEVICE, dtype)[:, 0, kv_heads:2 * kv_heads]
    positions = torch.tensor(positions, device=DEVICE)
    expected = poisoned_cache(batch, kv_heads, head_dim, slots, dtype)
    got = poisoned_cache(batch, kv_heads, head_dim, slots, dtype)
    fused.append_kv(*expected, positions, k, v)
    layer_kernels.append_kv(*got, positions, k, v)
    for out, ref in zip(got, expected):
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_append_kv_never_writes_outside_the_cache():
    k_cache, v_cache, norms = poisoned_cache(2, 2, 16, 8, torch.float32)
    k = v = torch.ones(2, 2, 16, device=DEVICE)
    layer_kernels.append_kv(k_cache, v_cache, norms, torch.tensor([8, -1], device=DEVICE), k, v)
    assert k_cache.isnan().all() and v_cache.isnan().all() and norms.isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_position_table_gathers_what_rope_cos_sin_computes(dtype):
    """The GPU decoder's RoPE table (one gather per step) holds exactly rope_cos_sin's values, at the
    first and last positions too, and (on the CPU) refuses a position past its length."""
    inv_freq, amplitude = inverse_frequencies(64, 1e6, {"rope_type": "yarn", "factor": 4.0,
                                                        "original_max_position_embeddings": 1024})
    positions = torch.tensor([[0, 1, 4095], [17, 2048, 3000]], device=DEVICE)
    inv_freq = inv_freq.to(DEVICE)  # once: on a GPU each .to() is a new tensor, which gets a table of its own
    table = PositionTable()
    got = table(inv_freq, amplitude, positions, dtype, 4096)
    expected = rope_cos_sin(inv_freq, amplitude, positions, dtype)
    for have, want in zip(got, expected):
        assert have.shape == want.shape and have.stride(-1) == 1
        assert torch.equal(have, want)
    assert len(table.tables) == 1  # built once, reused
    table(inv_freq, amplitude, positions[:, :1], dtype, 4096)
    assert len(table.tables) == 1
    if DEVICE == "cpu":  # on CUDA an out-of-range gather is a device-side assert, which ends the process's CUDA
        with pytest.raises(IndexError):
            table(inv_freq, amplitude, torch.tensor([[4096]], device=DEVICE), dtype, 4096)


def test_position_table_keeps_the_frequencies_its_tables_were_built_from():
    """Tables are found by the frequency tensor's address; a cached entry holds that tensor, so once the
    caller drops its frequencies no other tensor can take their address and be handed their table."""
    table = PositionTable()
    inv_freq = inverse_frequencies(16, 1e4, None)[0].to(DEVICE)
    address, watch = inv_freq.data_ptr(), weakref.ref(inv_freq)
    first = table.table(inv_freq, 1.0, torch.float32, 64)
    del inv_freq
    assert watch() is not None and watch().data_ptr() == address  # still alive: the address stays taken
    other = inverse_frequencies(16, 1e2, None)[0].to(DEVICE)
    assert other.data_ptr() != address
    assert not torch.equal(table.table(other, 1.0, torch.float32, 64), first)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch,seq,hidden,head_dim", [(3, 1, 64, 16), (1, 1, 1024, 128), (2, 3, 40, 8)])
def test_decode_inputs_matches_reference(batch, seq, hidden, head_dim, dtype):
    """The step's first launch gives the embeddings, their float32 sums of squares and the RoPE rows the
    torch reference gives (first and last ids and positions included); an id or position outside its table
    gives zeros rather than reading past it."""
    gen = torch.Generator().manual_seed(hidden)
    vocab, length = 50, 300
    embedding = torch.randn(vocab, hidden, generator=gen).to(device=DEVICE, dtype=dtype)
    inv_freq, amplitude = inverse_frequencies(head_dim, 1e4, None)
    table = PositionTable().table(inv_freq.to(DEVICE), amplitude, dtype, length)
    tokens = torch.randint(0, vocab, (batch, seq), generator=gen)
    positions = torch.randint(0, length, (batch, seq), generator=gen)
    tokens[0, 0], positions[0, 0], tokens[-1, -1], positions[-1, -1] = 0, 0, vocab - 1, length - 1
    tokens, positions = tokens.to(DEVICE), positions.to(DEVICE)
    got = layer_kernels.decode_inputs(tokens, positions, embedding, table)
    expected = fused.decode_inputs(tokens, positions, embedding, table)
    for have, want in zip(got, expected):
        assert have.shape == want.shape and have.dtype == want.dtype
    torch.testing.assert_close(got[1], expected[1], rtol=1e-5, atol=1e-5)  # a sum in another order
    for have, want in zip(got[:1] + got[2:], expected[:1] + expected[2:]):
        assert torch.equal(have, want)  # copies: exact
    tokens[0, 0], positions[0, 0] = vocab, length
    x, squares, cos, sin = layer_kernels.decode_inputs(tokens, positions, embedding, table)
    assert not x[0, 0].any() and float(squares[0, 0]) == 0.0 and not cos[0, 0].any() and not sin[0, 0].any()


def test_decode_inputs_refuses_shapes_it_cannot_index():
    embedding = torch.randn(10, 16, device=DEVICE)
    table = PositionTable().table(inverse_frequencies(8, 1e4, None)[0].to(DEVICE), 1.0, torch.float32, 32)
    tokens = torch.zeros(2, 1, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="one shape \\[B, T\\]"):
        layer_kernels.decode_inputs(tokens, tokens[:1], embedding, table)
    with pytest.raises(ValueError, match="contiguous embedding rows"):
        layer_kernels.decode_inputs(tokens, tokens, embedding.t().contiguous().t(), table)
