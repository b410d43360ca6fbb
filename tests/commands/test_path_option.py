"""`--path` on quality, stability and profile reaches the MethodSpec each run builds (whether the
optimized path itself runs on this machine is tested with the optimized path, not here)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.engine.method import MethodSpec
from sfibench.runners import profile, quality_batch, stability
from sfibench.runners.quality_batch import conditions


class SpecSeen(Exception):
    """Stops the run where the MethodSpec is handed on, carrying it out to the test."""


def stop_with_spec(spec, *args, **kwargs):
    raise SpecSeen(spec)


def spec_reached(args: list[str], out) -> object:
    result = CliRunner().invoke(app, [*args, "--path", "optimized", "--device", "cpu", "--out", str(out)])
    assert isinstance(result.exception, SpecSeen), result.output
    assert not out.exists()  # the stopped run took its directory with it
    return result.exception.args[0]


def test_quality_builds_every_condition_on_the_path():
    plan = conditions(["sfi", "streaming_llm", "snapkv"], [0.2, 0.5], 2048, path="optimized")
    assert len(plan) == 7 and {c.spec.path for c in plan} == {"optimized"}


def test_quality_decodes_with_the_path(tmp_path, monkeypatch):
    monkeypatch.setattr(quality_batch.registry, "create_method", stop_with_spec)
    spec = spec_reached(["quality", "--model", "tiny-llama", "--ctx", "600", "--samples", "1", "--tasks", "ppl",
                         "--retention", "0.5"], tmp_path / "run")
    assert (spec.name, spec.path) == ("full_kv", "optimized")


def test_stability_probe_stands_for_the_paths_full_kv(tmp_path, monkeypatch):
    # the probe runs eagerly in torch; the path names whose device requirement the run is held to
    monkeypatch.setattr(stability.registry, "check_method", lambda name, path: stop_with_spec(MethodSpec(name, path)))
    spec = spec_reached(["stability", "--model", "tiny-llama", "--steps", "4", "--prefix", "300"], tmp_path / "run")
    assert (spec.name, spec.path) == ("full_kv", "optimized")


def test_profile_profiles_the_path(tmp_path, monkeypatch):
    monkeypatch.setattr(profile, "profile_steps", lambda session, spec, *args: stop_with_spec(spec))
    spec = spec_reached(["profile", "--model", "tiny-llama", "--ctx", "600", "--method", "sfi"], tmp_path / "run")
    assert (spec.name, spec.path) == ("sfi", "optimized")


@pytest.mark.parametrize("command", ["quality", "stability", "profile"])
def test_path_is_checked_before_the_model_loads(command):
    result = CliRunner().invoke(app, [command, "--path", "fast"])
    assert result.exit_code == 2 and "no 'fast' path" in result.output
