"""One copy of every weight: loading for decode and folding the norms into the products allocate no second
copy and no whole-model temporary, and the folded model computes what the unfolded one does."""

from __future__ import annotations

import pytest
import torch

from allocator import AllocatorPeak
from sfibench.models.loading import load_model


def _prefill_logits(model, tokens):
    """A causal forward over `tokens [B, T]` through the unfolded path (what prefill runs)."""
    def attend(layer, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    positions = torch.arange(tokens.shape[1])[None].expand_as(tokens)
    return model(tokens, positions, attend)


def _storage_bytes(model) -> int:
    """Bytes of the distinct storages behind every parameter, buffer and tensor attribute of every module."""
    seen = {}
    for module in model.modules():
        tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False),
                   *(value for value in vars(module).values() if isinstance(value, torch.Tensor))]
        for tensor in tensors:
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_the_fold_rewrites_weights_in_place_and_keeps_the_logits(name):
    model = load_model(name, dtype=torch.float32).model
    weight_bytes = model.config.num_params() * 4
    before = _storage_bytes(model)
    assert before - weight_bytes < 4 * model.config.head_dim  # the weights, and only RoPE's frequencies beside
    qkv = model.model.layers[0].self_attn.qkv_proj.weight
    address = qkv.data_ptr()
    tokens = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    expected = _prefill_logits(model, tokens)
    with AllocatorPeak() as fold:
        model.fold_input_norms()
    assert fold.peak <= model.config.hidden_size * 4  # no copy of a weight, not even one layer's
    assert _storage_bytes(model) == before
    assert qkv.data_ptr() == address
    assert torch.equal(model.model.layers[0].input_layernorm.weight, torch.ones(model.config.hidden_size))
    torch.testing.assert_close(_prefill_logits(model, tokens), expected, rtol=1e-4, atol=1e-4)


def test_a_second_fold_is_refused():
    model = load_model("tiny-qwen3").model
    model.fold_input_norms()
    with pytest.raises(ValueError, match="already folded"):
        model.fold_input_norms()


def test_a_bfloat16_model_loads_without_a_float32_copy_and_rounds_the_float32_values():
    """Random weights are drawn one parameter at a time in float32: the bfloat16 model holds exactly the
    float32 model's values rounded, and loading never held more than the weights plus one float32 parameter."""
    reference = load_model("tiny-qwen3", dtype=torch.float32).model
    with AllocatorPeak() as load:
        model = load_model("tiny-qwen3", dtype=torch.bfloat16).model
    weight_bytes = model.config.num_params() * 2
    largest = max(p.numel() for p in model.parameters())
    assert weight_bytes <= load.live
    assert load.peak <= weight_bytes + largest * 4 + 64 * 1024  # + one float32 draw + RoPE's small tables
    for (name, got), (_, want) in zip(model.named_parameters(), reference.named_parameters()):
        assert got.dtype == torch.bfloat16
        assert torch.equal(got, want.to(torch.bfloat16)), name
