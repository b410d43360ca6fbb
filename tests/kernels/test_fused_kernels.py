"""The fused decode path: the decoder with its ops swapped for the Triton kernels (layer kernels, GEMVs, the
qkv epilogue, the norm folds) against plain torch, the stacked projections' Hugging Face names, and (on a
GPU) fused against plain-torch logits and greedy tokens. Each kernel alone against its reference:
tests/kernels/test_layer_kernels.py, tests/kernels/test_gemv.py, tests/kernels/test_qkv_epilogue.py.

Without CUDA the kernels run under the Triton interpreter on CPU tensors (conftest.py chooses it
before any sfibench import).
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from sfibench.engine.cache import KVCache
from sfibench.models import fused
from sfibench.models.decoder import Decoder
from sfibench.models.loading import DECODERS, _place, load_model, random_weights
from sfibench.models.presets import get_preset
from sfibench.optimized import gemv, layer_kernels, qkv_epilogue

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


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
        monkeypatch.setitem(fused.ops, op, fused.kernel_ops()[op])
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
    monkeypatch.setitem(fused.ops, "linear_qk_norm_rope_append", fused.kernel_ops()["linear_qk_norm_rope_append"])
    launches = []
    kernel = qkv_epilogue._qkv_append_kernel
    monkeypatch.setattr(qkv_epilogue, "_qkv_append_kernel", _Counting(kernel, launches))
    _, got = decode(model, tokens, append=True)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert len(launches) == 12 * model.config.num_layers  # every decode step of every layer took the one launch


@pytest.mark.parametrize("kernels", [False, True])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_decoder_with_folded_input_norms_matches_torch(monkeypatch, name, kernels):
    """Decode with each layer's input norm folded into its qkv product and its post-attention norm into gate_up
    (Decoder.fold_input_norms): the torch references of the folded ops, then every decode op through its
    Triton kernel, give the logits the unfolded decoder gives; down_proj's and o_proj's add +
    sums-of-squares launches replace the add + norm kernels. The final norm is folded into the LM head."""
    model = load_model(name, device=DEVICE).model
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    _, expected = decode(model, tokens, append=True)
    model.fold_input_norms()
    calls, normed_products, norms = [], [], []
    monkeypatch.setitem(fused.ops, "add_rms_norm", _Recording(fused.ops["add_rms_norm"], calls))
    monkeypatch.setitem(fused.ops, "rms_norm", _Recording(fused.ops["rms_norm"], norms))
    if kernels:
        monkeypatch.setattr(gemv, "_sm_count", lambda device: 1)  # tiny widths would go to cuBLAS on a GPU
        for op in ("linear", "linear_add_rms_norm", "gate_up_activation", "linear_add_squares"):
            monkeypatch.setitem(fused.ops, op, fused.kernel_ops()[op])
        monkeypatch.setitem(fused.ops, "qk_norm_rope_append", layer_kernels.qk_norm_rope_append)
        monkeypatch.setitem(fused.ops, "linear_qk_norm_rope_append", fused.kernel_ops()["linear_qk_norm_rope_append"])
        monkeypatch.setitem(fused.ops, "decode_inputs", layer_kernels.decode_inputs)
    monkeypatch.setitem(fused.ops, "linear_add_rms_norm", _Recording(fused.ops["linear_add_rms_norm"],
                                                                     normed_products))
    _, got = decode(model, tokens, append=True)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert not calls  # no layer ran the separate add + norm
    assert not norms  # nor the final norm: the last down_proj and the LM head carry it
    assert not normed_products  # o_proj's add + norm epilogue is not used either


def test_the_fold_is_refused_where_the_layers_differ():
    with pytest.raises(ValueError, match="Llama-family"):
        load_model("tiny-gemma3", device=DEVICE).model.fold_input_norms()
    assert not load_model("tiny-gemma3", device=DEVICE).model.can_fold_input_norms
    assert load_model("tiny-qwen3", device=DEVICE).model.can_fold_input_norms


def test_the_fold_is_taken_only_where_down_proj_has_its_epilogue():
    """The fold's sums of squares come from down_proj's GEMV epilogue: Gemma-3's layers and prefill-sized
    products (cuBLAS's) have none."""
    from sfibench.optimized import gemv

    assert not load_model("tiny-gemma3", device=DEVICE).model.fold_pays(DEVICE)
    assert load_model("tiny-qwen3", device=DEVICE).model.fold_pays(DEVICE)
    assert gemv.decode_config(gemv.MAX_ROWS + 1, 64, 64, torch.device(DEVICE)) is None


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
