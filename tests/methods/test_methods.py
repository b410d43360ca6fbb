"""Every registered method on the same engine: the parametrized matrix, budgets and accounting."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from method_matrix import METHOD_PATHS, SMALL_CONFIGS, SPARSE_PATHS, small_spec

from sfibench import registry
from sfibench.baselines.snapkv import SnapKVConfig
from sfibench.baselines.streaming_llm import StreamingLLMConfig
from sfibench.core.budget import BudgetError
from sfibench.engine.cache import KVCache
from sfibench.engine.decode import generate
from sfibench.engine.method import MethodSpec
from sfibench.engine.prefill import prefill
from sfibench.engine.sampling import Sampler, SamplingConfig
from sfibench.reference import sparse_memory
from sfibench.registry import UnknownMethodError, check_method, create_method
from sfibench.sfi.config import SFIConfig

SPARSE_NAMES = sorted({name for name, _ in SPARSE_PATHS})


def run(loaded, prompts, spec, n=24):
    cache = KVCache(loaded.config, len(prompts), max(map(len, prompts)) + n, "cpu", torch.float32)
    pre = prefill(loaded.model, cache, prompts, chunk=32)
    method = create_method(spec, loaded.config, loaded.tokenizer)
    return generate(loaded.model, cache, method, pre, n, Sampler(SamplingConfig(), "cpu")), method


def prompts_for(loaded, batch):
    text = ("The keeper climbed the stairs. He lit the lamp! Was the sea calm? It was not. "
            "Ships passed in the night and the light turned slowly above them. ") * 2
    ids = loaded.tokenizer.encode(text)
    return [ids[: len(ids) - 17 * row] for row in range(batch)]


def test_registry_has_every_method_and_errors_list_valid_ones():
    assert {name for name, _ in METHOD_PATHS} >= {"full_kv", "sfi", "streaming_llm", "snapkv"}
    with pytest.raises(UnknownMethodError, match="valid methods: .*full_kv"):
        check_method("h2o", "reference")
    with pytest.raises(UnknownMethodError, match="no 'fancy' path"):
        check_method("sfi", "fancy")


def test_the_test_matrix_has_one_row_of_the_right_type_per_registered_method():
    assert set(SMALL_CONFIGS) == set(registry.names())
    for method in registry.METHODS:
        assert type(SMALL_CONFIGS[method.name]) is method.config, method.name
        assert isinstance(method.config(), method.config)  # SPEC's defaults need no arguments


# Contexts are whole multiples of 16, SFI's default page: its recent window is page-aligned and so holds
# n_recent to n_recent + page - 1 tokens right after a refresh (SPEC 2); at a page-aligned context it holds
# exactly n_recent, which is what the budget counts.
@pytest.mark.parametrize("name", registry.names())
@pytest.mark.parametrize("settings", ["defaults", "small"])
@pytest.mark.parametrize("budget", [40, 100, 300, 2308, 5000])
def test_each_budget_rule_reads_at_most_its_budget_above_it(name, settings, budget):
    base = registry.default_config(name) if settings == "defaults" else SMALL_CONFIGS[name]
    try:
        config = base.with_budget(budget)
    except BudgetError as error:  # a budget the method cannot fit is refused, never silently stretched
        assert str(budget) in str(error) and "raise it" in str(error)
        return
    assert type(config) is type(base)
    for context in (-(-(budget + 1) // 16) * 16, 2 * budget // 16 * 16 + 16, 32768):
        read = config.tokens_read(context)
        if registry.get(name).dense:
            assert read == context
        else:
            assert 1 <= read <= budget, (name, budget, context, read)


@pytest.mark.parametrize("name", SPARSE_NAMES)
def test_a_budget_too_small_for_a_sparse_method_is_a_budget_error(name):
    with pytest.raises(BudgetError, match="raise it"):
        registry.default_config(name).with_budget(1)
    config = registry.at_budget(name, "reference", 2308).config
    # Off a page edge a method reading whole pages misses its budget by less than two pages: Quest's partial
    # current page reads fewer tokens, SFI's page-aligned window holds up to page - 1 more (SPEC 2).
    page = getattr(config, "page", 1)
    assert 2308 - 2 * page < config.tokens_read(4096 + 5) < 2308 + page
    assert config.tokens_read(4096) <= 2308


@pytest.mark.parametrize("model_name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
@pytest.mark.parametrize("name,path", METHOD_PATHS)
@pytest.mark.parametrize("batch", [1, 3])
def test_matrix_every_method_runs_and_batched_rows_match_single(tiny_models, model_name, name, path, batch):
    loaded = tiny_models[model_name]
    prompts = prompts_for(loaded, batch)
    trace, _ = run(loaded, prompts, small_spec(name, path))
    assert trace.tokens.shape == (batch, 24)
    for record in trace.steps:
        lengths = record.kv_lengths[None, :, None]
        assert ((record.tokens_read >= 1) & (record.tokens_read <= lengths)).all()
    if not registry.get(name).dense:  # a small budget must actually save reads at this context
        assert trace.steps[-1].tokens_read.float().mean() < trace.steps[-1].kv_lengths.float().mean()
    if batch == 3:
        alone, _ = run(loaded, prompts[2:], small_spec(name, path))
        assert trace.tokens[2].tolist() == alone.tokens[0].tolist()


@pytest.mark.parametrize("name", SPARSE_NAMES)
def test_sparse_methods_read_exactly_the_tokens_they_report(tiny_models, monkeypatch, name):
    loaded = tiny_models["tiny-qwen3"]
    counted = []  # per attention call: distinct positions read, [B, H_kv]
    original = sparse_memory.gather_attention

    def spy(q, k, v, positions, valid):
        for b in range(positions.shape[0]):
            for h in range(positions.shape[1]):
                read = positions[b, h][valid[b, h]]
                assert read.unique().numel() == read.numel(), "a position was read twice"
                assert int(read.max()) < k.shape[2]
        counted.append(valid.sum(dim=-1))
        return original(q, k, v, positions, valid)

    monkeypatch.setattr(sparse_memory, "gather_attention", spy)
    # SFI takes only fast steps (no dense slow step), so every read goes through the spy
    trigger = dataclasses.replace(SMALL_CONFIGS["sfi"].trigger, policy="bootstrap")
    bootstrap = {"trigger": trigger} if name == "sfi" else {}
    spec = small_spec(name, "reference", **bootstrap)
    trace, _ = run(loaded, prompts_for(loaded, 2), spec, n=12)
    # every layer read either densely (a method's dense or selection layers: the whole history) or
    # through the spy, in order
    sparse = [layer for record in trace.steps for layer in record.tokens_read
              if not torch.equal(layer, record.kv_lengths[:, None].expand_as(layer))]
    assert sparse and torch.equal(torch.stack(counted), torch.stack(sparse))
    reported = torch.stack([layer for record in trace.steps for layer in record.tokens_read])
    assert reported.float().mean() < trace.steps[-1].kv_lengths.float().mean()


def test_sfi_slow_steps_read_densely_and_are_reported_so(tiny_models):
    loaded = tiny_models["tiny-qwen3"]
    trace, method = run(loaded, prompts_for(loaded, 1), small_spec("sfi", "reference"), n=40)
    kinds = [record.kinds[0] for record in trace.steps]
    assert "slow" in kinds and "fast" in kinds
    for record in trace.steps:
        dense = record.tokens_read[:, 0] == record.kv_lengths[0]
        assert bool(dense.all()) == (record.kinds[0] == "slow")
    assert method.summary()["mean_slow_interval"] is not None


def test_sfi_layer_groups_alternate_refreshed_layers(tiny_models):
    loaded = tiny_models["tiny-qwen3"]  # 3 layers
    spec = small_spec("sfi", "reference", layer_groups=2)
    trace, _ = run(loaded, prompts_for(loaded, 1), spec, n=40)
    slow = [record for record in trace.steps if record.kinds[0] == "slow"]
    assert len(slow) >= 2
    for index, record in enumerate(slow):
        dense_layers = [layer for layer in range(3)
                        if bool((record.tokens_read[layer, 0] == record.kv_lengths[0]).all())]
        assert dense_layers == ([0, 2] if index % 2 == 0 else [1])


def test_bad_method_settings_are_refused(tiny_models):
    loaded = tiny_models["tiny-llama"]
    with pytest.raises(ValueError, match="layer_groups"):
        create_method(MethodSpec("sfi", "reference", SFIConfig(layer_groups=3)), loaded.config, loaded.tokenizer)
    with pytest.raises(ValueError, match="must exceed its observation window"):
        create_method(MethodSpec("snapkv", "reference", SnapKVConfig(budget=32, window=64)), loaded.config,
                      loaded.tokenizer)
    with pytest.raises(ValueError, match="pooling"):
        create_method(MethodSpec("snapkv", "reference", SnapKVConfig(pooling="median")), loaded.config,
                      loaded.tokenizer)
    with pytest.raises(ValueError, match="sink"):
        create_method(MethodSpec("streaming_llm", "reference", StreamingLLMConfig(budget=4)), loaded.config,
                      loaded.tokenizer)


def test_sfi_copies_its_step_masks_only_when_they_change_and_the_device_always_holds_them(tiny_models, monkeypatch):
    from sfibench.sfi import method as sfi_method

    loaded = tiny_models["tiny-qwen3"]
    spec = small_spec("sfi", "reference", layer_groups=2)  # successive slow steps refresh different layers: the masks change between them
    sfi = create_method(spec, loaded.config, loaded.tokenizer)
    copies, checked = [], []
    original_pinned, original_plan = sfi_method.pinned, sfi.plan

    def counting_pinned(tensor):
        copies.append(tensor.clone())
        return original_pinned(tensor)

    def checking_plan(ctx):
        plan = original_plan(ctx)
        assert torch.equal(sfi.refresh_rows.cpu(), sfi.refresh_host)
        assert torch.equal(sfi.dense_rows.cpu(), sfi.dense_host)
        checked.append(bool(sfi.refresh_host.any()))
        return plan

    monkeypatch.setattr(sfi_method, "pinned", counting_pinned)
    monkeypatch.setattr(sfi, "plan", checking_plan)
    prompts = prompts_for(loaded, 3)
    for _ in range(2):  # a second batch on the same method: start() zeroes the buffers and forgets what was sent
        cache = KVCache(loaded.config, 3, max(map(len, prompts)) + 40, "cpu", torch.float32)
        generate(loaded.model, cache, sfi, prefill(loaded.model, cache, prompts, chunk=32), 40,
                 Sampler(SamplingConfig(), "cpu"))
    steps = len(checked)
    assert steps == 2 * 39 and sum(checked) >= 4  # slow steps happened, so the masks did change
    assert 4 <= len(copies) < steps  # two masks a step would be 2 * steps copies


def test_optimized_sfi_fills_its_compact_segments_to_the_kernel_tile(tiny_models):
    """The optimized SFI's refreshes end each compact segment on a tile edge of the two-segment kernel's loop
    over it (SelectionState._rebuild_compact), or move the whole window when it is shorter than that."""
    from sfibench.optimized.decode_attention import default_config

    loaded = tiny_models["tiny-qwen3"]
    _, sfi = run(loaded, prompts_for(loaded, 2), small_spec("sfi", "optimized"), n=20)
    tile = default_config(loaded.config.head_dim, torch.float32).block_n
    sel = sfi.sel
    assert sel.align == tile > 1 and sel.compact_k.shape[4] % tile == 0
    live = sel.published.clamp(min=0)  # every row has refreshed by now
    assert bool((sel.published >= 0).all())
    layers, rows = torch.meshgrid(torch.arange(live.shape[0]), torch.arange(live.shape[1]), indexing="ij")
    counts = sel.compact_counts[live, layers, rows]  # [L, B, H_kv]
    tail_start = sel.tail_start[live, layers, rows]
    anchor = sel.anchor[live, layers, rows]
    whole_tiles = counts % tile == 0
    whole_window = (tail_start >= anchor)[..., None] & (counts > 4 + sel.counts[live, layers, rows])
    assert bool((whole_tiles | whole_window).all())
    assert bool((tail_start > anchor).any())  # window rows did move into the compact segment


@pytest.mark.parametrize("window,budget", [(8, 36), (40, 140)])
def test_optimized_snapkv_moves_the_tails_first_rows_into_its_compact_segment(tiny_models, window, budget):
    """Optimized SnapKV, as SFI's refresh: the kept rows are followed in the compact buffer by the tail's
    first rows up to the kernel's tile edge (the whole observation window where it is shorter), and the
    tail in place starts after them. The compact rows are the cache's rows at those positions."""
    from sfibench.optimized.decode_attention import tile_rows

    loaded = tiny_models["tiny-qwen3"]
    spec = small_spec("snapkv", "optimized", budget=budget, window=window)
    prompts = prompts_for(loaded, 2)
    cache = KVCache(loaded.config, 2, max(map(len, prompts)) + 4, "cpu", torch.float32)
    snapkv = create_method(spec, loaded.config, loaded.tokenizer)
    snapkv.start(cache, prefill(loaded.model, cache, prompts, chunk=32, evidence_rows=64))
    keep = budget - window
    moved = min(-keep % tile_rows(loaded.config.head_dim, 4), window)
    assert 0 < moved and (moved < window) == (budget == 140)  # 100 kept rows + 28 = 128
    assert torch.equal(snapkv.counts[0], torch.full_like(snapkv.counts[0], keep + moved))
    assert torch.equal(snapkv.tail[0], (snapkv.tail_start + moved).int())
    for row in range(2):
        first = int(snapkv.tail_start[row])
        for layer in range(loaded.config.num_layers):
            for head in range(loaded.config.num_kv_heads):
                positions = torch.cat([snapkv.kept[layer, row, head], torch.arange(first, first + moved)])
                for compact, rows in ((snapkv.compact_k, cache.k), (snapkv.compact_v, cache.v)):
                    assert torch.equal(compact[0, layer, row, head], rows[layer, row, head, positions])


def test_snapkv_votes_one_kv_head_at_a_time_are_the_whole_layers_votes():
    """SnapKV's votes, taken one KV head at a time, equal the definition on the whole layer at once: every query
    head's window attends (causally, in float32) over the keys widened to the query heads, the attention mass
    is averaged over the window rows and then over the GQA group, and pooled."""
    from sfibench.baselines.snapkv import window_votes

    torch.manual_seed(0)
    kv_heads, group, length, dim, cfg = 2, 3, 45, 8, SnapKVConfig(window=6, kernel=3, budget=20)
    queries = torch.randn(kv_heads * group, cfg.window, dim)
    keys = torch.randn(kv_heads, length, dim)
    prefix = length - cfg.window
    logits = torch.einsum("hwd,hnd->hwn", queries, keys.repeat_interleave(group, dim=0)) * dim ** -0.5
    causal = torch.arange(length)[None, :] <= torch.arange(prefix, length)[:, None]
    mass = logits.masked_fill(~causal, float("-inf")).softmax(dim=-1)[..., :prefix].mean(dim=1)
    pooled = torch.nn.functional.max_pool1d(mass.view(kv_heads, group, prefix).mean(dim=1)[:, None], 3, stride=1,
                                            padding=1)[:, 0]
    torch.testing.assert_close(window_votes(queries, keys, cfg), pooled)
