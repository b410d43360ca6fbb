"""`sfibench stability` (SPEC 8): the reducer on constructed attention, the probe, an end-to-end run, errors.

Constructed steps use a small geometry (2 sinks, recent window of 8, page 4) so that the candidate range
C = [2, recent_start(L)) is known by hand; logits are built so their softmax puts known mass on known
positions.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from typer.testing import CliRunner

from sfibench import registry
from sfibench.cli import app
from sfibench.core.budget import Budget
from sfibench.core.errors import UsageError
from sfibench.engine.cache import KVCache
from sfibench.engine.decode import generate
from sfibench.engine.prefill import prefill
from sfibench.engine.sampling import Sampler, SamplingConfig
from sfibench.metrics.stability import (
    StabilityConfig,
    StabilityInputError,
    check_config,
    pooled_attention,
    set_overlap,
    supports,
)
from sfibench.metrics.stability_reducer import StabilityReducer
from sfibench.registry import create_method
from sfibench.runners.stability import DenseProbe, StabilityRun, run_stability
from sfibench.sfi.config import SelectorConfig, SFIConfig
from sfibench.sfi.geometry import recent_start

DENSE = registry.spec(registry.dense().name)  # the method every other one is compared with

SMALL = SFIConfig(n_sink=2, n_recent=8, page=4, selector=SelectorConfig(use_cross_head=False))
LAYERS, HEADS, GROUP = 2, 2, 3


def peaked_logits(length: int, peaks: list[int], height: float = 12.0) -> torch.Tensor:
    """Logits `[LAYERS, HEADS, GROUP, length]`: zero except `height` at the peak positions."""
    logits = torch.zeros(LAYERS, HEADS, GROUP, length)
    logits[..., peaks] = height
    return logits


def feed(reducer: StabilityReducer, first_length: int, peaks_per_step: list[list[int]], starts: set[int]):
    """One update per entry; the context grows by one token per step; steps in `starts` open a sentence."""
    for index, peaks in enumerate(peaks_per_step):
        length = first_length + index
        reducer.update(peaked_logits(length, peaks), torch.ones(LAYERS, HEADS, length), index + 1 in starts)


def small_config(**overrides) -> StabilityConfig:
    return StabilityConfig(**{"topk_frac": 0.055, "k_head": Budget(tokens=3), "max_offset": 4, "prefix": 48,
                              "sfi": SMALL,
                              **overrides})


def test_pooling_is_the_mean_of_the_group_softmax():
    logits = torch.randn(LAYERS, HEADS, GROUP, 10)
    assert torch.allclose(pooled_attention(logits), logits.softmax(-1).mean(-2))


def test_supports_top_k_and_smallest_mass_set():
    pooled = torch.tensor([[0.3, 0.0, 0.05, 0.25, 0.15, 0.1, 0.15]])  # candidates are positions 1..5
    top, held = supports(pooled, 1, 6, k=2, mass=0.9)
    assert top[0].nonzero().flatten().tolist() == [3, 4]
    # candidate shares: .25/.55, .15/.55, .1/.55, .05/.55 -> the first three reach 0.9 (0.909)
    assert held[0].nonzero().flatten().tolist() == [3, 4, 5]


def test_overlap_and_jaccard_by_hand():
    a = torch.tensor([True, True, True, False, False])
    b = torch.tensor([False, True, True, True, True])
    overlap, jaccard = set_overlap(a, b)
    assert float(overlap) == pytest.approx(2 / 3) and float(jaccard) == pytest.approx(2 / 5)


def test_constant_support_gives_overlap_one():
    reducer = StabilityReducer(small_config(), LAYERS, HEADS)
    feed(reducer, 48, [[5, 9, 20]] * 12, starts={3})
    result = reducer.summary()
    for kind in ("topk", "mass"):
        for side in ("within", "across"):
            assert result["consecutive"][kind][side]["overlap_mean"] == 1.0
        assert result["consecutive"][kind]["within"]["jaccard_mean"] == 1.0
        assert all(v == 1.0 for v in result["drift"][f"{kind}_overlap"])
    assert result["consecutive"]["topk"]["within"]["pairs"] == 10
    assert result["consecutive"]["topk"]["across"]["pairs"] == 1


def test_support_jumping_at_a_boundary_counts_as_across():
    reducer = StabilityReducer(small_config(), LAYERS, HEADS)
    feed(reducer, 48, [[5, 9, 20]] * 5 + [[7, 14, 30]] * 5, starts={6})
    topk = reducer.summary()["consecutive"]["topk"]
    assert topk["across"]["pairs"] == 1 and topk["across"]["overlap_mean"] == 0.0
    assert topk["within"]["pairs"] == 8 and topk["within"]["overlap_mean"] == 1.0
    assert reducer.summary()["sentences"]["starts"] == 1


def test_recall_of_a_known_selection_is_exact():
    """The Selector at t0 must pick the three peaks; recall at t is then a sum of known softmax weights."""
    cfg = small_config(k_head=Budget(tokens=3))
    reducer = StabilityReducer(cfg, LAYERS, HEADS)
    picks, t0_length = [6, 15, 27], 48
    reducer.update(peaked_logits(t0_length, picks, height=30.0), torch.ones(LAYERS, HEADS, t0_length), True)
    assert reducer.memories[0].start["selected"][0, 0].nonzero().flatten().tolist() == picks

    # The next step (offset 1), with 5 more tokens so the recent window has moved past t0's anchor.
    # Its weights are w_j = exp(logit_j) / Z: e^2 at the `heavy` positions, 1 elsewhere.
    length = t0_length + 5
    heavy = [0, 6, 10, 27, 40, 45, 52]
    logits = peaked_logits(length, heavy, height=2.0)
    reducer.update(logits, torch.ones(LAYERS, HEADS, length), False)
    weight = torch.ones(length)
    weight[heavy] = math.e**2
    weight /= weight.sum()
    anchor = min(int(recent_start(torch.tensor(t0_length), 8, 4)), int(recent_start(torch.tensor(length), 8, 4)))
    stale = set(range(2)) | set(picks) | set(range(anchor, length))
    recent_tokens = len(stale) - 2
    streaming = set(range(2)) | set(range(length - recent_tokens, length))
    result = reducer.summary()["recall"]
    assert result["stale"]["mean"] == pytest.approx(float(weight[sorted(stale)].sum()), abs=1e-6)
    assert result["streaming"]["mean"] == pytest.approx(float(weight[sorted(streaming)].sum()), abs=1e-6)
    assert result["stale"]["tokens_read_mean"] == result["streaming"]["tokens_read_mean"] == len(stale)
    assert result["stale"]["by_offset"][0] == pytest.approx(result["stale"]["mean"])  # offset 1


@pytest.mark.parametrize("frac", [0.0, 1.0, -0.1, 1.5])
def test_topk_fraction_outside_open_unit_interval_is_refused(frac):
    with pytest.raises(StabilityInputError, match="topk-frac"):
        check_config(StabilityConfig(topk_frac=frac))


def test_probe_attends_exactly_like_full_kv(tiny_models):
    loaded = tiny_models["tiny-llama"]
    ids = loaded.tokenizer.encode("A lamp. A tower stands on the rock! Ships pass by at night.")
    cache = KVCache(loaded.config, 1, len(ids), "cpu", torch.float32)
    prefilled = prefill(loaded.model, cache, [ids[:20]])
    forced = torch.tensor([ids[20:]])
    logits = {}
    for name, method in (("full", create_method(DENSE, loaded.config, loaded.tokenizer)),
                         ("probe", DenseProbe(registry.default_config(registry.dense().name), loaded.config, loaded.tokenizer))):
        trace = generate(loaded.model, cache, method, prefilled, forced.shape[1], Sampler(SamplingConfig(), "cpu"),
                         forced=forced, keep_logits=True)
        logits[name] = torch.stack(trace.logits)
    assert torch.equal(logits["full"], logits["probe"])


def test_end_to_end_on_tiny_llama(tmp_path):
    """Byte tokens: token i is character i, so the sentence starts are known from the text itself."""
    text = "The lamp was lit at dusk. Ships passed the rock!  Was anyone awake? " * 4
    (tmp_path / "text.txt").write_text(text)
    cfg = small_config(model="tiny-llama", text_file=str(tmp_path / "text.txt"), steps=60, prefix=48, max_offset=8)
    run_dir = run_stability(StabilityRun(cfg, out=tmp_path / "run"), show_progress=False)
    document = json.loads((run_dir / "results.json").read_text())
    (results,) = document["results"]["segments"]
    assert document["command"] == "stability" and results["steps"] == 60
    starts = [m.end() for m in re.finditer(r"[.?!]+\s*", text) if 48 <= m.end() < 48 + 60]
    assert results["sentences"]["starts"] == len(starts) > 0
    pairs = sum(results["consecutive"]["topk"][side]["pairs"] for side in ("within", "across"))
    assert pairs == 59
    for name in ("report.md", "overlap_vs_offset.png", "within_vs_across.png", "recall_heatmap.png"):
        assert (run_dir / name).stat().st_size > 0
    with pytest.raises(FileExistsError):  # an earlier run is never overwritten silently
        run_stability(StabilityRun(cfg, out=run_dir), show_progress=False)


def test_bad_text_and_context_are_clear_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(UsageError, match="--text-file .* is empty"):  # the shared text-file check
        run_stability(StabilityRun(small_config(model="tiny-llama", text_file=str(empty)), out=tmp_path / "a"))
    short = tmp_path / "short.txt"
    short.write_text("Too short. " * 5)
    with pytest.raises(StabilityInputError, match="tokens but"):
        run_stability(StabilityRun(small_config(model="tiny-llama", text_file=str(short), steps=10), out=tmp_path / "b"))
    with pytest.raises(StabilityInputError, match="context of 4096 tokens"):
        run_stability(StabilityRun(small_config(model="tiny-llama", steps=5000), out=tmp_path / "c"))


def test_cli_reports_bad_input_without_traceback():
    result = CliRunner().invoke(app, ["stability", "--topk-frac", "1.5"])
    assert result.exit_code == 2
    assert "topk-frac" in result.output


def test_generate_mode_analyses_the_models_own_tokens(tmp_path):
    cfg = small_config(model="tiny-llama", generate=True, steps=20, prefix=48)
    run_dir = run_stability(StabilityRun(cfg, out=tmp_path / "gen"), show_progress=False)
    (results,) = json.loads((run_dir / "results.json").read_text())["results"]["segments"]
    assert results["mode"] == "generated" and results["perplexity"] is None
    assert 1 <= results["steps"] <= 20  # a sampled end-of-sequence token ends the run early
