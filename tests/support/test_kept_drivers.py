"""A quality run keeps each condition's step driver from batch to batch: the records must not change."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from sfibench import registry
from sfibench.core.oom import DeviceOutOfMemoryError
from sfibench.engine.session import Session
from sfibench.engine.turns import Stream
from sfibench.runners import quality_batch
from sfibench.runners.quality_batch import BatchTimes, KeptDrivers, evaluate_batch, make_condition
from sfibench.workloads.base import PromptFormat
from sfibench.workloads.needle_list import needle_list
from sfibench.workloads.tasks import make_samples

CONTEXT = 800


@pytest.fixture(scope="module")
def tiny():
    return Session.open("tiny-llama", "cpu")


def _conditions(path: str, t_max: int, methods: list[str]):
    """Full-KV, then each of `methods` at retention 0.3; SFI's refresh after at most `t_max` tokens (a
    random tiny model writes no sentence ends)."""
    conds = [make_condition("full_kv", None, CONTEXT, path)] + [
        make_condition(name, 0.3, CONTEXT, path) for name in methods if name != "full_kv"]
    for cond in conds:
        if cond.method == "sfi":
            config = cond.spec.config
            trigger = dataclasses.replace(config.trigger, t_max=t_max, min_gap=min(config.trigger.min_gap, t_max))
            cond.spec = dataclasses.replace(cond.spec, config=dataclasses.replace(config, trigger=trigger))
    return conds


# The optimized path runs its Triton kernels in the interpreter here: shorter answers, a refresh every 2 tokens,
# and the methods that carry state across steps (SnapKV's and StreamingLLM's is made whole at each start).
@pytest.mark.parametrize("path,answer,t_max,methods", [("reference", 40, 16, registry.names()),
                                                      ("optimized", 6, 2, ["sfi", "quest", "tidaldecode"])])
def test_a_kept_driver_restarts_as_a_fresh_one_would(tiny, path, answer, t_max, methods):
    """The second batch through drivers kept from the first gives the records a fresh start gives: no
    method carries state (a selection, a trigger's count, a slow step's schedule) from one batch to the next.
    SFI's refresh fires in the first batch."""
    fmt = PromptFormat(tiny.loaded.tokenizer, chat=False)
    samples = [needle_list(fmt, CONTEXT, random.Random(index), index, 3, "niah_list") for index in range(4)]
    for sample in samples:
        sample.max_answer_tokens = answer
    first, second = samples[:2], samples[2:]
    conds = _conditions(path, t_max, methods)
    kept = KeptDrivers(tiny, graphs=False)
    warmed = evaluate_batch(tiny, first, conds, drivers=kept)
    assert all(r["slow_steps"] >= 2 for r in warmed if r["method"] == "sfi")
    drivers = {c.label: kept.driver(c) for c in conds}
    after = evaluate_batch(tiny, second, conds, drivers=kept)
    assert all(kept.driver(c) is drivers[c.label] for c in conds)  # the same drivers ran the second batch
    fresh = evaluate_batch(tiny, second, conds)
    assert after == fresh


def test_drivers_are_dropped_when_the_cache_is_replaced(tiny):
    fmt = PromptFormat(tiny.loaded.tokenizer, chat=False)
    samples = make_samples("niah_single", fmt, CONTEXT, 3, seed=1)
    cond = make_condition("sfi", 0.3, CONTEXT)
    kept = KeptDrivers(tiny, graphs=False)
    evaluate_batch(tiny, samples[:2], [make_condition("full_kv", None, CONTEXT), cond], drivers=kept)
    two = kept.driver(cond)
    assert two.cache is tiny.cache and tiny.cache.max_seq % 256 == 0  # rounded up to the graphs' bucket
    evaluate_batch(tiny, samples[2:], [make_condition("full_kv", None, CONTEXT), cond], drivers=kept)
    one = kept.driver(cond)
    assert one is not two and one.cache is tiny.cache and tiny.cache.batch == 1
    assert len(kept.kept) == 2


def test_a_batch_accounts_for_its_decode_passes_and_steps(tiny):
    """The run log's per-batch breakdown counts every decode pass (Full-KV's, each condition's teacher-forced
    one and the free ones that ran) and every decode step of them."""
    fmt = PromptFormat(tiny.loaded.tokenizer, chat=False)
    samples = make_samples("niah_single", fmt, CONTEXT, 2, seed=4)
    conds = _conditions("reference", 16, ["sfi", "snapkv", "streaming_llm"])
    passes, calls, times = [], [0], BatchTimes()

    def on_step(step):
        calls[0] += 1

    evaluate_batch(tiny, samples, conds, on_decode=passes.append, on_step=on_step, times=times)
    assert times.passes == len(passes) >= len(conds)
    assert times.steps == calls[0] - times.passes > 0  # on_step also sees the prefill's logits of each pass
    assert f"{times.passes} decode passes of {times.steps} steps" in times.describe()
    assert times.capture_s == 0 and "graph capture" not in times.describe()  # eager: no graph was captured


def test_running_out_of_memory_keeps_one_driver_at_a_time(tiny, monkeypatch):
    """Where every condition's held state does not fit, the decode that ran out is tried again with nothing
    else held, and from then on one condition's driver is kept at a time: the records are the same."""
    fmt = PromptFormat(tiny.loaded.tokenizer, chat=False)
    samples = make_samples("niah_single", fmt, CONTEXT, 2, seed=4)
    conds = _conditions("reference", 16, registry.names())
    expected = evaluate_batch(tiny, samples, conds)
    real, failures = quality_batch.drive_scripts, []

    def drive_in_little_memory(driver, *args, **kwargs):
        if len(kept.kept) > 2:  # "room" for two drivers' state
            failures.append(driver.method.name)
            raise DeviceOutOfMemoryError("out of device memory during decode: (simulated)")
        return real(driver, *args, **kwargs)

    monkeypatch.setattr(quality_batch, "drive_scripts", drive_in_little_memory)
    kept = KeptDrivers(tiny, graphs=False)
    assert evaluate_batch(tiny, samples, conds, drivers=kept) == expected
    assert len(failures) == 1 and not kept.keep_all and len(kept.kept) == 1

    def drive_in_no_memory(driver, *args, **kwargs):
        raise DeviceOutOfMemoryError("out of device memory during decode: (simulated)")

    monkeypatch.setattr(quality_batch, "drive_scripts", drive_in_no_memory)
    with pytest.raises(DeviceOutOfMemoryError):  # one condition alone does not fit: the error stands
        evaluate_batch(tiny, samples, conds, drivers=KeptDrivers(tiny, graphs=False))


def test_a_free_run_is_needed_only_where_the_taught_argmax_leaves_the_teacher():
    """A method's free run is skipped when its teacher-forced argmax equals Full-KV's token at every answer
    position (the free run would then be Full-KV's own); kept logits are the model's dtype, as on the GPU."""
    full = Stream(tokens=[5, 7, 2], is_answer=[True, True, True])
    rows = torch.eye(10, dtype=torch.bfloat16)
    taught = Stream(answer_logits=[rows[5], rows[7], rows[2]])
    assert not quality_batch._diverges(taught, full)
    taught.answer_logits[1] = rows[3]
    assert quality_batch._diverges(taught, full)
    assert not quality_batch._diverges(Stream(), full)
