"""`sfibench stability` over contexts and prompt sources: the global layers of a sliding-window model,
SFI's bootstrap selection, SnapKV's memory against SnapKV itself, the fixed trigger, where the mass
moves, the needle's tokens, and a whole run on tiny-gemma3 (bad input is in
tests/commands/test_bad_input.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from typer.testing import CliRunner

from sfibench import registry
from sfibench.baselines.quest import QuestConfig
from sfibench.baselines.snapkv import SnapKVConfig
from sfibench.baselines.tidaldecode import TidalDecodeConfig
from sfibench.cli import app
from sfibench.core.budget import Budget
from sfibench.engine.cache import KVCache
from sfibench.engine.method import AttentionView, RecallMemory
from sfibench.engine.prefill import prefill
from sfibench.metrics.stability import StabilityInputError, analysed_layers
from sfibench.metrics.stability_memories import Retriggered
from sfibench.metrics.stability_where import MovingMass
from sfibench.models.loading import load_model
from sfibench.models.presets import PRESETS
from sfibench.registry import create_method
from sfibench.runners.stability_prompts import value_positions
from sfibench.sfi.config import SFIConfig
from sfibench.sfi.recall import SFIRecall
from sfibench.sfi.selector import SelectorConfig, select

GEMMA = PRESETS["tiny-gemma3"]  # layers: sliding, global, sliding


def test_only_global_layers_are_analysed_and_a_model_without_any_is_refused(monkeypatch):
    assert analysed_layers(GEMMA) == [1]
    assert analysed_layers(PRESETS["tiny-llama"]) == [0, 1]
    sliding = dataclasses.replace(GEMMA, name="tiny-sliding", layer_is_global=(False, False, False))
    with pytest.raises(StabilityInputError, match="tiny-sliding has no global layer: all 3 layers attend a 16-token"):
        analysed_layers(sliding)
    monkeypatch.setitem(PRESETS, "tiny-sliding", sliding)
    result = CliRunner().invoke(app, ["stability", "--model", "tiny-sliding", "--steps", "8", "--prefix", "300"])
    assert result.exit_code == 2 and "has no global layer" in result.output and "Traceback" not in result.output


def random_view(layers: int = 2, heads: int = 2, group: int = 2, length: int = 90, dim: int = 8, rows: int = 6,
                seed: int = 0) -> AttentionView:
    """One decode step after a (length - 1)-token prompt whose last `rows` queries are kept."""
    generator = torch.Generator().manual_seed(seed)
    queries = torch.randn(layers, heads * group, dim, generator=generator)
    keys = torch.randn(layers, heads, length, dim, generator=generator)
    logits = torch.einsum("lhgd,lhnd->lhgn", queries.view(layers, heads, group, dim), keys) * dim**-0.5
    prompt_queries = torch.randn(layers, heads * group, rows, dim, generator=generator)
    return AttentionView(logits, keys.norm(dim=-1), False, queries=queries, keys=keys, prompt_queries=prompt_queries,
                         prompt_length=length - 1)


def test_sfi_reads_its_bootstrap_selection_before_the_first_refresh():
    """The first steps read what prefill selected from the last w_prefill prompt queries, each of which
    sees only the positions up to its own (written out row by row here)."""
    # a 2-token window: the last candidates lie after the first evidence rows, which must not see them
    cfg = SFIConfig(n_sink=2, n_recent=2, page=1, w_prefill=4, selector=SelectorConfig(use_cross_head=False))
    view = random_view()
    stale = SFIRecall(cfg, Budget(tokens=10)).masks(view)["stale"]
    prompt, dim = view.prompt_length, view.keys.shape[-1]
    evidence = torch.full((2, 2, 2 * 4, prompt), float("-inf"))
    for layer in range(2):
        for head in range(2):
            for g in range(2):
                for r in range(4):
                    position = prompt - 4 + r
                    q = view.prompt_queries[layer, head * 2 + g, 6 - 4 + r]
                    evidence[layer, head, g * 4 + r, :position + 1] = view.keys[layer, head, :position + 1] @ q * dim**-0.5
    hi = prompt - 2  # the prompt's recent_start: the window anchor
    picks = select(evidence[..., 2:hi], view.key_norms[..., 2:hi], 2, 10, cfg.selector)
    expected = torch.zeros(2, 2, prompt + 1, dtype=torch.bool).scatter_(-1, picks, True)
    expected[..., :2] = True
    expected[..., hi:] = True
    assert torch.equal(stale, expected)


def test_snapkv_memory_keeps_what_snapkv_keeps():
    """At the first decode step, with one token beyond SnapKV's own budget (the step's own), the memory holds
    exactly the prompt positions SnapKV's reference path keeps, plus its window and the new token."""
    loaded = load_model("tiny-llama")
    torch.manual_seed(0)
    prompt = torch.randint(0, loaded.config.vocab_size, (300,)).tolist()
    cache = KVCache(loaded.config, 1, 301, "cpu", torch.float32)
    prefilled = prefill(loaded.model, cache, [prompt])
    cfg = SnapKVConfig(window=16, budget=80, pooling="avg")  # max pooling ties neighbours: either may be kept
    method = create_method(registry.spec("snapkv", config=cfg), loaded.config, loaded.tokenizer)
    method.start(cache, prefilled)
    keys = cache.k[:, 0, :, :300]
    view = AttentionView(torch.zeros(2, 2, 2, 301), torch.ones(2, 2, 301), False, keys=torch.cat(
        [keys, torch.zeros(2, 2, 1, keys.shape[-1])], dim=2), prompt_queries=prefilled.queries[:, 0],
        prompt_length=300, budget=torch.full((2, 2, 1), 81))
    mask = cfg.recall_memory(None).masks(view)["snapkv"]
    for layer in range(2):
        for head in range(2):
            kept = set(method.kept[layer, 0, head].tolist())
            assert set(mask[layer, head].nonzero().flatten().tolist()) == kept | set(range(284, 301)), (layer, head)


def test_retrieval_memories_read_a_view_of_some_layers_as_the_whole_model():
    """Quest's dense layers and TidalDecode's selection layers are model layers, whichever rows a view holds."""
    model_config = dataclasses.replace(GEMMA, num_layers=12, layer_is_global=tuple((i + 1) % 3 == 0 for i in range(12)))
    view = random_view(layers=12, seed=3)
    view = dataclasses.replace(view, model_config=model_config, budget=torch.randint(10, 40, (12, 2, 1)))
    rows = model_config.global_layers  # 2, 5, 8, 11
    part = dataclasses.replace(view, logits=view.logits[rows], key_norms=view.key_norms[rows], queries=view.queries[rows],
                               keys=view.keys[rows], budget=view.budget[rows], layers=tuple(rows))
    for cfg, name in ((QuestConfig(page=4, dense_layers=3), "quest"), (TidalDecodeConfig(), "tidaldecode")):
        whole = cfg.recall_memory(None).masks(view)[name]
        assert torch.equal(cfg.recall_memory(None).masks(part)[name], whole[rows]), name
    # without the selection layer it reuses, a TidalDecode layer has nothing to compare
    later = dataclasses.replace(part, logits=part.logits[3:], key_norms=part.key_norms[3:], queries=part.queries[3:],
                                keys=part.keys[3:], budget=part.budget[3:], layers=(11,))
    assert TidalDecodeConfig().recall_memory(None).masks(later) is None


class Spy(RecallMemory):
    names = ("stale",)

    def __init__(self):
        self.seen = []

    def masks(self, view):
        self.seen.append(view.sentence_start)


def test_fixed_trigger_refreshes_every_interval_whatever_the_sentences():
    spy = Spy()
    memory = Retriggered(spy, 3)
    for step in range(7):
        memory.masks(dataclasses.replace(random_view(), sentence_start=step == 1))
    assert spy.seen == [False, False, True, False, False, True, False]


def test_moving_mass_by_distance_behind_the_current_token():
    """3000 positions: a tenth of the mass on a sink, the rest a quarter on the current token, a quarter 300
    back, 0.4 2000 back; the stale memory holds the sink and the first two."""
    pooled = torch.zeros(1, 1, 3000)
    pooled[..., 1], pooled[..., 2999], pooled[..., 2699], pooled[..., 999] = 0.1, 0.25, 0.25, 0.4
    stale = torch.zeros(1, 1, 3000, dtype=torch.bool)
    stale[..., [1, 2999, 2699]] = True
    moving = MovingMass(1, n_sink=4)
    moving.update_mass(pooled, stale)
    entering = torch.zeros(1, 1, 3000, dtype=torch.bool)
    entering[..., [2699, 999, 499, 3]] = True  # 300, 2000 and 2500 tokens back, and a sink
    moving.update_entering(entering, "within")
    summary = moving.summary()
    assert summary["bins"] == ["sinks", "0-256", "256-1K", "1K-4K", "4K-16K", ">= 16K"]
    assert summary["dense_mass"]["mean"] == pytest.approx([0.1, 0.25, 0.25, 0.4, 0, 0])
    assert summary["missed_by_stale"]["mean"] == pytest.approx([0, 0, 0, 0.4, 0, 0])
    assert summary["entering_within"]["mean"] == pytest.approx([0.25, 0, 0.25, 0.5, 0, 0])


def test_the_needle_is_found_as_tokens_of_the_prompt():
    tokenizer = load_model("tiny-llama").tokenizer
    prompt = tokenizer.encode("The magic number for lamp is: 4071923. Remember it.")
    positions = value_positions(tokenizer, prompt, "4071923")
    assert tokenizer.decode([prompt[p] for p in positions]) == "4071923"
    assert value_positions(tokenizer, prompt, "5550001") == []


def test_a_run_over_contexts_and_prompts_on_a_sliding_window_model(tmp_path):
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "stability", "--model", "tiny-gemma3", "--ctx", "1000", "--steps", "24", "--prompts", "prose,niah_single",
        "--fixed-refresh", "auto", "--no-nms", "--keep-neighbours", "7", "--n-recent", "32", "--page", "4", "--k-head", "64",
        "--device", "cpu", "--dtype", "float32", "--out", str(run_dir)])
    assert result.exit_code == 0, result.output
    document = json.loads((run_dir / "results.json").read_text())
    results = document["results"]
    assert results["layers"] == [1] and document["config"]["contexts"] == [1000]
    segments = results["segments"]
    assert [(s["context_asked"], s["prompt_source"], s["mode"]) for s in segments] == [
        (1000, "prose", "teacher-forced"), (1000, "niah_single", "generated")]
    prose = segments[0]
    assert prose["prefix_tokens"] == 976 and prose["context"]["last"] == 1000
    assert len(prose["consecutive"]["topk"]["within"]["overlap_per_layer"]) == 1  # the global layer only
    assert set(prose["recall"]) >= {"stale", "fresh", "streaming", "snapkv", "quest", "tidaldecode", "stale_variant"}
    assert "--no-nms --keep-neighbours 7" in prose["recall"]["stale_variant"]["label"]
    trigger = prose["trigger"]
    assert trigger["steps"] == 24 and trigger["fixed"]["refreshes"] == 24 // trigger["interval"]
    # paired over the same steps, the mean difference is the difference of the means
    assert trigger["difference"] == pytest.approx(trigger["sentence"]["recall"] - trigger["fixed"]["recall"])
    # the random model may end its answer at once (an end token): the report must hold such a segment too
    needles = [s["needle"] for s in segments if s.get("needle") and s["steps"]]
    assert needles and all(needle["positions"] for needle in needles)
    needle = needles[0]
    assert [entry["step"] for entry in needle["steps"]] == list(range(1, min(needle["answer_steps"], 24) + 1))
    assert set(needle["steps"][0]["held"]) >= {"stale", "quest"}  # the bootstrap selection is read from step 1
    report = (run_dir / "report.md").read_text()
    for heading in ("Which heads move", "Where attention and what moves sit", "The needle at the answer steps",
                    "Refreshing at sentence starts vs every N steps", "the global layers 1 of 3"):
        assert heading in report
    for plot in ("overlap_vs_offset", "within_vs_across", "recall_heatmap", "head_stability", "moving_mass",
                 "needle", "trigger"):
        assert (run_dir / f"{plot}.png").stat().st_size > 0
    assert "1000 prose forced" in result.output
