"""`sfibench throughput --prompt-len P --gen-len G` on the CPU: requests of tiny models write the tokens
`sfibench generate` writes, every timing field is there and adds up as runners/throughput_requests.py states,
the cache and its memory estimate hold P + G tokens, and bad values are refused before the model loads."""

from __future__ import annotations

import json

import pytest
import torch
from no_model import ModelLoaded, forbid_model_loading
from refusals import one_line_error
from typer.testing import CliRunner

from sfibench import registry
from sfibench.cli import app
from sfibench.engine.session import Session
from sfibench.reporting.readme_results import generate
from sfibench.workloads.replay import own_stream

TINY = ["--model", "tiny-llama", "--device", "cpu"]
PROMPT, GEN, BUDGET = 400, 24, 96  # a prompt the budget leaves sparse
SFI_REFRESH = ["--t-max", "6", "--min-gap", "2"]  # SFI refreshes several times within the G tokens

runner = CliRunner()


def _requests(tmp_path, name: str, *args: str, model: tuple[str, ...] = tuple(TINY),
              repeats: int = 1) -> dict:
    out = tmp_path / name
    result = runner.invoke(app, ["throughput", *model, "--prompt-len", str(PROMPT), "--repeats", str(repeats),
                                 "--budget", str(BUDGET), *SFI_REFRESH, "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def own_text_run(tmp_path_factory):
    """Every method's requests on the model's own greedy tokens (random weights, so --gen-text own)."""
    return _requests(tmp_path_factory.mktemp("requests"), "own", "--gen-len", str(GEN), "--gen-text", "own",
                     "--methods", ",".join(registry.names()))


def test_requests_write_the_tokens_generate_writes(own_text_run):
    rows = own_text_run["results"]["rows"]
    assert {r["method"] for r in rows} == set(registry.names())
    # SFI's refreshing steps are among those compared
    assert next(r for r in rows if r["method"] == "sfi")["slow_steps"] > 0
    ids = own_stream(Session.open("tiny-llama", "cpu").loaded.tokenizer)[:PROMPT].tolist()
    prompt = bytes(ids).decode("ascii")  # text that generate encodes back to these ids
    for row in rows:
        result = runner.invoke(app, ["generate", *TINY, "--method", row["method"], "--path", row["path"],
                                     "--prompt", prompt, "--max-new-tokens", str(GEN),
                                     "--budget", str(BUDGET), *SFI_REFRESH, "--json"])
        assert result.exit_code == 0, result.output
        generated = json.loads(result.stdout)
        assert generated["prompt_tokens"] == PROMPT
        written = generated["generated_ids"]  # cut after an end-of-sequence token, which requests write past
        assert len(row["first_sequence_ids"]) == GEN and written
        assert row["first_sequence_ids"][:len(written)] == written, row["method"]
        assert row["text"] == "the model's own greedy tokens" and row["passes_agree"]


def _check_timing(row: dict, repeats: int, gen: int = GEN) -> None:
    """One request's fields as the runner defines them (its module docstring): TTFT after the prefill, one
    step time per generated token after the first, end-to-end = TTFT + the steps + the bookkeeping after the
    last token (`unmarked_s`), output tok/s over end-to-end. Over one or two timed passes every median is a
    mean, so the sum holds for the medians too."""
    assert repeats <= 2
    steps = gen - 1
    assert 0 < row["prefill_seconds"] <= row["ttft_s"] < row["e2e_s"]
    assert len(row["step_ms"]) == steps and row["tpot_ms"]["n"] == repeats * steps
    tpot = row["tpot_ms"]
    assert 0 < tpot["p50"] <= tpot["p99"] <= tpot["max"]
    assert sum(kind["n"] for kind in row["ms_per_step"].values()) == repeats * steps
    # step_ms is kept to 1e-4 ms per step: at most 5e-8 s of rounding each
    assert row["e2e_s"] == pytest.approx(row["ttft_s"] + sum(row["step_ms"]) / 1e3 + row["unmarked_s"],
                                         abs=steps * 5e-8 + 1e-12)
    assert row["unmarked_s"] >= 0
    if repeats == 1:
        assert row["tokens_per_s"] == pytest.approx(row["batch"] * gen / row["e2e_s"])
    spread = row["e2e_spread"]
    assert row["batch"] * gen / spread["max"] == pytest.approx(row["tokens_per_s_spread"]["min"])
    slow = row["ms_per_step"].get("slow", {"n": 0})["n"]
    # every timed pass refreshed at the same steps: the text, and so the triggers, are the same
    assert repeats * len(row["slow_positions"]) == slow == repeats * row["slow_steps"]
    assert 0 <= row["slow_time_share"] <= 1 and (row["slow_time_share"] > 0) == (slow > 0)
    # a slow step refreshes at least one row
    assert row["slow_per_1k_tokens"] >= 1e3 * slow / (repeats * row["batch"] * gen) - 1e-9


def test_timing_fields_are_present_and_add_up(own_text_run):
    assert own_text_run["config"]["requests"] and own_text_run["config"]["gen_len"] == GEN
    for row in own_text_run["results"]["rows"]:
        _check_timing(row, repeats=1)


def test_cache_and_estimate_hold_prompt_and_generation(tmp_path):
    """A batch of two on the replayed stream: the cache, and the estimate it was checked against, are sized
    for P + G tokens; the report names the replayed stream as what drove the triggers."""
    document = _requests(tmp_path, "replay", "--gen-len", str(GEN), "--batch", "2",
                         "--methods", "full_kv,sfi")
    dims = Session.open("tiny-llama", "cpu").loaded.config
    for row in document["results"]["rows"]:
        _check_timing(row, repeats=1)
        estimate = row["memory_estimate"]
        assert row["batch"] == 2 and estimate["max_seq"] == PROMPT + GEN + 1
        assert estimate["kv_cache"] == 2 * dims.num_layers * 2 * dims.num_kv_heads * (PROMPT + GEN + 1) \
            * dims.head_dim * 4  # K and V, float32 on a CPU
        assert row["text"] == "a replayed real-text stream, teacher-forced"
    report = (tmp_path / "replay" / "report.md").read_text()
    assert "what drove SFI's triggers: a replayed real-text stream" in report
    assert (tmp_path / "replay" / "requests.png").stat().st_size > 0
    # README's generated block of the run: its conditions, and a row per method with the report's numbers
    block = generate("<!-- results:begin replay -->\n<!-- results:end -->\n", tmp_path, "reports")
    assert "SFI's triggers driven by a replayed real-text stream" in block
    for row in document["results"]["rows"]:
        assert f"| {row['method']} | reference | 400 | 24 | 2 | {row['ttft_s']:.3f} |" in block


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graphed_requests_replay_every_timed_step(tmp_path):
    """On a GPU the optimized path's requests run as CUDA graphs, one per length bucket (256 slots) and step
    kind, all captured in the warm-up request: no timed step captures one, and the timed passes write the
    same tokens. (SFI publishing when ready may meet a new plan in a timed pass; the report names it.)"""
    gen = 600  # the cache grows from 401 to 1,000 slots: reads sized to 512, 768 and 1,024
    document = _requests(tmp_path, "graphed", "--gen-len", str(gen), "--gen-text", "own",
                         "--paths", "optimized", "--methods", "full_kv,sfi",
                         model=("--model", "tiny-llama", "--device", "cuda"), repeats=2)
    for row in document["results"]["rows"]:
        assert row["graphs"]["used"] and row["graphs"]["captured"] >= 3
        if row.get("publish") != "when_ready":  # its refreshes land where its side stream finishes them
            assert row["graphs"]["timed_captures"] == 0 and row["passes_agree"], row
            _check_timing(row, repeats=2, gen=gen)


def test_memory_check_before_loading_sizes_the_cache_for_the_generation(tmp_path, monkeypatch):
    """With room for 64 sequences of P + 3 tokens but not of P + G, the fixed-context run of P tokens passes
    the memory check (and goes on to load the model), and the request run generating G tokens is refused by
    it, naming P + G + 1 slots."""
    from sfibench.models.shape import config_before_loading
    from sfibench.runners import throughput as throughput_runner
    from sfibench.runners.throughput_measure import method_specs
    from sfibench.runners.throughput_memory import shape_estimate
    from sfibench.runners.throughput_run import ThroughputRun

    prompt, gen, batch = 1024, 2048, 64
    dims = config_before_loading("tiny-llama")
    specs = method_specs(ThroughputRun(model="tiny-llama", contexts=(prompt,), batches=(batch,),
                                       methods=(("full_kv", "reference"),), steps=gen), prompt)

    def total(steps: int) -> int:  # float32 on a CPU, a real prefill
        return shape_estimate(dims, specs, batch, prompt + steps + 1, 4, False, False, steps)["total"]

    assert total(2) < total(gen)
    room = (total(2) + total(gen)) // 2
    monkeypatch.setattr(throughput_runner, "planned_before_loading", lambda device: room)
    monkeypatch.chdir(tmp_path)
    forbid_model_loading(monkeypatch)
    common = ["throughput", *TINY, "--batch", str(batch), "--methods", "full_kv"]
    fixed = CliRunner().invoke(app, [*common, "--ctx", str(prompt), "--steps", "2"])
    assert isinstance(fixed.exception, ModelLoaded), fixed.output
    requests = CliRunner().invoke(app, [*common, "--prompt-len", str(prompt), "--gen-len", str(gen)])
    one_line_error(requests, f"batch {batch} x {prompt + gen + 1:,} tokens needs")


BAD = {
    "no tokens generated": (["--prompt-len", "1k", "--gen-len", "0"], "--gen-len '0' is not a token count"),
    "only the prefill's token": (["--prompt-len", "1k", "--gen-len", "1"], "give at least 2"),
    "beyond the model": (["--prompt-len", "3k", "--gen-len", "2k"],
                         "--prompt-len 3,072 plus --gen-len 2,048 exceeds tiny-llama's limit of 4,096 "
                         "tokens; the longest --prompt-len that fits with this --gen-len is 2,048"),
    "generation alone beyond the model": (["--prompt-len", "1", "--gen-len", "4k"], "lower --gen-len"),
    "generation without a prompt": (["--gen-len", "1k"], "takes --prompt-len and --gen-len together"),
    "with a fixed context": (["--prompt-len", "1k", "--gen-len", "1k", "--ctx", "1k"],
                             "request mode takes --prompt-len and --gen-len instead"),
    "unknown text": (["--prompt-len", "1k", "--gen-len", "1k", "--gen-text", "essay"],
                     "--gen-text 'essay' is not one of: auto, own, replay"),
}


@pytest.mark.parametrize("args, message", BAD.values(), ids=BAD.keys())
def test_bad_request_values_are_refused_before_loading(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    forbid_model_loading(monkeypatch)
    result = CliRunner().invoke(app, ["throughput", *TINY, *args])
    assert not isinstance(result.exception, ModelLoaded), "the model loaded before the values were checked"
    one_line_error(result, message)
    assert not any(tmp_path.iterdir())
