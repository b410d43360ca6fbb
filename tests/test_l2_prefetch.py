"""optimized/l2_prefetch.py: which weights a decode attention kernel warms in L2, and that warming them
changes no result. (Whether it pays is a timing question for the H200 A/B, not a test.)"""

from __future__ import annotations

import pytest
import torch
from test_kernels import DEVICE, random_qkv

from sfibench.config import MethodSpec
from sfibench.engine.cache import KVCache
from sfibench.engine.driver import StepDriver
from sfibench.engine.prefill import prefill
from sfibench.errors import UsageError
from sfibench.methods import create_method
from sfibench.models.loading import load_model
from sfibench.optimized import decode_attention, l2_prefetch


def test_the_weights_after_attention_are_o_proj_then_gate_up_as_the_step_uses_it_then_down_proj():
    model = load_model("tiny-qwen3", device=DEVICE).model
    layer = model.model.layers[1]
    plain = model.weights_after_attention(1)
    assert [w.data_ptr() for w in plain] == [layer.self_attn.o_proj.weight.data_ptr(),
                                             layer.mlp.gate_up_proj.weight.data_ptr(),
                                             layer.mlp.down_proj.weight.data_ptr()]
    model.fold_input_norms()  # decode then multiplies by the norm-folded copy of gate_up
    assert model.weights_after_attention(1)[1].data_ptr() == layer.mlp.gate_up_folded.data_ptr()
    assert model.weights_after_attention(1)[1].data_ptr() != plain[1].data_ptr()


def test_every_optimized_attention_launch_is_handed_its_layers_next_weights(monkeypatch):
    """The driver names each layer's next weights and the optimized methods pass them to the kernel
    launcher, which asks the switch how many to warm (here spied on; off the GPU it warms none)."""
    handed = []
    real_chosen = l2_prefetch.chosen
    monkeypatch.setattr(l2_prefetch, "chosen",
                        lambda weights, device: handed.append(weights) or real_chosen(weights, device))
    loaded = load_model("tiny-qwen3", device=DEVICE)
    model = loaded.model
    for name in ("full_kv", "streaming_llm"):
        handed.clear()
        cache = KVCache(loaded.config, 1, 64, DEVICE, torch.float32)
        driver = StepDriver(model, cache, create_method(MethodSpec(name=name, path="optimized"), loaded.config,
                                                        loaded.tokenizer))
        driver.start(prefill(model, cache, [list(range(5, 25))]))
        driver.step(torch.tensor([7], device=DEVICE))
        layers = model.config.num_layers
        assert len(handed) == layers, name
        for index, weights in enumerate(handed):
            assert [w.data_ptr() for w in weights] == [w.data_ptr() for w in model.weights_after_attention(index)]


def test_the_switch_counts_the_products_warmed_never_off_cuda_and_refuses_bad_values(monkeypatch):
    weights = tuple(torch.zeros(n, 64, dtype=torch.bfloat16) for n in (3, 5, 7))
    monkeypatch.delenv(l2_prefetch.ENV, raising=False)
    assert l2_prefetch.chosen(weights, torch.device("cpu")) == ()
    for value in l2_prefetch.MEANINGS:
        monkeypatch.setenv(l2_prefetch.ENV, value)
        assert l2_prefetch.chosen(weights, torch.device("cpu")) == ()  # the interpreter has no PTX
    monkeypatch.setenv(l2_prefetch.ENV, "all")
    with pytest.raises(UsageError, match="SFIBENCH_L2_PREFETCH='all'.*0 = off.*3 = "):
        l2_prefetch.chosen(weights, torch.device("cpu"))


def test_only_the_leading_weights_that_fit_the_budget_together_are_warmed():
    cpu = torch.device("cpu")
    weights = tuple(torch.zeros(n, 64, dtype=torch.bfloat16) for n in (3, 5, 7))  # 384, 640, 896 bytes
    assert l2_prefetch.fitting(weights, 2000, cpu) == weights
    assert [w.shape[0] for w in l2_prefetch.fitting(weights, 1100, cpu)] == [3, 5]
    assert l2_prefetch.fitting(weights, 300, cpu) == ()  # never a later one past an earlier that did not fit
    with pytest.raises(ValueError, match="contiguous"):
        l2_prefetch.fitting((torch.zeros(4, 64).t(),), 2000, cpu)


def test_kernel_args_give_each_region_its_whole_lines_and_pad_the_rest():
    placeholder = torch.zeros(4)
    weight = torch.zeros(3, 100, dtype=torch.bfloat16)  # 600 bytes: 5 lines of 128, the last partial
    args, options = l2_prefetch.kernel_args((weight,), placeholder)
    assert args[0] is weight and args[1] == 5
    assert args[2] is placeholder and args[3] == 0 and args[4] is placeholder and args[5] == 0
    assert options == {"PREFETCH_REGIONS": 1, "LINE_ELEMENTS": 64}
    args, options = l2_prefetch.kernel_args((), placeholder)
    assert args[1::2] == [0, 0, 0] and options["PREFETCH_REGIONS"] == 0
    with pytest.raises(ValueError, match="at most 3"):
        l2_prefetch.kernel_args((weight,) * 4, placeholder)


@pytest.mark.skipif(not torch.cuda.is_available() or DEVICE != "cuda", reason="needs CUDA (inline PTX)")
@pytest.mark.parametrize("regions", ["1", "3"])
def test_warming_changes_no_output_of_either_attention_kernel(monkeypatch, regions):
    from test_two_segment import two_segment_inputs

    from sfibench.optimized.two_segment import two_segment_decode

    weights = tuple(torch.randn(n, 1024, device="cuda", dtype=torch.bfloat16) for n in (1024, 6144, 1000))
    q, k, v = random_qkv(2, 4, 2, 128, 3000, torch.bfloat16, 3, device="cuda")
    lengths = torch.tensor([3000, 1234], device="cuda")
    inputs = two_segment_inputs(4, 2, 128, 64, 3000, torch.bfloat16, 5, [(0, 2000, 2900), (-1, 0, 1500)],
                                poison=False, device="cuda")
    results = {}
    for value in ("0", regions):
        monkeypatch.setenv(l2_prefetch.ENV, value)
        assert len(l2_prefetch.chosen(weights, q.device)) == int(value)
        results[value] = (decode_attention.dense_decode(q, k, v, lengths, warm=weights),
                          two_segment_decode(**inputs, warm=weights, short_splits=True, one_loop=True))
    torch.cuda.synchronize()
    for off, on in zip(results["0"], results[regions]):
        assert torch.equal(off, on)
