"""Refresh coverage: its slow steps are the trigger code's, its refreshed selections are the ones SFI's own
slow step makes on the same state, and its coverage arithmetic has the right ends (tiny-llama, CPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

# a diagnostic script, not the package
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import refresh_coverage  # noqa: E402
from refresh_coverage import ROWS, VARIANTS, shadow_run  # noqa: E402
from selection_coverage import masses, published_picks  # noqa: E402

from sfibench.engine.prefill import restore  # noqa: E402
from sfibench.engine.session import Session  # noqa: E402
from sfibench.engine.turns import Script, run_scripts  # noqa: E402
from sfibench.registry import create_method  # noqa: E402
from sfibench.runners.quality_batch import make_condition  # noqa: E402
from sfibench.sfi import geometry  # noqa: E402
from sfibench.sfi.config import TriggerConfig  # noqa: E402
from sfibench.sfi.triggers import SlowStepScheduler, token_byte_table, token_classes  # noqa: E402
from sfibench.workloads.base import PromptFormat  # noqa: E402
from sfibench.workloads.tasks import make_samples  # noqa: E402

CONTEXT, RETENTION, CAP = 700, 0.5, 110  # sparse at 700 tokens; the answer passes t_max = 96


@pytest.fixture(scope="module")
def state():
    session = Session.open("tiny-llama", device="cpu", dtype="float32", seed=0)
    tokenizer = session.loaded.tokenizer
    sample = make_samples("niah_single", PromptFormat(tokenizer, False), CONTEXT, 1, 0)[0]
    prefilled = session.prefill([sample.prompt], CAP)
    shadow = shadow_run(session, prefilled, sample, frozenset(), RETENTION, CONTEXT, CAP)
    return session, sample, prefilled, shadow


def test_slow_steps_are_the_trigger_codes(state):
    session, _, _, shadow = state
    vocab, backend = session.loaded.config.vocab_size, session.loaded.tokenizer.backend
    table = token_byte_table(backend, vocab)
    scheduler = SlowStepScheduler(TriggerConfig(), *token_classes(backend, vocab, table), 1, table)
    answer, slow = shadow["answer"], []
    scheduler.observe(torch.tensor(answer[:1]))
    for step in range(1, len(answer)):
        if scheduler.next_is_slow(step)[0]:
            scheduler.record_refresh(step, torch.tensor([True]))
            slow.append(step)
        scheduler.observe(torch.tensor(answer[step:step + 1]))
    assert slow and [r["step"] for r in shadow["refreshes"]] == slow


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_refreshed_selection_is_what_sfis_own_slow_step_selects(state, variant):
    """Plain reference SFI, dense only up to the first slow step (so its state there is the dense answer's),
    then as it runs: the selection it publishes after that step is the one the diagnostic measures."""
    session, sample, prefilled, shadow = state
    name, settings = VARIANTS[variant]
    first = shadow["refreshes"][0]["step"]
    spec = make_condition("sfi", RETENTION, CONTEXT, variant={**settings, "bridge_steps": first - 1}).spec
    method = create_method(spec, session.loaded.config, session.loaded.tokenizer)
    seen, after_step = {}, method.after_step

    def record(ctx, plan):
        after_step(ctx, plan)
        if ctx.step == first:
            seen.update(published_picks(method))
            seen["slow"] = bool(ctx.slow[0])

    method.after_step = record
    restore(session.cache, prefilled)
    stream = run_scripts(session.loaded.model, session.cache, method, prefilled,
                         [Script(first + 1, [], frozenset())])
    assert stream[0].answers[0] == shadow["answer"][:first + 1]
    assert seen.pop("slow")
    expected = shadow["refreshes"][0]["picks"][name]
    assert seen.keys() == expected.keys()
    for layer in seen:
        assert torch.equal(seen[layer], expected[layer]), (name, layer)
    start = shadow["bootstrap"][name]
    assert any(not torch.equal(start[layer], expected[layer]) for layer in start)  # the refresh changed it


def test_coverage_of_all_candidates_is_one_and_of_none_zero(state):
    session, _, _, shadow = state
    refresh = shadow["refreshes"][0]
    lo, hi = geometry.candidate_range(refresh["length"], shadow["config"])
    weights = {layer: steps[refresh["step"]:] for layer, steps in shadow["weights"].items()}
    heads = session.loaded.config.num_kv_heads
    every = {layer: torch.arange(lo, hi).expand(heads, -1) for layer in weights}
    none = {layer: torch.empty(heads, 0, dtype=torch.long) for layer in weights}
    selected, candidates, _ = masses(weights, every, lo, hi)
    assert candidates > 0 and selected / candidates == pytest.approx(1.0)
    assert masses(weights, none, lo, hi)[0] == 0


def test_end_to_end_on_tiny_llama(tmp_path):
    out = tmp_path / "refresh"
    # niah_list's shortest prompt is 1,591 byte tokens; tiny-llama answers it past t_max without an EOS
    refresh_coverage.main(["--model", "tiny-llama", "--tasks", "niah_list", "--ctx", "2000", "--retention",
                           "0.5", "--samples", "1", "--no-chat", "--max-answer-tokens", "120",
                           "--out", str(out)])
    document = json.loads((out / "results.json").read_text())
    segments = document["prompts"][0]["segments"]
    assert len(segments) == 1 + len(document["prompts"][0]["slow_steps"]) >= 2
    for segment in segments:
        assert set(segment["coverage"]) == set(ROWS)
        assert all(0 <= v <= 1 for v in segment["coverage"].values())
    first = segments[0]["coverage"]  # before the first slow step the bootstrap serves
    assert first["refreshed, SPEC"] == first["bootstrap, SPEC"]
    assert document["provenance"] and document["command"].startswith("python benchmarks/refresh_coverage.py")
    report = (out / "report.md").read_text()
    assert (out / "coverage_by_sentence.png").exists()
    assert "SnapKV" in report and "refreshed - bootstrap" in report
    (out / "report.md").unlink()
    refresh_coverage.main(["--rerender", "--out", str(out)])  # the tables again, from results.json alone
    assert (out / "report.md").read_text() == report


@pytest.mark.parametrize("args", [["--retention", "2"], ["--ctx", "lots"], ["--tasks", "no_such_task"]])
def test_a_bad_argument_is_one_error_line(tmp_path, capsys, args):
    with pytest.raises(SystemExit) as raised:
        refresh_coverage.main([*args, "--out", str(tmp_path / "never")])
    assert raised.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in errors[0]
    assert not (tmp_path / "never").exists()
