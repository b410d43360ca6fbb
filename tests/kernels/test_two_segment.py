"""The two-segment (compact rows + cache tail) decode kernel against its float64 torch reference.

As in test_kernels.py, TRITON_INTERPRET is set before the kernel module is imported, so without CUDA
the kernel runs in the interpreter on CPU tensors. Every compact row past its count, every compact
buffer a row does not read and every cache slot outside a row's tail holds NaN (keys) or 1e30 (values),
the output starts NaN and the evidence starts at EVIDENCE_POISON: a stray read, a missing write or a
write where none belongs shows up as a mismatch.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# After the env setup, on purpose; the shared helpers come from test_kernels.py.
from test_kernels import DEVICE, NEVER_READ_KEY, NEVER_READ_VALUE, assert_matches, random_qkv

from sfibench.optimized import two_segment
from sfibench.optimized.decode_attention import (
    KernelConfig,
    _done_counters,
    default_num_splits,
    dense_decode,
    sm_count,
)
from sfibench.optimized.decode_reference import two_segment_decode_reference
from sfibench.optimized.two_segment import (
    LONG_SPLIT_SHAPES,
    dense_read_launch,
    fast_read_launch,
    two_segment_decode,
)

EVIDENCE_POISON = 7777.0
DENSE = -1


def two_segment_inputs(kv_heads, group, head_dim, width, slots, dtype, seed, rows, n_buffers=2,
                       buffer_major=True, poison=True, device=DEVICE):
    """Random inputs for `rows` = [(buffer, tail_start, length)] per sequence, everything that must not
    be read poisoned unless `poison` is False. Compact counts are random per head; the first row's first
    head is full (N) and the last KV head of every compact row is empty. buffer_major=False gives
    compact K/V strides that are not [P, B, ...]-contiguous.
    """
    batch = len(rows)
    q, k, v = random_qkv(batch, kv_heads, group, head_dim, slots, dtype, seed, head_major=seed % 2 == 0,
                         device=device)
    gen = torch.Generator().manual_seed(seed)
    shape = (n_buffers, batch, kv_heads, width, head_dim)
    if buffer_major:
        compact_k, compact_v = (torch.randn(shape, generator=gen) for _ in range(2))
    else:
        compact_k, compact_v = (torch.randn(shape[1], shape[0], *shape[2:], generator=gen).transpose(0, 1)
                                for _ in range(2))
    counts = torch.randint(1, width + 1, (n_buffers, batch, kv_heads), generator=gen)
    tail_start = torch.zeros(n_buffers, batch, dtype=torch.long)
    read_slots = torch.zeros(batch, slots, dtype=torch.bool)
    read_rows = torch.zeros(n_buffers, batch, kv_heads, width, dtype=torch.bool)
    for b, (buffer, first_slot, length) in enumerate(rows):
        if buffer == DENSE:  # stale counts and tail starts of a dense row must be ignored
            tail_start[:, b] = length // 2
            read_slots[b, :length] = True
            continue
        counts[buffer, b, -1] = 0
        if b == 0:
            counts[buffer, b, 0] = width
        tail_start[buffer, b] = first_slot
        read_slots[b, first_slot:length] = True
        for h in range(kv_heads):
            read_rows[buffer, b, h, :counts[buffer, b, h]] = True
    if poison:
        compact_k[~read_rows], compact_v[~read_rows] = NEVER_READ_KEY, NEVER_READ_VALUE
        read_slots = read_slots.to(device)
        for h in range(kv_heads):
            k[:, h][~read_slots], v[:, h][~read_slots] = NEVER_READ_KEY, NEVER_READ_VALUE
    index_dtype = torch.int32 if seed % 2 else torch.int64  # the kernel takes either
    index = {
        "compact_counts": counts,
        "tail_start": tail_start,
        "lengths": torch.tensor([length for _, _, length in rows]),
        "row_buffer": torch.tensor([buffer for buffer, _, _ in rows]),
    }
    index = {name: t.to(device=device, dtype=index_dtype) for name, t in index.items()}
    compact_k, compact_v = (t.to(device=device, dtype=dtype) for t in (compact_k, compact_v))
    return {"q": q, "compact_k": compact_k, "compact_v": compact_v, "k": k, "v": v, **index}


CASES = [  # kv_heads, group, head_dim, width N, slots S, dtype, num_splits, seed, rows [(buffer, tail_start, L)]
    (2, 4, 128, 40, 300, torch.float32, 4, 1, [(0, 200, 300), (1, 250, 261), (DENSE, 0, 150)]),
    (3, 3, 64, 70, 257, torch.bfloat16, 3, 2, [(1, 180, 257), (0, 100, 90), (DENSE, 0, 257)]),  # empty tail
    (1, 1, 64, 64, 200, torch.float16, None, 3, [(0, 136, 199)]),
    (2, 3, 128, 50, 220, torch.bfloat16, 2, 4, [(0, 0, 1), (DENSE, 0, 1), (1, 60, 220)]),
    (2, 4, 64, 30, 600, torch.float32, 12, 5, [(1, 300, 600), (DENSE, 0, 37)]),  # a second kernel merges
    (3, 1, 64, 90, 160, torch.float16, 1, 6, [(DENSE, 0, 160), (0, 158, 160), (1, 10, 10)]),
]


@pytest.mark.parametrize("one_loop", [False, True])
@pytest.mark.parametrize("kv_heads,group,head_dim,width,slots,dtype,num_splits,seed,rows", CASES)
def test_two_segment_matches_reference_and_writes_evidence_only_where_asked(
        kv_heads, group, head_dim, width, slots, dtype, num_splits, seed, rows, one_loop):
    inputs = two_segment_inputs(kv_heads, group, head_dim, width, slots, dtype, seed, rows,
                                buffer_major=seed % 3 != 0)
    batch, q_heads = len(rows), kv_heads * group
    # Evidence from the dense rows and the first row; a slot range shorter than the cache in odd seeds.
    evidence_rows = torch.tensor([b == 0 or buffer == DENSE for b, (buffer, _, _) in enumerate(rows)],
                                 device=DEVICE)
    evidence_slots = slots - 40 if seed % 2 else slots
    evidence = torch.full((batch, q_heads, evidence_slots), EVIDENCE_POISON, device=DEVICE)
    out = torch.full_like(inputs["q"], float("nan"))

    two_segment_decode(**inputs, evidence=evidence, evidence_rows=evidence_rows, num_splits=num_splits, out=out,
                       one_loop=one_loop)

    reference, logits = two_segment_decode_reference(**inputs, evidence_rows=evidence_rows)
    assert_matches(out, reference, dtype)
    expected = logits[:, :, :evidence_slots].nan_to_num(nan=EVIDENCE_POISON)
    torch.testing.assert_close(evidence.double(), expected, rtol=1e-4, atol=1e-4)

    # A dense row is dense_decode: with the same split count, the same tiles in the same order.
    dense_rows = [b for b, (buffer, _, _) in enumerate(rows) if buffer == DENSE]
    if dense_rows:
        dense = dense_decode(*(inputs[name][dense_rows] for name in ("q", "k", "v", "lengths")), num_splits)
        # float32 one-loop launches run three pipeline stages (shared memory), dense_decode four: a different
        # compiled kernel, so exact equality is asked only where the configs agree.
        if num_splits and not (one_loop and dtype == torch.float32):
            assert torch.equal(out[dense_rows], dense)
        else:
            assert_matches(out[dense_rows], dense.double(), dtype)


@pytest.mark.parametrize("num_splits", [2, 3, 5, 8])
def test_compact_rows_padded_to_whole_tiles_in_the_index_space_read_every_row_once(num_splits):
    # With a loop per segment the split ranges cover the compact rows rounded up to whole tiles, then the
    # tail. Counts one below, at and above a tile edge, with split edges falling inside that padding, in it
    # exactly, or past it: every compact row and tail slot is read once and padding is read by no one.
    block = 16
    rows = [(0, 60, 100), (1, 99, 100), (0, 20, 57), (1, 5, 5), (0, 33, 90)]  # tails of 40, 1, 37, 0, 57 slots
    inputs = two_segment_inputs(2, 2, 64, 40, 100, torch.float32, 7, rows, poison=False)
    counts = torch.tensor([[1, 15], [16, 17], [33, 0], [31, 32], [40, 3]])  # [B, H_kv], each row's buffer
    for b, (buffer, _, _) in enumerate(rows):
        inputs["compact_counts"][buffer, b] = counts[b].to(inputs["compact_counts"])
    config = KernelConfig(block_n=block, num_warps=4, num_stages=2)
    out = two_segment_decode(**inputs, num_splits=num_splits, config=config)
    reference, _ = two_segment_decode_reference(**inputs)
    assert_matches(out, reference, torch.float32)


def test_rows_with_nothing_to_read_give_zeros_and_evidence_rows_may_be_int():
    rows = [(0, 50, 50), (1, 64, 80)]
    inputs = two_segment_inputs(2, 2, 64, 16, 80, torch.float32, 7, rows, n_buffers=2)
    inputs["compact_counts"][0, 0] = 0  # row 0: no compact rows and an empty tail
    evidence = torch.full((2, 4, 80), EVIDENCE_POISON, device=DEVICE)
    out = two_segment_decode(**inputs, evidence=evidence, evidence_rows=torch.tensor([1, 0], device=DEVICE))
    assert out.dtype == torch.float32 and out.shape == (2, 4, 64) and not out[0].any()
    assert_matches(out, two_segment_decode_reference(**inputs)[0], torch.float32)
    assert (evidence == EVIDENCE_POISON).all()  # row 0 read no tail slot, row 1 asked for no evidence


def test_counts_lengths_and_buffers_beyond_the_shapes_are_clamped():
    rows = [(0, 30, 70), (DENSE, 0, 70)]
    inputs = two_segment_inputs(1, 2, 64, 20, 70, torch.float32, 9, rows, n_buffers=1, poison=False)
    expected, _ = two_segment_decode_reference(**inputs)
    inputs["compact_counts"][0, 0, 0] = 1000  # clamped to N = 20
    inputs["lengths"] += 1000  # clamped to S = 70
    inputs["row_buffer"][0] = 5  # clamped to the last (only) buffer
    expected, _ = two_segment_decode_reference(**dict(inputs, compact_counts=inputs["compact_counts"].clamp(max=20),
                                                      lengths=inputs["lengths"].clamp(max=70),
                                                      row_buffer=inputs["row_buffer"].clamp(max=0)))
    assert_matches(two_segment_decode(**inputs), expected, torch.float32)


def test_repeated_launches_follow_the_lengths_and_leave_the_counters_zeroed():
    rows = [(1, 100, 130), (DENSE, 0, 90)]
    inputs = two_segment_inputs(3, 2, 64, 32, 200, torch.float32, 11, rows, poison=False)
    for grown in (0, 20, 40):
        lengths = inputs["lengths"] + grown
        out = two_segment_decode(**dict(inputs, lengths=lengths), num_splits=5)
        assert_matches(out, two_segment_decode_reference(**dict(inputs, lengths=lengths))[0], torch.float32)
        assert int(_done_counters(torch.device(DEVICE), 2 * 3).abs().sum()) == 0


@pytest.mark.parametrize("num_splits,merge_in_kernel", [(20, True), (2, False)])
def test_the_merge_can_be_placed_against_the_split_count_rule(num_splits, merge_in_kernel):
    # merges_at_once would pick the other place for these split counts (20 > 16: head by head in the kernel).
    rows = [(0, 70, 130), (DENSE, 0, 90)]
    inputs = two_segment_inputs(2, 3, 64, 24, 160, torch.float32, 15, rows)
    config = KernelConfig(block_n=16, num_warps=4, num_stages=2, merge_in_kernel=merge_in_kernel)
    for one_loop in (False, True):
        out = two_segment_decode(**inputs, num_splits=num_splits, config=config, one_loop=one_loop)
        assert_matches(out, two_segment_decode_reference(**inputs)[0], torch.float32)
    assert int(_done_counters(torch.device(DEVICE), 2 * 2).abs().sum()) == 0


def test_fast_reads_take_one_loop_and_pdl_only_when_their_splits_are_short(monkeypatch):
    # Qwen3-4B shape, 2,308 rows per (sequence, KV head) at a fast step, 132 SMs (the H200 measurement).
    one = fast_read_launch(1, 8, 2308, torch.device("cpu"))
    five = fast_read_launch(5, 8, 2308, torch.device("cpu"))
    # ~144 rows per split: one loop, and PDL; ~770: neither, and B = 5's 40 pairs take the table's launch
    assert one == {"num_splits": 16, "one_loop": True, "short_splits": True}
    splits, stages = LONG_SPLIT_SHAPES[(132, 40)]
    assert five == {"num_splits": splits, "one_loop": False, "short_splits": False, "num_stages": stages}
    # qwen3-0.6b at B = 7 (56 sequence x KV head pairs) on 132 SMs (the interpreter's count): splits and stages
    # from the table; on another SM count the rule's
    seven = fast_read_launch(7, 8, 2308, torch.device("cpu"))
    assert (seven["num_splits"], seven["num_stages"]) == LONG_SPLIT_SHAPES[(132, 56)]
    with monkeypatch.context() as patch:
        patch.setattr(two_segment, "sm_count", lambda device: 108)
        assert "num_stages" not in fast_read_launch(7, 8, 2308, torch.device("cpu"))
    assert seven["num_splits"] != default_num_splits(7, 8, 2308)


def test_a_launch_may_set_its_stages_alone():
    inputs = two_segment_inputs(2, 2, 64, 16, 300, torch.float32, 17, [(0, 120, 300), (DENSE, 0, 260)])
    for stages in (2, 3):
        out = two_segment_decode(**inputs, num_splits=2, num_stages=stages)
        assert_matches(out, two_segment_decode_reference(**inputs)[0], torch.float32)


def test_dense_row_steps_split_for_the_long_read():
    # Qwen3-4B at 128K on 132 SMs: the dense row gets the split count of a lone sequence whatever the batch.
    cpu = torch.device("cpu")
    one, five = dense_read_launch(1, 8, 131072, cpu), dense_read_launch(5, 8, 131072, cpu)
    assert one == five == {"num_splits": default_num_splits(1, 8, 131072, sm_count(cpu))}


def test_bad_inputs_are_refused_with_the_reason():
    inputs = two_segment_inputs(2, 2, 64, 16, 40, torch.float32, 13, [(0, 20, 40)])
    with pytest.raises(ValueError, match="compact_k and compact_v"):
        two_segment_decode(**dict(inputs, compact_v=inputs["compact_v"][:, :, :, :8]))
    with pytest.raises(ValueError, match="compact_counts must be"):
        two_segment_decode(**dict(inputs, compact_counts=inputs["compact_counts"][0]))
    with pytest.raises(ValueError, match="row_buffer must be an integer"):
        two_segment_decode(**dict(inputs, row_buffer=inputs["row_buffer"].float()))
    with pytest.raises(ValueError, match="together"):
        two_segment_decode(**inputs, evidence=torch.zeros(1, 4, 40, device=DEVICE))
    with pytest.raises(ValueError, match="evidence must be float32"):
        two_segment_decode(**inputs, evidence=torch.zeros(1, 4, 40, dtype=torch.float64, device=DEVICE),
                           evidence_rows=torch.ones(1, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or DEVICE != "cuda", reason="needs CUDA (compiled kernels)")
def test_long_context_bf16_on_gpu_and_under_cuda_graph_replay():
    kv_heads, group, head_dim, slots = 8, 4, 128, 32768
    width = 4 + 2048  # sinks + selected (SPEC section 2); the recent window is the tail
    rows = [(0, 32768 - 271, 32768), (1, 20001 - 256, 20001), (DENSE, 0, 30000)]
    inputs = two_segment_inputs(kv_heads, group, head_dim, width, slots, torch.bfloat16, 30, rows, device="cuda")
    evidence_rows = torch.tensor([0, 0, 1], device="cuda")
    evidence = torch.full((3, kv_heads * group, slots), EVIDENCE_POISON, device="cuda")
    reference, logits = two_segment_decode_reference(**inputs, evidence_rows=evidence_rows)
    for splits, one_loop in ((None, False), (3, False), (16, False), (16, True), (40, True)):
        # default, few, 16 (merged in the kernel), many (a second kernel merges); every loop form
        out = two_segment_decode(**inputs, evidence=evidence, evidence_rows=evidence_rows, num_splits=splits,
                                 one_loop=one_loop)
        assert_matches(out, reference, torch.bfloat16)
    torch.testing.assert_close(evidence.double(), logits.nan_to_num(nan=EVIDENCE_POISON), rtol=1e-3, atol=1e-3)

    # Captured at short lengths, replayed after the lengths grew in place and rows switched buffers
    # (both buffers of every row readable now).
    inputs = two_segment_inputs(kv_heads, group, head_dim, width, slots, torch.bfloat16, 31, rows, poison=False,
                                device="cuda")
    out = torch.empty_like(inputs["q"])
    lengths, row_buffer = inputs["lengths"], inputs["row_buffer"]
    final_lengths, final_buffers = lengths.clone(), torch.tensor([1, DENSE, 0], device="cuda", dtype=row_buffer.dtype)
    lengths.copy_(torch.tensor([32768 - 200, 20001 - 250, 100]))
    two_segment_decode(**inputs, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        two_segment_decode(**inputs, out=out)
    for trial in range(20):
        inputs["q"].copy_(torch.randn_like(inputs["q"]))
        lengths.copy_(final_lengths)
        row_buffer.copy_(final_buffers if trial % 2 else torch.tensor(rows)[:, 0])
        graph.replay()
        if trial % 5 in (0, 1):
            assert_matches(out, two_segment_decode_reference(**inputs)[0], torch.bfloat16)
