"""The fused decode path: Triton layer kernels against their torch references, the stacked projections'
Hugging Face names, and (on a GPU) fused against plain-torch logits and greedy tokens.

Without CUDA the kernels run under the Triton interpreter on CPU tensors (conftest.py chooses it
before any sfibench import). The interpreter truncates float32 to bfloat16 where the GPU rounds to
nearest, hence the loose bf16 tolerance. Caches start NaN-poisoned so a stray or missing write shows
up as a mismatch.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from sfibench.engine.cache import KVCache
from sfibench.models import fused
from sfibench.models.decoder import Decoder
from sfibench.models.loading import DECODERS, _place, load_model, random_weights
from sfibench.models.presets import get_preset
from sfibench.models.rope import PositionTable, inverse_frequencies, rope_cos_sin
from sfibench.optimized import gemv, layer_kernels, qkv_epilogue

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

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


@torch.no_grad()
def decode(model: Decoder, tokens: torch.Tensor, greedy_steps: int = 0, append: bool = False):
    """Feed `tokens [B, N]` one position at a time through a KV cache, then `greedy_steps` greedy
    tokens; returns all tokens `[B, N + greedy_steps]` and the logits after each fed token. With `append`
    the layers write their k/v to the cache themselves (the engine's `append_target`), as at decode."""
    batch, total = tokens.shape[0], tokens.shape[1] + greedy_steps
    param = model.lm_head.weight
    cache = KVCache(model.config, batch, total, param.device, param.dtype)
    logits = []
    for step in range(total):
        if step == tokens.shape[1]:
            tokens = torch.cat([tokens, logits[-1].argmax(-1, keepdim=True)], dim=1)
        positions = torch.full((batch,), step, device=param.device)

        def attend(layer, q, k, v, positions=positions, step=step):
            if k is not None:
                cache.write_step(layer, positions, k[:, :, 0], v[:, :, 0])
            keys, values = cache.k[layer, :, :, :step + 1], cache.v[layer, :, :, :step + 1]
            return F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)

        if append:
            attend.append_target = lambda layer, positions=positions: (cache.k[layer], cache.v[layer],
                                                                       cache.key_norms[layer], positions)

        logits.append(model(tokens[:, step:step + 1], positions[:, None], attend)[:, -1])
    return tokens, torch.stack(logits, dim=1)


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


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_decoder_with_triton_layer_kernels_matches_torch(monkeypatch, name):
    model = load_model(name, device=DEVICE).model
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    _, expected = decode(model, tokens)
    monkeypatch.setitem(fused.ops, "qk_norm_rope", layer_kernels.qk_norm_rope)
    monkeypatch.setitem(fused.ops, "append_kv", layer_kernels.append_kv)
    _, got = decode(model, tokens)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def test_decoder_with_triton_gemvs_matches_torch(monkeypatch, name):
    """Every decode product through gemv.py (the qkv bias of Qwen2, the o_proj + add + norm and gated
    epilogues, GeGLU on Gemma-3, the LM head) gives the logits plain torch gives."""
    model = load_model(name, device=DEVICE).model
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    _, expected = decode(model, tokens)
    monkeypatch.setattr(gemv, "_sm_count", lambda device: 1)  # tiny widths would go to cuBLAS on a GPU
    for op in ("linear", "linear_add_rms_norm", "gate_up_activation"):
        monkeypatch.setitem(fused.ops, op, getattr(gemv, op))
    _, got = decode(model, tokens)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def test_decoder_with_the_qkv_epilogue_matches_torch(monkeypatch, name):
    """Decode with optimized/qkv_epilogue.py (the qkv product carrying q/k norm, RoPE and the cache append)
    gives the logits plain torch gives (Llama: no q/k norm, Qwen2: its qkv bias, Qwen3 and Gemma-3: their
    q/k norms; tiny-gemma3's query scale wraps attend, which must keep the append target)."""
    model = load_model(name, device=DEVICE).model
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    _, expected = decode(model, tokens, append=True)
    monkeypatch.setattr(gemv, "_sm_count", lambda device: 1)  # tiny widths would go to cuBLAS on a GPU
    monkeypatch.setitem(fused.ops, "qk_norm_rope_append", layer_kernels.qk_norm_rope_append)
    monkeypatch.setitem(fused.ops, "linear_qk_norm_rope_append", qkv_epilogue.linear_qk_norm_rope_append)
    launches = []
    kernel = qkv_epilogue._qkv_append_kernel
    monkeypatch.setattr(qkv_epilogue, "_qkv_append_kernel", _Counting(kernel, launches))
    _, got = decode(model, tokens, append=True)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert len(launches) == 12 * model.config.num_layers  # every decode step of every layer took the one launch


@pytest.mark.parametrize("post_attention", [False, True])
@pytest.mark.parametrize("kernels", [False, True])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_decoder_with_folded_input_norms_matches_torch(monkeypatch, name, kernels, post_attention):
    """Decode with each layer's input norm folded into its qkv product (Decoder.fold_input_norms), and with
    `post_attention` its post-attention norm into gate_up: the torch references of the folded ops, then every
    decode op through its Triton kernel, give the logits the unfolded decoder gives; down_proj's add +
    sums-of-squares launch replaces the add + norm kernel, and folding both, o_proj's replaces its add +
    norm."""
    model = load_model(name, device=DEVICE).model
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    _, expected = decode(model, tokens, append=True)
    model.fold_input_norms(post_attention=post_attention)
    calls, normed_products = [], []
    monkeypatch.setitem(fused.ops, "add_rms_norm", _Recording(fused.ops["add_rms_norm"], calls))
    if kernels:
        monkeypatch.setattr(gemv, "_sm_count", lambda device: 1)  # tiny widths would go to cuBLAS on a GPU
        for op in ("linear", "linear_add_rms_norm", "gate_up_activation", "linear_add_squares"):
            monkeypatch.setitem(fused.ops, op, getattr(gemv, op))
        monkeypatch.setitem(fused.ops, "qk_norm_rope_append", layer_kernels.qk_norm_rope_append)
        monkeypatch.setitem(fused.ops, "linear_qk_norm_rope_append", qkv_epilogue.linear_qk_norm_rope_append)
        monkeypatch.setitem(fused.ops, "decode_inputs", layer_kernels.decode_inputs)
    monkeypatch.setitem(fused.ops, "linear_add_rms_norm", _Recording(fused.ops["linear_add_rms_norm"],
                                                                     normed_products))
    _, got = decode(model, tokens, append=True)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert not calls  # no layer ran the separate add + norm
    steps = 12  # of one token each
    assert len(normed_products) == (0 if post_attention else steps * model.config.num_layers)


def test_the_fold_is_refused_where_the_layers_differ_and_its_switch_is_checked(monkeypatch):
    from sfibench.errors import UsageError
    from sfibench.models.decoder import FOLD_ENV, fold_requested

    with pytest.raises(ValueError, match="Llama-family"):
        load_model("tiny-gemma3", device=DEVICE).model.fold_input_norms()
    assert not load_model("tiny-gemma3", device=DEVICE).model.can_fold_input_norms
    assert load_model("tiny-qwen3", device=DEVICE).model.can_fold_input_norms
    monkeypatch.delenv(FOLD_ENV, raising=False)
    assert fold_requested() == "1"  # both norms, by default (GPU sessions only: engine/session.py)
    monkeypatch.setenv(FOLD_ENV, "input")
    assert fold_requested() == "input"
    monkeypatch.setenv(FOLD_ENV, "0")
    assert fold_requested() == "0"
    monkeypatch.setenv(FOLD_ENV, "yes")
    with pytest.raises(UsageError, match="SFIBENCH_FOLD_INPUT_NORM='yes'"):
        fold_requested()


def test_the_fold_is_taken_only_where_down_proj_has_its_epilogue(monkeypatch):
    """The fold's sums of squares come from down_proj's GEMV epilogue: with down_proj on cuBLAS (too
    narrow for the GPU's SMs, as qwen3-0.6b's on an H200) they would cost launches of their own."""
    from sfibench.optimized import gemv

    monkeypatch.setenv(gemv.NARROW_ENV, "cublas")
    model = load_model("tiny-qwen3", device=DEVICE).model
    assert not load_model("tiny-gemma3", device=DEVICE).model.fold_pays(DEVICE)
    monkeypatch.setattr(gemv, "_sm_count", lambda device: 1)  # every product wide enough: the Triton GEMV
    assert model.fold_pays(DEVICE)
    monkeypatch.setattr(gemv, "_sm_count", lambda device: 10 ** 6)  # every product too narrow: cuBLAS
    assert not model.fold_pays(DEVICE)
    monkeypatch.delenv(gemv.NARROW_ENV)  # ... unless narrow products stay on the Triton GEMV (the default)
    assert model.fold_pays(DEVICE)


class _Recording:
    """An op whose calls are recorded."""

    def __init__(self, op, calls: list):
        self.op, self.calls = op, calls

    def __call__(self, *args, **kwargs):
        self.calls.append(args)
        return self.op(*args, **kwargs)


class _Counting:
    """A Triton kernel whose launches (`kernel[grid](...)`) are counted."""

    def __init__(self, kernel, launches: list):
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        self.launches.append(grid)
        return self.kernel[grid]


def test_stacked_projections_load_and_save_under_hugging_face_names(tiny_models):
    model = tiny_models["tiny-qwen2"].model
    state = model.state_dict()
    names = {key.split(".")[-2] for key in state if ".layers.0." in key}
    assert {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"} <= names
    assert not names & {"qkv_proj", "gate_up_proj"}
    stacked_bias = torch.cat([state[f"model.layers.0.self_attn.{part}_proj.bias"] for part in "qkv"])
    assert torch.equal(model.model.layers[0].self_attn.qkv_proj.bias, stacked_bias)
    reloaded = Decoder(model.config)
    reloaded.load_state_dict(state)
    for key, value in reloaded.state_dict().items():
        assert torch.equal(value, state[key]), key
    # a checkpoint missing one part is reported, not silently loaded
    del state["model.layers.0.self_attn.v_proj.weight"]
    missing, unexpected = Decoder(model.config).load_state_dict(state, strict=False)
    assert missing == ["model.layers.0.self_attn.qkv_proj.weight"]
    assert unexpected == ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"]


def small_qwen3(device, dtype) -> Decoder:
    """Qwen3-0.6B's layer shapes (head_dim 128, 16 q / 8 kv heads), 4 layers, a small vocabulary."""
    cfg = replace(get_preset("qwen3-0.6b"), name="small-qwen3", num_layers=4, vocab_size=1024)
    with torch.device("meta"):
        model = Decoder(cfg)
    model = model.to_empty(device=device)
    model.tie_weights()
    random_weights(model, seed=0)
    return _place(model, device, dtype)


@pytest.fixture
def fusion_off_afterwards():
    """Whatever the test switches on, the op table is plain torch again for the next one."""
    yield
    fused.enable_fusion(False)


@pytest.mark.gpu
@cuda
def test_fused_bfloat16_logits_are_as_accurate_as_eager(fusion_off_afterwards):
    """bf16 logits of the fused path (compiled elementwise ops, Triton layer kernels) land as close
    to the float32 logits as plain torch's bf16 logits do: rounding differs, accuracy must not."""
    tokens = torch.randint(0, 1024, (2, 24), generator=torch.Generator().manual_seed(0)).cuda()
    fused.enable_fusion(False)
    reference = decode(small_qwen3("cuda", torch.float32), tokens)[1]
    model = small_qwen3("cuda", torch.bfloat16)
    eager_error = (decode(model, tokens)[1].float() - reference).abs()
    fused.enable_fusion(True)
    fused_error = (decode(model, tokens)[1].float() - reference).abs()
    assert fused_error.mean() <= 1.5 * eager_error.mean()
    assert fused_error.max() <= 2 * eager_error.max()


@pytest.mark.gpu
@cuda
def test_fused_greedy_tokens_match_eager(fusion_off_afterwards):
    """16 greedy steps, fused against plain torch. In float32: with random weights the top-2 logit gap
    is often within bf16 rounding, so a bf16 greedy comparison could flip on a legitimate rounding."""
    model = small_qwen3("cuda", torch.float32)
    prompt = torch.randint(0, 1024, (2, 8), generator=torch.Generator().manual_seed(1)).cuda()
    fused.enable_fusion(False)
    eager_tokens, eager_logits = decode(model, prompt, greedy_steps=16)
    fused.enable_fusion(True)
    fused_tokens, fused_logits = decode(model, prompt, greedy_steps=16)
    assert torch.equal(fused_tokens, eager_tokens)
    torch.testing.assert_close(fused_logits, eager_logits, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("preset", ["qwen3-0.6b", "gemma3-270m"])
def test_fused_logits_match_eager_far_into_the_context(fusion_off_afterwards, preset):
    """The decode tests above start at position 0, where RoPE angles are small. A 32-token chunk at
    positions 30,000+ (float32, attention within the chunk) must give the same logits fused as eager:
    RoPE tables, q/k norms and the gated MLPs at the angles a long context reaches. (Written when a GPU
    quality run on Gemma-3 disagreed with the CPU; the cause was transformers 5.17's tokenizer,
    reports/diagnostics/gemma3-h200-mismatch, but this had never been checked either.)"""
    full = get_preset(preset)
    layers = {"num_layers": 6, "layer_is_global": full.layer_is_global[:6] if full.layer_is_global else None}
    cfg = replace(full, name=f"small-{preset}", vocab_size=1024, **layers)
    model_class = DECODERS.get(cfg.arch, Decoder)
    with torch.device("meta"):
        model = model_class(cfg)
    model = model.to_empty(device="cuda")
    model.tie_weights()
    random_weights(model, seed=0)
    model = _place(model, "cuda", torch.float32)
    tokens = torch.randint(0, 1024, (2, 32), generator=torch.Generator().manual_seed(2)).cuda()
    positions = (30_000 + torch.arange(32, device="cuda"))[None].expand(2, -1)

    def attend(layer, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    with torch.no_grad():
        fused.enable_fusion(False)
        eager = model(tokens, positions, attend)
        fused.enable_fusion(True)
        got = model(tokens, positions, attend)
    torch.testing.assert_close(got, eager, rtol=1e-3, atol=1e-3)
