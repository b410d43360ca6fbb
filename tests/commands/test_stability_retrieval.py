"""`sfibench stability`'s recall comparison for the per-step retrieval methods: Quest's and TidalDecode's
memories against a brute-force reading of their rules on a small random step, and both in a whole run."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from typer.testing import CliRunner

from sfibench.baselines.quest import QuestConfig
from sfibench.baselines.tidaldecode import TidalDecodeConfig
from sfibench.cli import app
from sfibench.engine.method import AttentionView
from sfibench.models.presets import PRESETS

LAYERS, KV_HEADS, GROUP, LENGTH, DIM = 4, 2, 3, 53, 8


def random_view(layers: int = LAYERS, seed: int = 0) -> AttentionView:
    """A step with random queries and keys (the logits are their scaled q.k) and a random budget per
    (layer, KV head), as the budget reference's memory would set it."""
    generator = torch.Generator().manual_seed(seed)
    queries = torch.randn(layers, KV_HEADS * GROUP, DIM, generator=generator)
    keys = torch.randn(layers, KV_HEADS, LENGTH, DIM, generator=generator)
    logits = torch.einsum("lhgd,lhnd->lhgn", queries.view(layers, KV_HEADS, GROUP, DIM), keys) * DIM**-0.5
    budget = torch.randint(6, 40, (layers, KV_HEADS, 1), generator=generator)
    return AttentionView(logits, keys.norm(dim=-1), False, budget=budget, queries=queries, keys=keys)


def quest_by_hand(view: AttentionView, cfg: QuestConfig) -> torch.Tensor:
    """Quest's rule one (layer, KV head) at a time, with its bound written out channel by channel."""
    page, current = cfg.page, (LENGTH - 1) // cfg.page
    mask = torch.zeros(view.keys.shape[:3], dtype=torch.bool)
    for layer in range(view.keys.shape[0]):
        for head in range(KV_HEADS):
            if layer < cfg.dense_layers:
                mask[layer, head] = True
                continue
            group = view.queries[layer, head * GROUP:(head + 1) * GROUP]
            bounds = []
            for p in range(current):
                keys = view.keys[layer, head, p * page:(p + 1) * page]
                high, low = keys.max(dim=0).values, keys.min(dim=0).values
                bounds.append(sum(max(float(q[i] * high[i]), float(q[i] * low[i]))
                                  for q in group for i in range(DIM)))
            count = max(int(view.budget[layer, head]) // page - 1, 0)
            for p in sorted(range(current), key=lambda p: -bounds[p])[:count]:
                mask[layer, head, p * page:(p + 1) * page] = True
            mask[layer, head, current * page:] = True
    return mask


def test_quest_memory_reads_the_pages_with_the_highest_bounds():
    cfg = QuestConfig(page=4, dense_layers=1)
    view = random_view()
    mask = cfg.recall_memory(None).masks(view)["quest"]
    assert torch.equal(mask, quest_by_hand(view, cfg))
    assert mask[0].all()  # a dense layer
    expected_reads = (view.budget[1:, :, 0] // 4 - 1).clamp(max=(LENGTH - 1) // 4) * 4 + (LENGTH - 1) % 4 + 1
    assert torch.equal(mask[1:].sum(dim=-1), expected_reads)


def test_quest_memory_kept_from_step_to_step_equals_one_made_afresh():
    """The memory keeps the bounds of full pages between the steps of one sequence, as Quest keeps them."""
    cfg, view = QuestConfig(page=4, dense_layers=1), random_view(seed=2)
    kept = cfg.recall_memory(None)
    for length in range(30, LENGTH + 1):  # across page boundaries: a page fills, a new one opens
        step = dataclasses.replace(view, logits=view.logits[..., :length], keys=view.keys[:, :, :length])
        assert torch.equal(kept.masks(step)["quest"], cfg.recall_memory(None).masks(step)["quest"]), length


def test_quest_memory_needs_the_queries_keys_and_budget():
    view = random_view()
    memory = QuestConfig(page=4).recall_memory(None)
    for missing in ("queries", "keys", "budget"):
        assert memory.masks(dataclasses.replace(view, **{missing: None})) is None


def test_tidaldecode_memory_reuses_its_selection_layers_top_k():
    layers = 10
    model_config = dataclasses.replace(PRESETS["tiny-llama"], num_layers=layers)
    cfg = TidalDecodeConfig()
    assert cfg.selection_layers(model_config) == [2, 4]  # round(13/32 x 10) = 4
    view = dataclasses.replace(random_view(layers, seed=1), model_config=model_config)
    mask = cfg.recall_memory(None).masks(view)["tidaldecode"]
    assert mask[[0, 1, 2, 4]].all()  # the dense layers and the selection layers read everything
    for layer in [3, *range(5, layers)]:  # every other layer reads its last selection layer's top-k
        selection = 2 if layer < 4 else 4
        summed_qk = torch.einsum("hgd,hnd->hn", view.queries[selection].view(KV_HEADS, GROUP, DIM),
                                 view.keys[selection])
        for head in range(KV_HEADS):
            k = int(view.budget[layer, head]) - 1
            expected = torch.zeros(LENGTH, dtype=torch.bool)
            expected[summed_qk[head, :LENGTH - 1].topk(k).indices] = True
            expected[LENGTH - 1] = True  # the current token
            assert torch.equal(mask[layer, head], expected), (layer, head)
    assert torch.equal(mask[5:].sum(dim=-1), view.budget[5:, :, 0])


def test_tidaldecode_memory_is_dense_on_a_model_too_shallow_to_select():
    view = dataclasses.replace(random_view(3), model_config=PRESETS["tiny-qwen3"])  # 3 layers: none selects
    assert TidalDecodeConfig().recall_memory(None).masks(view)["tidaldecode"].all()
    assert TidalDecodeConfig().recall_memory(None).masks(dataclasses.replace(view, model_config=None)) is None


@pytest.mark.parametrize("model", ["tiny-qwen3"])  # 3 layers: Quest sparsifies layer 2
def test_stability_run_compares_quest_and_tidaldecode(tmp_path, model):
    text = "The lamp was lit at dusk. Ships passed the rock!  Was anyone awake? " * 8
    (tmp_path / "text.txt").write_text(text)
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "stability", "--model", model, "--text-file", str(tmp_path / "text.txt"), "--steps", "40",
        "--prefix", "200", "--n-sink", "2", "--n-recent", "32", "--page", "4", "--k-head", "24", "--device", "cpu",
        "--dtype", "float32", "--out", str(run_dir)])
    assert result.exit_code == 0, result.output
    recall = json.loads((run_dir / "results.json").read_text())["results"]["segments"][0]["recall"]
    stale_reads = recall["stale"]["tokens_read_mean"]
    for name in ("quest", "tidaldecode"):
        entry = recall[name]
        shares = [entry["mean"], entry["candidate_recall"], *(v for row in entry["per_layer_head"] for v in row)]
        assert all(0.0 <= value <= 1.0 + 1e-6 for value in shares)  # a sum of softmax weights: rounding only
        assert entry["tokens_read_mean"] <= 233  # at most every cached token
    # Quest's sparse layer reads at most the reference's tokens there; its two dense layers read everything
    assert recall["quest"]["tokens_read_mean"] > stale_reads
    report = (run_dir / "report.md").read_text()
    for entry in recall.values():
        assert entry["label"] in report and f"recall: {entry['label']}" in result.output
