"""sfibench.hf on models outside the engine's families, what it refuses, what it leaves behind, the example in
docs/transformers.md as written, and `sfibench quality --engine transformers`."""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import re
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from helpers import hf_twin
from hf_cases import assert_same_steps, engine_trace, hf_generate, left_padded
from method_matrix import small_spec
from typer.testing import CliRunner

import sfibench.hf
from sfibench import registry
from sfibench.cli import app
from sfibench.core.errors import UsageError
from sfibench.models.loading import LoadedModel, load_model
from sfibench.models.tokenizer import ByteTokenizer, Tokenizer
from sfibench.runners.quality import run_quality
from sfibench.commands.quality_options import quality_run
from sfibench.sfi.config import SFIConfig

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = Tokenizer(ByteTokenizer())
CACHE = sfibench.hf.CACHE_ARGUMENT  # `cache` from transformers 5.24, `past_key_values` before
PROMPTS = [list(b"In the valley there were three mills. The oldest one ground flour for the whole town, and the "
                b"miller kept a ledger of every sack. In the ledger the number of the last sack was"),
           list(b"Tom counted the stars from his window. He wrote the count on a card:")]
# transformers' own config classes at tiny sizes (no sliding window unless a test sets one); a larger init than
# the default 0.02 makes greedy choices clear, so two exact computations agree on every token
TINY = {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
        "initializer_range": 0.2, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
ARCHITECTURES = {
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {"head_dim": 16, "sliding_window": None}),
    "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM, {}),
}


def tiny(kind: str, **changes):
    config_class, model_class, own = ARCHITECTURES[kind]
    torch.manual_seed(0)
    return model_class(config_class(**{**TINY, **own, **changes})).eval()


def stock_generate(model, prompts, new_tokens: int) -> torch.Tensor:
    inputs = left_padded(prompts)
    out = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return out[:, inputs["input_ids"].shape[1]:]


@pytest.mark.parametrize("name", registry.names())
@pytest.mark.parametrize("kind", list(ARCHITECTURES))
def test_other_architectures_run_every_method(kind, name):
    """generate inside sfibench.hf steps as the engine's own driver steps the same transformers model, and under
    Full-KV it makes what transformers makes without sfibench."""
    model = tiny(kind)
    spec = small_spec(name, "reference")
    tokens, cache = hf_generate(model, TOKENIZER, spec, PROMPTS, 16)
    view = sfibench.hf.engine_view(copy.deepcopy(model))
    trace = engine_trace(LoadedModel(view, TOKENIZER, view.config), spec, PROMPTS, 16)
    assert_same_steps(trace, tokens, cache)
    if registry.get(name).dense:
        assert torch.equal(tokens, stock_generate(model, PROMPTS, 16))
    else:
        last = cache.steps[-1]
        assert (last.tokens_read < last.kv_lengths[None, :, None]).any()


def test_sliding_window_layers_stay_as_the_model_defines_them():
    """Every Mistral layer slides a 16-token window here: no method has a layer to select in, each reads the
    window, and the tokens are the model's own."""
    model = tiny("mistral", sliding_window=16)
    expected = stock_generate(model, PROMPTS, 12)
    for name in registry.names():
        tokens, cache = hf_generate(model, TOKENIZER, small_spec(name, "reference"), PROMPTS, 12)
        assert torch.equal(tokens, expected), name
        assert all(bool((step.tokens_read == 16).all()) for step in cache.steps), name


def test_leaving_the_block_restores_the_model():
    model = tiny("mistral")
    implementation, expected = model.config._attn_implementation, stock_generate(model, PROMPTS, 8)
    logits = model(**left_padded(PROMPTS)).logits
    with sfibench.hf.apply(model, TOKENIZER, "full_kv"):
        assert model.config._attn_implementation != implementation
        # a scoring pass without sfibench's cache is the model's own dense attention
        assert torch.equal(model(**left_padded(PROMPTS)).logits, logits)
        model.generate(**left_padded(PROMPTS), max_new_tokens=4, pad_token_id=0)
        with pytest.raises(sfibench.hf.UnsupportedModelError, match="one method at a time"), \
                sfibench.hf.apply(model, TOKENIZER, "sfi"):
            pass
    with pytest.raises(RuntimeError, match="inside"), sfibench.hf.apply(model, TOKENIZER, "full_kv"):
        raise RuntimeError("an error inside the block")
    assert model.config._attn_implementation == implementation
    assert not model._forward_pre_hooks and not model._forward_hooks and "generate" not in vars(model)
    assert torch.equal(stock_generate(model, PROMPTS, 8), expected)


def test_an_unsupported_architecture_is_refused_naming_what_is_missing():
    torch.manual_seed(0)
    gemma2 = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**{**TINY, "head_dim": 16})).eval()
    before = gemma2.config._attn_implementation
    with pytest.raises(sfibench.hf.UnsupportedModelError, match=r"soft-capping \(softcap=50\.0\)"), \
            sfibench.hf.apply(gemma2, TOKENIZER, "full_kv"):
        pass
    assert gemma2.config._attn_implementation == before and not gemma2._forward_pre_hooks
    with pytest.raises(sfibench.hf.UnsupportedModelError, match="not a transformers model"), \
            sfibench.hf.apply(torch.nn.Linear(2, 2), TOKENIZER, "full_kv"):
        pass
    with pytest.raises(UsageError, match="valid methods"):
        sfibench.hf.apply(gemma2, TOKENIZER, "h2o")
    with pytest.raises(UsageError, match="takes its own settings, a QuestConfig"):
        sfibench.hf.apply(gemma2, TOKENIZER, "quest", config=SFIConfig())


def test_what_the_cache_cannot_follow_is_refused():
    model = tiny("mistral")
    inputs = left_padded(PROMPTS)
    right = {"input_ids": inputs["input_ids"].flip(1), "attention_mask": inputs["attention_mask"].flip(1)}
    with sfibench.hf.apply(model, TOKENIZER, "full_kv") as applied:
        with pytest.raises(sfibench.hf.UnsupportedGenerationError, match="left-padded"):
            model.generate(**right, max_new_tokens=4, pad_token_id=0)
        with pytest.raises(sfibench.hf.UnsupportedGenerationError, match="beam search"):
            model.generate(**inputs, max_new_tokens=4, num_beams=2, pad_token_id=0)
        with pytest.raises(sfibench.hf.UnsupportedGenerationError, match="holds 2 new tokens"):
            model.generate(**inputs, max_new_tokens=4, pad_token_id=0, **{CACHE: applied.cache(2)})
        other = transformers.DynamicCache(config=model.config)
        model(**inputs, **{CACHE: other})  # a prompt pass: dense, as every method prefills
        with pytest.raises(sfibench.hf.UnsupportedGenerationError, match="did not make"):
            model(input_ids=inputs["input_ids"][:, -1:], **{CACHE: other})


def test_the_cache_goes_under_the_installed_releases_argument_name_with_no_deprecation_warning():
    """transformers 5.24 renamed the forwards' `past_key_values` to `cache`, keeping the old name with a
    FutureWarning: the block's generate passes its cache under the installed release's name, and a cache given
    under either name the release takes is the one the method runs on."""
    assert CACHE in inspect.signature(transformers.LlamaForCausalLM.forward).parameters
    model, inputs = tiny("mistral"), left_padded(PROMPTS)
    with sfibench.hf.apply(model, TOKENIZER, "sfi") as applied, warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        model.generate(**inputs, max_new_tokens=3, pad_token_id=0)
        assert len(applied.last_cache.steps) == 2  # the prompt forward, then two decode steps
        own = applied.cache(max_new_tokens=3)
        model.generate(**inputs, max_new_tokens=3, pad_token_id=0, **{CACHE: own})
        assert applied.last_cache is own and len(own.steps) == 2


def test_a_cache_under_a_name_the_release_does_not_take_is_refused(monkeypatch):
    """Before 5.24 a forward has no `cache` argument and would leave a cache given so unused (a dense run)."""
    # the module, not the `apply` function sfibench.hf exports under the same name
    monkeypatch.setattr(importlib.import_module("sfibench.hf.apply"), "CACHE_ARGUMENT", "past_key_values")
    model, inputs = tiny("mistral"), left_padded(PROMPTS)
    with sfibench.hf.apply(model, TOKENIZER, "sfi") as applied, \
            pytest.raises(UsageError, match="pass the cache as past_key_values="):
        model(**inputs, cache=applied.cache(max_new_tokens=2))


def docs_example() -> str:
    """The first python block of docs/transformers.md that applies a method."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "transformers.md").read_text(), re.DOTALL)
    return next(block for block in blocks if "sfibench.hf.apply(" in block)


class PrintableBytes(ByteTokenizer):
    """The tiny models' byte tokenizer with the `batch_decode` the page prints the answers through."""

    def batch_decode(self, rows, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(row.tolist()) for row in rows]


def test_the_docs_example_runs_as_written():
    loaded = load_model("tiny-llama")
    model, inputs = hf_twin(loaded.model), left_padded(PROMPTS)
    namespace = {"model": model, "tokenizer": PrintableBytes(), "inputs": inputs}
    exec(docs_example(), namespace)  # noqa: S102  (the page's code, run as a reader runs it)
    context = inputs["input_ids"].shape[1]
    new = namespace["output"][:, context:]
    budget = round(0.15 * max(map(len, PROMPTS)))  # "15%" of the longest prompt
    assert re.search(r'method="sfi", budget="15%"', docs_example())
    trace = engine_trace(loaded, registry.at_budget("sfi", "reference", budget), PROMPTS, new.shape[1])
    assert new.tolist() == trace.tokens.tolist()


def test_quality_engine_options_are_checked_before_loading(tmp_path):
    with pytest.raises(UsageError, match="random-weight preset"):
        quality_run("tiny-llama", ["sfi"], ["niah_single"], ["300"], ["0.5"], ["1"], engine="transformers")
    with pytest.raises(UsageError, match="--engine 'vllm' is not one of sfibench, transformers"):
        quality_run("tiny-llama", ["sfi"], ["niah_single"], ["300"], ["0.5"], ["1"], engine="vllm")
    with pytest.raises(UsageError, match="reference path"):
        quality_run("smollm2-135m", ["sfi"], ["niah_single"], ["300"], ["0.5"], ["1"], engine="transformers",
                    path="optimized")


@pytest.mark.full  # two quality runs
def test_quality_through_transformers_gives_the_engines_report(tmp_path):
    """The same checkpoint (tiny-llama's weights saved by transformers) through the engine's decoder and through
    transformers with sfibench.hf: every sample's answer, score, tokens read and step kinds agree."""
    checkpoint = tmp_path / "checkpoint"
    hf_twin(load_model("tiny-llama").model).save_pretrained(checkpoint)
    options = {"device": "cpu", "chat": False, "batch": 2}
    args = (str(checkpoint), ["sfi"], ["niah_single"], ["400"], ["0.5"], ["2"])
    engine = run_quality(quality_run(*args, out=tmp_path / "engine", **options))
    result = CliRunner().invoke(app, ["quality", "--engine", "transformers", "--model", str(checkpoint), "--methods",
                                      "sfi", "--tasks", "niah_single", "--ctx", "400", "--retention", "0.5",
                                      "--samples", "2", "--batch", "2", "--no-chat", "--device", "cpu", "--out",
                                      str(tmp_path / "transformers")])
    assert result.exit_code == 0, result.output
    ours, theirs = (json.loads((run / "results.json").read_text()) for run in (tmp_path / "transformers", engine))
    assert ours["config"]["engine"] == "transformers" and theirs["config"]["engine"] == "sfibench"
    keys = ("task", "index", "method", "prediction", "score", "measured_retention", "steps_by_kind")
    assert [{k: s[k] for k in keys} for s in ours["samples"]] == [{k: s[k] for k in keys} for s in theirs["samples"]]
    assert [s["kl"] for s in ours["samples"]] == pytest.approx([s["kl"] for s in theirs["samples"]], abs=1e-5)
    assert any(s["steps_by_kind"].get("fast") for s in ours["samples"])  # SFI really ran sparse steps
