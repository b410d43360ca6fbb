"""The Triton decode-attention kernels (dense split-K and gathered sparse) at real shapes; CUDA only.

Triton's CPU interpreter runs these kernels thousands of times slower than a GPU, so without CUDA the
benchmarks are skipped rather than timing the interpreter.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="decode kernels are timed on a GPU only")

SHAPES = {  # name: (batch, KV heads, group, head dim, context)
    "qwen3-4b@32K B=1": (1, 8, 4, 128, 32768),
    "qwen3-4b@128K B=1": (1, 8, 4, 128, 130944),
    "qwen3-4b@32K B=8": (8, 8, 4, 128, 32768),
}
SPARSE_TOKENS = 2308  # SFI's default read: 4 sinks + 2,048 selected + 256 recent


def tensors(name: str):
    batch, kv_heads, group, head_dim, context = SHAPES[name]
    generator = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, kv_heads * group, head_dim, device="cuda", dtype=torch.bfloat16, generator=generator)
    k = torch.randn(batch, kv_heads, context, head_dim, device="cuda", dtype=torch.bfloat16, generator=generator)
    return q, k, torch.randn_like(k)


def record(benchmark, name: str, kernel: str, nbytes: int, fn) -> None:
    benchmark.extra_info.update(shape=name, kernel=kernel, bytes_read=nbytes)

    def timed():
        fn()
        torch.cuda.synchronize()

    benchmark(timed)


@pytest.mark.parametrize("name", SHAPES)
def test_dense_decode(benchmark, name):
    from sfibench.optimized.decode_attention import dense_decode

    q, k, v = tensors(name)
    lengths = torch.full((q.shape[0],), k.shape[2], device="cuda", dtype=torch.int32)
    record(benchmark, name, "dense split-K", 2 * k.numel() * k.element_size(), lambda: dense_decode(q, k, v, lengths))


@pytest.mark.parametrize("name", SHAPES)
def test_sparse_decode(benchmark, name):
    from sfibench.optimized.decode_attention import sparse_decode

    q, k, v = tensors(name)
    batch, kv_heads, context = k.shape[0], k.shape[1], k.shape[2]
    positions = torch.stack([torch.randperm(context, device="cuda")[:SPARSE_TOKENS].sort().values
                             for _ in range(batch * kv_heads)]).view(batch, kv_heads, SPARSE_TOKENS)
    counts = torch.full((batch, kv_heads), SPARSE_TOKENS, device="cuda", dtype=torch.int32)
    nbytes = 2 * batch * kv_heads * SPARSE_TOKENS * k.shape[3] * k.element_size()
    record(benchmark, name, "sparse gather", nbytes, lambda: sparse_decode(q, k, v, positions, counts))
