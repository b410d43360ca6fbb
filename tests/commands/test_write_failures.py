"""A write the disk refuses (full, over the file-size limit) and a standard output closed early end in one line
naming what was kept and the command that continues; nothing kept is damaged, and a finished run is never lost
to a closed `| head`. Output files get the permissions the umask gives any file the user creates.

Real tiny throughput runs: a file-size limit (RLIMIT_FSIZE, which makes a write fail with EFBIG) in a child
process, a full disk (ENOSPC) raised by the atomic writer in-process, and a pipe whose reader is gone.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from refusals import one_line_error
from typer.testing import CliRunner

from sfibench.cli import app

RUN = ["throughput", "--model", "tiny-llama", "--device", "cpu", "--ctx", "300", "--steps", "4", "--repeats", "1",
       "--methods", "full_kv,sfi", "--k-head", "64"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}

LIMITED = """
import resource, runpy, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.argv = ["sfibench", *sys.argv[2:]]
runpy.run_module("sfibench", run_name="__main__")
"""


def fingerprint(folder: Path) -> dict[str, tuple[str, int]]:
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.iterdir()) if p.is_file()}


def run_limited(limit: int, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LIMITED, str(limit), *RUN, "--out", str(out), *extra],
                          check=False, cwd=out.parent, env=ENV, capture_output=True, text=True, timeout=300)


def test_a_file_size_limit_hit_by_the_plots_keeps_the_whole_results_and_says_how_to_draw_them(tmp_path):
    out = tmp_path / "run"
    done = run_limited(20_000, out)  # results.json (~8 KB) fits, the plots (30-60 KB) do not
    message = " ".join(done.stderr.split())
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert message.count("error:") == 1 and "(File too large)" in message, message
    assert f"{out}/results.json is saved whole, but its report was not drawn" in message
    assert f"sfibench report {out}" in message and "ulimit -f" in message
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]  # no half-written plot, no staging folder
    saved = fingerprint(out)

    result = CliRunner().invoke(app, ["report", str(out)])
    assert result.exit_code == 0, result.output
    assert {"report.md", "throughput.png", "latency.png"} <= {p.name for p in out.iterdir()}
    assert fingerprint(out)["results.json"] == saved["results.json"]


def test_a_file_size_limit_hit_by_results_json_leaves_the_earlier_run_untouched(tmp_path):
    out = tmp_path / "run"
    first = CliRunner().invoke(app, [*RUN, "--out", str(out)])
    assert first.exit_code == 0, first.output
    before = fingerprint(out)
    done = run_limited(2_000, out, "--overwrite")  # not even results.json fits
    message = " ".join(done.stderr.split())
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"cannot write {out}/results.json (File too large); nothing was saved" in message, message
    assert fingerprint(out) == before  # the earlier run, whole, and no temporary file beside it


def test_a_full_disk_while_saving_is_one_line_and_leaves_no_folder(tmp_path, monkeypatch):
    from sfibench.reporting import results

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(results.os, "fsync", full)  # the atomic writer's last step before the rename
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*RUN, "--out", str(out)])
    text = one_line_error(result, f"cannot write {out}/results.json (No space left on device); nothing was saved",
                          "free some space")
    assert "--out DIR on another disk" in text
    assert not out.exists()


def test_a_folder_that_stops_taking_files_mid_run_is_one_line(tmp_path, monkeypatch):
    """Permission refused when results.json is created (a folder made read-only while the run measured; root
    ignores modes, so the refusal is raised where the file is created): one line, nothing left behind."""
    import tempfile

    from sfibench.reporting import results

    real_mkstemp = tempfile.mkstemp

    def refused_for_results(*args, **kwargs):
        if kwargs.get("prefix", "").startswith(".results.json."):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return real_mkstemp(*args, **kwargs)

    monkeypatch.setattr(results.tempfile, "mkstemp", refused_for_results)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*RUN, "--out", str(out)])
    one_line_error(result, f"cannot write {out}/results.json (Permission denied); nothing was saved",
                   "make the folder writable")
    assert not out.exists()


def test_a_full_disk_while_drawing_keeps_the_report_it_had(tmp_path, monkeypatch):
    """`sfibench report` on a whole run, the disk full as report.md is written: the plots drawn before are
    not put in place, so the run's files are all as they were."""
    out = tmp_path / "run"
    assert CliRunner().invoke(app, [*RUN, "--out", str(out)]).exit_code == 0
    before = fingerprint(out)
    from sfibench.reporting import results

    real_fsync = results.os.fsync

    def full_for_the_report(fd):
        if os.readlink(f"/proc/self/fd/{fd}").split("/")[-1].startswith(".report.md."):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(results.os, "fsync", full_for_the_report)
    result = CliRunner().invoke(app, ["report", str(out)])
    one_line_error(result, f"cannot write {out}/report.md (No space left on device)",
                   f"the run finished and is saved whole in {out}")
    assert fingerprint(out) == before


def test_a_closed_standard_output_keeps_the_finished_run_and_says_so(tmp_path):
    out = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-m", "sfibench", *RUN, "--out", str(out)], cwd=tmp_path, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # the reader is gone before the first line: `| head -0`
    stderr = process.stderr.read()
    process.wait(timeout=300)
    message = " ".join(stderr.split())
    assert process.returncode == 1 and "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert "standard output was closed" in message, message
    assert f"the run finished and is saved whole in {out}" in message
    assert {"results.json", "report.md", "throughput.png", "latency.png"} <= {p.name for p in out.iterdir()}


def test_a_closed_standard_output_of_a_command_that_saves_nothing_is_one_line(tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "sfibench", "models"], cwd=tmp_path, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()
    stderr = process.stderr.read()
    process.wait(timeout=300)
    assert process.returncode == 1 and "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert " ".join(stderr.split()) == ("standard output was closed before sfibench finished printing; the rest of "
                                        "its output was dropped (it saves no run)")


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_output_files_follow_the_umask(tmp_path, umask):
    out = tmp_path / "run"
    previous = os.umask(umask)
    try:
        assert CliRunner().invoke(app, [*RUN, "--out", str(out)]).exit_code == 0
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes == dict.fromkeys(modes, 0o666 & ~umask), modes


def test_a_full_disk_in_the_middle_of_a_quality_run_keeps_what_was_saved_and_resume_finishes(tmp_path, monkeypatch):
    """Quality saves after every condition of every batch: the disk fills on the third save, so the two saved
    before stay whole, the line says how many and how to continue, and --resume (space back) finishes it."""
    from sfibench.reporting import results

    quality = ["quality", "--model", "tiny-llama", "--device", "cpu", "--methods", "sfi", "--tasks", "niah_single",
               "--ctx", "600", "--retention", "0.5", "--samples", "2", "--batch", "1", "--no-chat"]
    real_write, saves = results.write_text_atomically, []

    def fills_on_the_third(target, text):
        if target.name == "results.json":
            saves.append(target)
            if len(saves) == 3:
                saved[:] = [target.read_bytes()]
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
        real_write(target, text)

    saved: list[bytes] = []
    monkeypatch.setattr(results, "write_text_atomically", fills_on_the_third)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*quality, "--out", str(out)])
    one_line_error(result, f"cannot write {out}/results.json (No space left on device)",
                   f"2 of 4 sample results are saved whole in {out}",
                   f"repeat the command with --out {out} --resume", "free some space")
    assert (out / "results.json").read_bytes() == saved[0]

    monkeypatch.undo()
    resumed = CliRunner().invoke(app, [*quality, "--out", str(out), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert results.read_results(out)["results"]["complete"] is True
