"""Tensor-parallel decode on the CPU: gloo processes started here, one per rank, as torchrun would.

Each rank decodes with its share of the model (models/sharding.py); rank 0's logits and every rank's tokens
must equal a one-process decode of the same model, every method on the reference path.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from method_matrix import SMALL_CONFIGS
from tp_rank import decode_all
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.core.errors import UsageError
from sfibench.core.parallel import TensorParallel
from sfibench.engine.session import Session
from sfibench.metrics.memory import MARGIN, MemoryEstimateError, estimate_memory
from sfibench.models.loading import load_for_decode
from sfibench.models.presets import PRESETS
from sfibench.commands.options import check_memory_before_loading

RANK_SCRIPT = Path(__file__).resolve().parents[1] / "tp_rank.py"  # a shared module in tests/


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world: int, model: str, methods: list[str], out: Path, fail_rank: int = -1, timeout: float = 600):
    """Start `world` rank processes and wait for all; returns their (exit code, stderr)."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)}
        procs.append(subprocess.Popen([sys.executable, str(RANK_SCRIPT), model, ",".join(methods), str(out),
                                       str(fail_rank)], env=env, stderr=subprocess.PIPE, text=True))
    try:
        return [(p.wait(timeout=timeout), p.stderr.read()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def single_device(model: str, methods: list[str], world: int) -> dict:
    """The one-process decode `world` ranks must equal: SFI's cross-head stage as the ranks run it (over each
    rank's KV heads, skipped at 2 or fewer a rank; tp_rank.decode_all)."""
    session = Session.open(model, "cpu", "float32")
    ranks_skip_cross_head = session.loaded.config.num_kv_heads // world <= 2
    return decode_all(session, methods, cross_head=not ranks_skip_cross_head)


def assert_ranks_match_one_process(world: int, model: str, methods: list[str], tmp_path: Path):
    ranks = run_ranks(world, model, methods, tmp_path)
    assert all(code == 0 for code, _ in ranks), [err[-2000:] for _, err in ranks]
    expected = single_device(model, methods, world)
    per_rank = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(world)]
    for name in methods:
        tokens, logits, kinds = expected[name]
        for got_tokens, got_logits, got_kinds in (result[name] for result in per_rank):
            assert torch.equal(got_tokens, tokens), name
            assert got_kinds == kinds, name  # slow/fast decisions: the same on every rank and as on one
            torch.testing.assert_close(got_logits, logits, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("model", ["tiny-qwen3", "tiny-llama"])
def test_two_ranks_decode_every_method_as_one_process(model, tmp_path):
    assert_ranks_match_one_process(2, model, sorted(SMALL_CONFIGS), tmp_path)


@pytest.mark.parametrize("model", ["tiny-qwen3", "tiny-llama"])
def test_two_ranks_decode_every_method_on_the_optimized_path_as_one_process(model, tmp_path):
    # each rank runs the Triton kernels (TRITON_INTERPRET, set by conftest.py and inherited) on its KV heads
    assert_ranks_match_one_process(2, model, [f"{name}/optimized" for name in sorted(SMALL_CONFIGS)], tmp_path)


def test_smollm2_split_over_its_three_kv_heads_decodes_as_one_process(tmp_path):
    assert_ranks_match_one_process(3, "smollm2-135m", ["full_kv", "sfi"], tmp_path)


def test_a_failing_rank_ends_every_rank_with_an_error_and_nothing_is_written(tmp_path):
    start = time.monotonic()
    ranks = run_ranks(2, "tiny-qwen3", ["full_kv"], tmp_path, fail_rank=1, timeout=120)
    assert time.monotonic() - start < 120
    assert all(code != 0 for code, _ in ranks)
    assert "rank 1 fails on purpose" in ranks[1][1]
    assert "RankLostError: rank 0 of 2: the all-reduce of a layer's partial sums failed" in ranks[0][1]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("model, world, shape", [("tiny-qwen2", 2, "1 KV heads"), ("tiny-gemma3", 2, "Gemma-3"),
                                                 ("smollm2-135m", 2, "3 KV heads")])
def test_shapes_that_do_not_split_are_refused_before_any_weight_loads(model, world, shape, monkeypatch):
    import sfibench.models.loading as loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(UsageError, match=f"--tp {world}: .*{shape}"):
        load_for_decode(model, torch.device("cpu"), torch.float32, parallel=TensorParallel(0, world))


def sfibench_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sfibench", *args], capture_output=True, text=True, timeout=600)


def test_generate_with_tp_launches_the_ranks_and_prints_rank_0s_tokens_once():
    args = ["generate", "--model", "tiny-llama", "--device", "cpu", "--max-new-tokens", "8", "--json",
            "--prompt", "The keeper climbed the stairs. He lit the lamp!"]
    one, two = sfibench_command(*args), sfibench_command(*args, "--tp", "2")
    assert two.returncode == 0, two.stderr[-2000:]
    assert "torchrun --standalone --nproc-per-node=2 -m sfibench generate" in two.stderr
    assert len(two.stdout.strip().splitlines()) == 1  # rank 1 prints nothing
    assert json.loads(two.stdout)["generated_ids"] == json.loads(one.stdout)["generated_ids"]


def test_generate_with_tp_on_the_optimized_path_prints_the_tokens_of_one_process():
    # the ranks' Triton kernels run in Triton's interpreter (TRITON_INTERPRET, set by conftest.py, inherited)
    args = ["generate", "--model", "tiny-llama", "--device", "cpu", "--max-new-tokens", "8", "--json",
            "--path", "optimized", "--prompt", "The keeper climbed the stairs. He lit the lamp!"]
    one, two = sfibench_command(*args), sfibench_command(*args, "--tp", "2")
    assert two.returncode == 0, two.stderr[-2000:]
    assert json.loads(two.stdout)["generated_ids"] == json.loads(one.stdout)["generated_ids"]


def test_throughput_with_tp_writes_one_run_directory_that_records_the_ranks(tmp_path):
    out = tmp_path / "run"
    done = sfibench_command("throughput", "--model", "tiny-qwen3", "--device", "cpu", "--tp", "2", "--ctx", "128",
                            "--steps", "4", "--repeats", "1", "--methods", "full_kv,sfi", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("wrote ") == 1
    results = json.loads((out / "results.json").read_text())["results"]
    assert results["tp"] == 2
    assert results["interconnect"] == "gloo between CPU processes"
    assert {row["method"] for row in results["rows"]} == {"full_kv", "sfi"}
    assert "Tensor parallel: tp 2 (gloo between CPU processes)" in (out / "report.md").read_text()
    from sfibench.metrics.bytes_model import kv_read_bytes

    rank = PRESETS["tiny-qwen3"].rank_share(2)
    for row in results["rows"]:  # each floor: the rank's weights, its KV heads' bytes, 2 all-reduces a layer
        reduce = row["all_reduce"]
        assert reduce["per_step"] == 2 * rank.num_layers and reduce["bytes"] == rank.hidden_size * 4
        assert reduce["seconds"] > 0
        assert reduce["step_seconds"] == pytest.approx(reduce["seconds"] * reduce["per_step"])
        for kind, read in row["tokens_read_by_kind"].items():
            kv = kv_read_bytes(rank, read, 1, 4) / (results["copy_bandwidth_gb_s"] * 1e9)
            assert row["floor_ms"][kind] == pytest.approx((row["weights_floor"]["seconds"] + kv
                                                           + reduce["step_seconds"]) * 1e3)


@pytest.mark.parametrize("args, error", [
    (["throughput", "--graphs"], "--tp 2 runs without CUDA graphs"),
    (["quality", "--engine", "transformers"], "--tp 2 splits sfibench's own decoder"),
])
def test_what_tp_does_not_run_is_refused_in_one_line(args, error):
    result = CliRunner().invoke(app, [*args, "--model", "tiny-qwen3", "--device", "cpu", "--tp", "2"])
    assert result.exit_code == 2
    assert error in result.output


def test_quality_with_tp_writes_one_run_directory_with_the_scores_of_one_process(tmp_path):
    # --no-cross-head: SFI's cross-head stage runs over one rank's KV heads under TP, so it is left out of both
    args = ["quality", "--model", "tiny-llama", "--methods", "sfi,snapkv", "--tasks", "niah_single,ppl", "--ctx",
            "600", "--retention", "0.5", "--samples", "2", "--batch", "2", "--no-chat", "--no-cross-head",
            "--device", "cpu"]
    one = sfibench_command(*args, "--out", str(tmp_path / "one"))
    two = sfibench_command(*args, "--tp", "2", "--out", str(tmp_path / "two"))
    assert two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.count("report: ") == 1  # rank 1 prints nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]
    ran = [json.loads((tmp_path / name / "results.json").read_text()) for name in ("one", "two")]
    assert [r["config"]["tp"] for r in ran] == [1, 2]
    assert len(ran[1]["samples"]) == len(ran[0]["samples"]) == 12  # 2 tasks x 2 samples x 3 conditions
    for got, want in zip(ran[1]["samples"], ran[0]["samples"]):
        for exact in ("task", "index", "method", "steps_by_kind", "prediction", "score"):
            assert got.get(exact) == want.get(exact), (exact, want["task"], want["method"])
        for close in ("kl", "nll", "top1_agreement"):
            assert got.get(close) == pytest.approx(want.get(close), abs=1e-4), (close, want["method"])


def test_profile_with_tp_writes_one_run_directory_that_records_the_ranks(tmp_path):
    out = tmp_path / "run"
    done = sfibench_command("profile", "--model", "tiny-llama", "--device", "cpu", "--tp", "2", "--ctx", "600",
                            "--steps", "2", "--method", "sfi", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("wrote ") == 1
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
    results = json.loads((out / "results.json").read_text())["results"]
    assert results["tp"] == 2
    assert set(results["by_kind"]) == {"fast", "slow"}
    assert "Tensor parallel: tp 2: each rank" in (out / "report.md").read_text()


def test_env_with_tp_lists_each_ranks_device():
    result = CliRunner().invoke(app, ["env", "--device", "cpu", "--tp", "2"])
    assert result.exit_code == 0, result.output
    assert "--tp 2 rank 0" in result.output and "--tp 2 rank 1" in result.output
    assert "process 1 of 2 (gloo)" in result.output
    assert "--tp 1 rank" not in CliRunner().invoke(app, ["env", "--device", "cpu"]).output


@pytest.mark.parametrize("model", ["tiny-qwen3", "tiny-llama"])  # an untied LM head, and one tied to the embedding
def test_a_ranks_share_of_the_shape_counts_the_bytes_its_decoder_holds(model):
    loaded = load_for_decode(model, torch.device("cpu"), torch.float32, parallel=TensorParallel(0, 2))
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in loaded.model.parameters()}
    assert sum(storages.values()) == PRESETS[model].rank_share(2).num_params() * 4
    assert loaded.config == PRESETS[model].rank_share(2)


def gpu_of(monkeypatch, gib: float) -> None:
    """options.check_memory_before_loading sees a GPU with `gib` GiB free, of `gib` GiB."""
    import sfibench.core.device as device
    import sfibench.commands.options as options

    monkeypatch.setattr(options, "device_kind", lambda name: "cuda")
    monkeypatch.setattr(options, "check_device", lambda name: torch.device("cuda", 0))
    monkeypatch.setattr(device, "available_device_memory", lambda d: int(gib * 2**30))
    monkeypatch.setattr(device, "total_device_memory", lambda d: int(gib * 2**30))


def test_a_shape_that_fits_each_ranks_gpu_is_not_refused(monkeypatch):
    # qwen3-8b, 4 x 32K: 16.4 GB of weights and 19 GB of KV cache on one GPU; half the heads and the LM head's
    # vocabulary a rank
    gpu_of(monkeypatch, 24)
    with pytest.raises(MemoryEstimateError):
        check_memory_before_loading("qwen3-8b", [4], [32768], 64, "cuda", "bfloat16")
    check_memory_before_loading("qwen3-8b", [4], [32768], 64, "cuda", "bfloat16", tp=2)


def test_cpu_ranks_share_the_hosts_memory(monkeypatch):
    import sfibench.core.device_facts as facts

    one = estimate_memory(PRESETS["qwen3-8b"], 1, 4096 + 65, 4)["total"]
    ranks = 2 * estimate_memory(PRESETS["qwen3-8b"].rank_share(2), 1, 4096 + 65, 4)["total"]
    host = int((one + ranks) / 2 / MARGIN)  # one process fits; two ranks, each with the whole embedding, do not
    monkeypatch.setattr(facts, "host_available_bytes", lambda: host)
    monkeypatch.setattr(facts, "host_memory_bytes", lambda: host)
    check_memory_before_loading("qwen3-8b", [1], [4096], 64, "cpu", "float32")
    with pytest.raises(MemoryEstimateError):
        check_memory_before_loading("qwen3-8b", [1], [4096], 64, "cpu", "float32", tp=2)


@pytest.mark.parametrize("model", ["tiny-qwen3", "tiny-llama"])
def test_a_ranks_weight_bytes_per_step_are_its_share_with_the_lm_head_at_one_over_n(model):
    from sfibench.metrics.bytes_model import weight_bytes
    from sfibench.metrics.floor import decode_gemms, gemm_weight_bytes

    loaded = load_for_decode(model, torch.device("cpu"), torch.float32, parallel=TensorParallel(0, 2))
    norms = sum(p.numel() * 4 for name, p in loaded.model.named_parameters() if "norm" in name)
    assert weight_bytes(loaded.config, 4) == gemm_weight_bytes(decode_gemms(loaded.model)) + norms


def test_profile_with_tp_refuses_a_gpus_graphed_optimized_profile(monkeypatch):
    import sfibench.commands.profile as profile_command

    monkeypatch.setattr(profile_command, "check_shape_options", lambda model, device, dtype: ("tiny-qwen3", True))
    result = CliRunner().invoke(app, ["profile", "--path", "optimized", "--tp", "2"])
    assert result.exit_code == 2
    assert "--tp 2 runs without CUDA graphs, and on a GPU the optimized path is profiled CUDA-graphed" in result.output
