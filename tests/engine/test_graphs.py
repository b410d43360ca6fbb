"""CUDA-graph replay must give what eager decoding gives (GPU only; CI proves it via committed reports)."""

from __future__ import annotations

import pytest
import torch
from method_matrix import METHOD_PATHS, small_spec

from sfibench.engine.cache import KVCache
from sfibench.engine.driver import StepDriver
from sfibench.engine.prefill import prefill
from sfibench.models.loading import load_model
from sfibench.registry import create_method

pytestmark = pytest.mark.gpu
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def decode(loaded, cache, pre, method, graphs: bool, inputs, runner=None):
    runner = runner or StepDriver(loaded.model, cache, method, use_graphs=graphs, length_bucket=16)
    runner.start(pre)
    method.observe(inputs[:, 0].cpu())
    logits, reads, replayed = [], [], 0
    for index in range(1, inputs.shape[1]):
        result = runner.step(inputs[:, index - 1])
        logits.append(result.logits.clone())
        reads.append(result.ctx.tokens_read.clone())
        replayed += result.replayed
        method.observe(inputs[:, index].cpu())
    return torch.stack(logits), torch.stack(reads), replayed


@cuda
@pytest.mark.parametrize("every_kernel", [True, False])
@pytest.mark.parametrize("name,path", METHOD_PATHS)
def test_graph_replay_matches_eager(name, path, every_kernel, monkeypatch):
    """Graphed steps (with programmatic dependent launch where the GPU has it: on every kernel, or the
    default's mix of launches with and without) against eager ones with plain serialised launches."""
    from sfibench.optimized import pdl

    loaded = load_model("tiny-qwen3", device="cuda", dtype=torch.float32)
    prompts = [list(range(10, 210)), list(range(40, 190))]
    cache = KVCache(loaded.config, 2, 300, "cuda", torch.float32)
    pre = prefill(loaded.model, cache, prompts)
    inputs = torch.randint(0, 256, (2, 60), generator=torch.Generator().manual_seed(0)).cuda()
    method = create_method(small_spec(name, path), loaded.config, loaded.tokenizer)
    default = pdl.WITH_PDL
    monkeypatch.setattr(pdl, "WITH_PDL", frozenset())  # serial launches
    eager_logits, eager_reads, _ = decode(loaded, cache, pre, method, False, inputs)
    monkeypatch.setattr(pdl, "WITH_PDL", frozenset(pdl.KINDS) if every_kernel else default)
    runner = StepDriver(loaded.model, cache, method, use_graphs=True, length_bucket=16)
    for _ in range(2):  # the second pass replays graphs captured in the first, after method.start()
        graph_logits, graph_reads, replayed = decode(loaded, cache, pre, method, True, inputs, runner)
        assert replayed > 30  # most steps really were graph replays
        assert torch.equal(eager_reads, graph_reads)
        assert torch.allclose(eager_logits, graph_logits, atol=1e-4, rtol=1e-4)


@cuda
def test_fused_elementwise_ops_match_eager():
    from sfibench.models import fused
    from sfibench.engine.prefill import causal_prefill_attention

    loaded = load_model("tiny-qwen3", device="cuda", dtype=torch.float32)
    tokens = torch.randint(0, 256, (2, 33), device="cuda")
    positions = torch.arange(33, device="cuda").expand(2, -1)

    def run():
        return loaded.model(tokens, positions, lambda layer, q, k, v: causal_prefill_attention(q, k, v, 0))

    eager = run()
    fused.enable_fusion(True)
    try:
        compiled = run()
    finally:
        fused.enable_fusion(False)
    assert fused.ops["rms_norm"] is fused.rms_norm
    assert torch.allclose(eager, compiled, atol=1e-4, rtol=1e-4)
