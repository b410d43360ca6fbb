"""Where a run writes: refused up front when it cannot take the run, never a user's file overwritten,
nothing left behind by a failed run, and internal failures still shown with their traceback."""

from __future__ import annotations

import errno
import json
import os

import pytest
from no_model import ModelLoaded, forbid_model_loading
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.engine.session import Session
from sfibench.reporting.results import write_results

QUALITY = ["quality", "--model", "tiny-llama", "--ctx", "600", "--samples", "1", "--tasks", "niah_single",
           "--methods", "sfi", "--retention", "0.5", "--no-chat", "--device", "cpu"]



@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    forbid_model_loading(monkeypatch)
    return tmp_path


def snapshot(directory) -> dict:
    """Every file under `directory` with its bytes: what must survive a refused command unchanged."""
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None for p in directory.rglob("*")}


def refused(args: list[str], workdir, message: str) -> None:
    before = snapshot(workdir)
    result = CliRunner().invoke(app, args)
    assert not isinstance(result.exception, ModelLoaded), f"{args}: the model loaded before --out was checked"
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert snapshot(workdir) == before


def earlier_run(directory, command="quality", config=None):
    directory.mkdir()
    write_results(directory, command, config or {}, {"cells": []})
    (directory / "report.md").write_text("the earlier report\n")


def test_out_that_is_a_file(workdir):
    (workdir / "notes.txt").write_text("mine\n")
    refused([*QUALITY, "--out", "notes.txt"], workdir, "--out notes.txt is a file, not a directory")
    refused([*QUALITY, "--out", "notes.txt/run"], workdir, "notes.txt is a file, so no folder can be made inside it")


def test_folder_of_someone_elses_files_is_never_written_into(workdir):
    (workdir / "mine").mkdir()
    (workdir / "mine" / "report.md").write_text("my own report\n")
    (workdir / "mine" / "plot.png").write_bytes(b"\x89PNG")
    for extra in ([], ["--overwrite"]):
        refused([*QUALITY, "--out", "mine", *extra], workdir, "is not empty and holds no sfibench run")


def test_earlier_run_is_kept_unless_overwrite_is_asked(workdir):
    earlier_run(workdir / "run")
    refused([*QUALITY, "--out", "run"], workdir, "pass --overwrite to replace it, --resume to continue it")


def test_overwrite_replaces_only_a_run_of_the_same_command(workdir):
    earlier_run(workdir / "run", command="stability")
    refused([*QUALITY, "--out", "run", "--overwrite"], workdir, "holds a `stability` run, not a `quality` run")


def test_corrupt_results_are_refused_before_the_model_loads(workdir):
    (workdir / "run").mkdir()
    (workdir / "run" / "results.json").write_text('{"schema_version": 1, "comm')
    refused([*QUALITY, "--out", "run", "--resume"], workdir, "is not valid JSON")


def test_resume_with_other_settings_is_refused_before_the_model_loads(workdir):
    earlier_run(workdir / "run", config={"methods": ["full_kv", "sfi"], "tasks": ["niah_single"],
                                         "retentions": [0.2], "samples": [1], "seed": 0, "chat": False,
                                         "sfi_variant": None, "contexts": [600]})
    refused([*QUALITY, "--out", "run", "--resume"], workdir, "was run with different retentions")


@pytest.fixture
def read_only(monkeypatch):
    """Make a directory act as a read-only mount: creating anything in it fails with EROFS.

    Patched at the os level (what mkdir, tempfile and open all go through), because the tests may run
    as root, for whom file permissions do not stop writes.
    """
    real_open, real_mkdir = os.open, os.mkdir

    def make(directory):
        root = str(directory.resolve())

        def inside(path) -> bool:
            return os.path.abspath(os.fspath(path)).startswith(root)

        def refuse(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))

        monkeypatch.setattr(os, "open", lambda path, flags, *args, **kwargs: refuse(path)
                            if flags & os.O_CREAT and inside(path) else real_open(path, flags, *args, **kwargs))
        monkeypatch.setattr(os, "mkdir", lambda path, *args, **kwargs: refuse(path)
                            if inside(path) else real_mkdir(path, *args, **kwargs))

    return make


def test_read_only_out(workdir, read_only):
    (workdir / "ro").mkdir()
    read_only(workdir / "ro")
    refused([*QUALITY, "--out", "ro/run"], workdir, "cannot write in ro (Read-only file system)")
    refused([*QUALITY, "--out", "ro"], workdir, "cannot write in ro (Read-only file system)")


@pytest.mark.parametrize("command", [QUALITY, ["stability"], ["throughput"], ["profile"]])
def test_default_runs_in_a_read_only_working_directory(workdir, read_only, command):
    read_only(workdir)
    refused(command, workdir, "the default run directory runs/ in")


def test_a_run_that_fails_leaves_no_directory_and_keeps_its_traceback(workdir, monkeypatch):
    def broken(cls, *args, **kwargs):
        raise ValueError("an internal shape check failed")  # a bug, not the user's input

    monkeypatch.setattr(Session, "open", classmethod(broken))
    for out in ([], ["--out", "fresh/run"]):
        result = CliRunner().invoke(app, [*QUALITY, *out])
        assert result.exit_code == 1 and isinstance(result.exception, ValueError)  # not a one-line "user error"
        assert list(workdir.iterdir()) == []  # neither runs/<time>/, runs/, fresh/run nor fresh


def test_a_user_error_found_after_loading_leaves_no_directory(workdir, monkeypatch):
    from sfibench.engine.prefill import PromptError

    def too_long(cls, *args, **kwargs):
        raise PromptError("prompt 0 has 9000 tokens; shorten the prompt")

    monkeypatch.setattr(Session, "open", classmethod(too_long))
    result = CliRunner().invoke(app, ["stability", "--model", "tiny-llama"])
    assert result.exit_code == 2 and "shorten the prompt" in result.output
    assert list(workdir.iterdir()) == []


def test_overwrite_of_an_earlier_run_of_the_same_command_works(tmp_path):
    earlier_run(tmp_path / "run")
    result = CliRunner().invoke(app, [*QUALITY, "--out", str(tmp_path / "run"), "--overwrite"])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["results"]["complete"] and saved["config"]["path"] == "reference"
    assert (tmp_path / "run" / "report.md").read_text() != "the earlier report\n"
