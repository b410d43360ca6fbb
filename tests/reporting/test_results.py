"""results.json round trips, provenance, run-directory safety, and device resolution."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pytest
import torch

from sfibench.core import provenance as provenance_module
from sfibench.core.device import DeviceUnavailableError, device_info, resolve_device
from sfibench.reporting import results as results_module
from sfibench.reporting import run_dir as run_dir_module
from sfibench.reporting.results import (
    SCHEMA_VERSION,
    InvalidResultsError,
    UnsupportedSchemaError,
    provenance,
    read_results,
    write_results,
)
from sfibench.reporting.run_dir import RunDirExistsError, make_run_dir

PROVENANCE_KEYS = {
    "git_commit",
    "git_dirty",
    "git_commit_source",
    "python",
    "torch",
    "triton",
    "transformers",
    "sfibench",
    "device",
    "cuda",
    "gpu_driver",
    "cpu",
    "cpu_count",
    "torch_threads",
    "hostname",
    "timestamp_utc",
}


@dataclass
class _Inner:
    budget: int = 2308
    ratio: float = float("nan")


@dataclass
class _Config:
    model: str = "smollm2-135m"
    context: int = 4096
    inner: _Inner = field(default_factory=_Inner)


@pytest.fixture
def fixed_provenance(monkeypatch):
    # Provenance shells out to git and probes NVML; tests that only care about the file format skip that.
    monkeypatch.setattr(results_module, "provenance", lambda: {"timestamp_utc": "2026-01-01T00:00:00+00:00"})


# --------------------------------------------------------------------------------------------------
# Round trip


def test_round_trip_converts_tensors_numpy_nan_and_dataclasses(tmp_path, fixed_provenance):
    results = {
        "tensor": torch.tensor([[1.0, 2.0], [3.0, float("nan")]]),
        "bf16_scalar": torch.tensor(0.5, dtype=torch.bfloat16),
        "int_tensor": torch.arange(3),
        "array": np.array([1.5, np.inf, -np.inf]),
        "np_int": np.int64(7),
        "np_float": np.float32(0.25),
        "np_bool": np.bool_(True),
        "nan": float("nan"),
        "tuple": (1, 2),
        "int_keys": {1: "a", np.int32(2): "b"},
        "dtype": torch.float16,
    }
    path = write_results(tmp_path, "bench", _Config(), results, extra={"raw": {"step_ms": [1.0, 2.0]}})

    assert path == tmp_path / "results.json"
    # Strict JSON: a parser that rejects NaN/Infinity must accept the file.
    json.loads(path.read_text(), parse_constant=lambda name: pytest.fail(f"non-strict constant {name}"))

    loaded = read_results(tmp_path)
    assert loaded["schema_version"] == SCHEMA_VERSION
    assert loaded["command"] == "bench"
    assert loaded["config"] == {
        "model": "smollm2-135m",
        "context": 4096,
        "inner": {"budget": 2308, "ratio": None},
    }
    got = loaded["results"]
    assert got["tensor"] == [[1.0, 2.0], [3.0, None]]
    assert got["bf16_scalar"] == 0.5
    assert got["int_tensor"] == [0, 1, 2]
    assert got["array"] == [1.5, None, None]
    assert got["np_int"] == 7 and isinstance(got["np_int"], int)
    assert got["np_float"] == 0.25
    assert got["np_bool"] is True
    assert got["nan"] is None
    assert got["tuple"] == [1, 2]
    assert got["int_keys"] == {"1": "a", "2": "b"}
    assert got["dtype"] == "torch.float16"
    assert loaded["raw"] == {"step_ms": [1.0, 2.0]}
    assert loaded["provenance"] == {"timestamp_utc": "2026-01-01T00:00:00+00:00"}


def test_records_are_one_line_each_and_read_back_equal(tmp_path, fixed_provenance):
    """A quality run's samples (records holding per-step arrays) take a line each, not a line per number."""
    samples = [{"task": "niah_list", "kl_steps": [0.5, 0.25, 1e-05], "steps_by_kind": {"fast": 3}},
               {"task": "niah_list", "kl_steps": [], "steps_by_kind": {}}]
    results = {"cells": [{"method": "sfi", "accuracy": 0.5}], "nested": {"a": {"b": {"c": [1, [2, 3]]}}}}
    path = write_results(tmp_path, "quality", {"tasks": ["niah_list"]}, results, {"samples": samples})
    text = path.read_text()
    assert json.loads(text)["samples"] == samples and json.loads(text)["results"] == results
    lines = text.splitlines()
    assert json.dumps(samples[0]) in [line.strip().rstrip(",") for line in lines]
    assert not any(line.strip() in ("0.5,", "0.25,") for line in lines)
    assert len(lines) < 40


def test_read_results_accepts_the_file_path(tmp_path, fixed_provenance):
    path = write_results(tmp_path, "bench", {}, {"x": 1})
    assert read_results(path)["results"] == {"x": 1}


def test_extra_cannot_replace_reserved_sections(tmp_path, fixed_provenance):
    with pytest.raises(ValueError, match="reserved"):
        write_results(tmp_path, "bench", {}, {}, extra={"results": {}})
    assert not (tmp_path / "results.json").exists()


def test_unconvertible_value_names_its_location_and_keeps_the_old_file(tmp_path, fixed_provenance):
    path = write_results(tmp_path, "bench", {}, {"ok": 1})
    before = path.read_bytes()
    with pytest.raises(TypeError, match=r"\$\.results\.bad"):
        write_results(tmp_path, "bench", {}, {"bad": object()})
    assert path.read_bytes() == before
    # No temp files are left behind by the failed attempt.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_failed_replace_keeps_the_old_file(tmp_path, fixed_provenance, monkeypatch):
    path = write_results(tmp_path, "bench", {}, {"ok": 1})
    before = path.read_bytes()

    def crash(*_args):
        raise OSError("simulated crash during rename")

    monkeypatch.setattr(results_module.os, "replace", crash)
    with pytest.raises(OSError, match="simulated"):
        write_results(tmp_path, "bench", {}, {"ok": 2})
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_write_results_records_real_provenance(tmp_path):
    loaded = read_results(write_results(tmp_path, "bench", {}, {}))
    assert set(loaded["provenance"]) == PROVENANCE_KEYS


# --------------------------------------------------------------------------------------------------
# Provenance


def test_provenance_has_every_key_and_a_utc_timestamp():
    info = provenance()
    assert set(info) == PROVENANCE_KEYS
    stamp = datetime.fromisoformat(info["timestamp_utc"])
    assert stamp.utcoffset() is not None and stamp.utcoffset().total_seconds() == 0
    assert info["torch"] is not None
    assert info["python"].count(".") == 2
    assert info["device"] == (torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    assert isinstance(info["cpu_count"], int)
    assert info["git_dirty"] in (True, False, None)
    if info["git_commit"] is not None:
        assert len(info["git_commit"]) == 40
    json.dumps(info)  # provenance must already be JSON-ready


def test_provenance_tolerates_missing_git(monkeypatch):
    def no_git(*_args, **_kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(provenance_module.subprocess, "run", no_git)
    info = provenance()
    assert info["git_commit"] is None and info["git_dirty"] is None


@pytest.mark.parametrize("status,dirty", [("", False), ("?? DEVICE_COMMIT\n?? out/", False),
                                          (" M sfibench/cli.py\n?? DEVICE_COMMIT", True)])
def test_a_recorded_device_commit_wins_over_a_stale_checkout(tmp_path, status, dirty):
    # A copy of the tree on another machine may carry an old .git: the commit recorded before the copy wins.
    recorded = tmp_path / "DEVICE_COMMIT"
    recorded.write_text("a" * 40 + "\n" + status)
    assert provenance_module._recorded_commit(recorded) == ("a" * 40, dirty)


def test_a_missing_or_malformed_device_commit_is_ignored(tmp_path):
    assert provenance_module._recorded_commit(tmp_path / "DEVICE_COMMIT") == (None, None)
    (tmp_path / "DEVICE_COMMIT").write_text("not a commit\n")
    assert provenance_module._recorded_commit(tmp_path / "DEVICE_COMMIT") == (None, None)


# --------------------------------------------------------------------------------------------------
# Run directories


def test_make_run_dir_refuses_to_overwrite_an_existing_run(tmp_path, fixed_provenance):
    run_dir = make_run_dir(tmp_path / "run", "bench")
    path = write_results(run_dir, "bench", {}, {"tok_s": 123.0})
    before = path.read_bytes()

    with pytest.raises(RunDirExistsError) as caught:
        make_run_dir(run_dir, "bench")
    message = str(caught.value)
    assert str(run_dir) in message
    assert "--overwrite" in message and "--out" in message
    assert path.read_bytes() == before


def test_make_run_dir_allows_overwrite_when_asked(tmp_path, fixed_provenance):
    run_dir = make_run_dir(tmp_path / "run", "bench")
    write_results(run_dir, "bench", {}, {"tok_s": 1.0})
    assert make_run_dir(run_dir, "bench", overwrite=True) == run_dir
    write_results(run_dir, "bench", {}, {"tok_s": 2.0})
    assert read_results(run_dir)["results"] == {"tok_s": 2.0}


def test_make_run_dir_reuses_a_directory_without_results(tmp_path):
    # A directory left by a crashed run (no results.json) holds nothing worth protecting.
    (tmp_path / "run").mkdir()
    assert make_run_dir(tmp_path / "run", "bench") == tmp_path / "run"


def test_make_run_dir_rejects_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="--out"):
        make_run_dir(tmp_path / "file", "bench")


def test_default_run_dir_is_timestamped_and_suffixed_on_collision(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    class _FrozenClock(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 3, 4, 5, 6, 7, tzinfo=tz)

    monkeypatch.setattr(run_dir_module, "datetime", _FrozenClock)
    first = make_run_dir(None, "bench")
    second = make_run_dir(None, "bench")
    third = make_run_dir(None, "bench")
    assert first == tmp_path.joinpath("runs", "bench-20260304T050607Z").relative_to(tmp_path)
    assert second.name == "bench-20260304T050607Z-2"
    assert third.name == "bench-20260304T050607Z-3"
    assert all(d.is_dir() for d in (first, second, third))


# --------------------------------------------------------------------------------------------------
# read_results errors


def test_read_results_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="results.json"):
        read_results(tmp_path)
    with pytest.raises(FileNotFoundError, match="no results file"):
        read_results(tmp_path / "nope" / "results.json")


def test_read_results_invalid_json(tmp_path):
    (tmp_path / "results.json").write_text('{"schema_version": 1, "results": {')
    with pytest.raises(InvalidResultsError, match="not valid JSON"):
        read_results(tmp_path)


def test_read_results_not_a_results_file(tmp_path):
    (tmp_path / "results.json").write_text("[1, 2, 3]")
    with pytest.raises(InvalidResultsError, match="schema_version"):
        read_results(tmp_path)


def test_read_results_future_schema(tmp_path):
    future = SCHEMA_VERSION + 1
    (tmp_path / "results.json").write_text(json.dumps({"schema_version": future, "results": {}}))
    with pytest.raises(UnsupportedSchemaError) as caught:
        read_results(tmp_path)
    message = str(caught.value)
    assert f"version {future}" in message
    assert str(SCHEMA_VERSION) in message
    assert "upgrade sfibench" in message


def test_non_finite_values_never_reach_the_file(tmp_path, fixed_provenance):
    write_results(tmp_path, "bench", {}, {"values": [math.inf, -math.inf, math.nan, 1.0]})
    text = (tmp_path / "results.json").read_text()
    assert "NaN" not in text and "Infinity" not in text


# --------------------------------------------------------------------------------------------------
# Devices


def test_resolve_device_cpu_and_auto():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    expected_auto = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected_auto


def test_resolve_device_cuda_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here, so requesting it is not an error")
    for name in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(DeviceUnavailableError) as caught:
            resolve_device(name)
        message = str(caught.value)
        assert "no CUDA device is visible" in message
        assert "--device cpu" in message


def test_resolve_device_cuda_error_when_cuda_is_hidden(monkeypatch):
    # Runs on GPU machines too: pretend CUDA is absent to check the message path everywhere.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceUnavailableError, match="--device cpu"):
        resolve_device("cuda")
    assert resolve_device("auto") == torch.device("cpu")


def test_resolve_device_rejects_unknown_names():
    for name in ("gpu", "cuda:x", "cuda:-1", ""):
        with pytest.raises(ValueError, match="'auto', 'cpu', 'cuda' or 'cuda:N'"):
            resolve_device(name)


def test_device_info_cpu():
    info = device_info("cpu")
    assert info["type"] == "cpu" and info["name"] == "cpu"
    assert info["cpu_count"] >= 1
    assert "cpu_model" in info
    json.dumps(info)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_info_cuda():
    info = device_info(resolve_device("cuda"))
    assert info["name"] == torch.cuda.get_device_name()
    assert info["total_memory_bytes"] > 0 and info["sm_count"] > 0
    assert info["compute_capability"].count(".") == 1
    json.dumps(info)
