"""Every kind of bad input a new user types: exit status 2, one line naming the option and the fix,
before any expensive work (the model never loads), and nothing written in the working directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from no_model import ModelLoaded, forbid_model_loading
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.engine.session import Session


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory (where the default runs/ would go) in which no model can load."""
    monkeypatch.chdir(tmp_path)
    forbid_model_loading(monkeypatch)
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00 not text")
    (tmp_path / "notes").mkdir()
    (tmp_path / "short.txt").write_text("Too short. !")
    for name, model_type in (("mistral", "mistral"), ("no-weights", "llama")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(f'{{"model_type": "{model_type}"}}')
    return tmp_path


def refused(args: list[str], workdir) -> str:
    """Run the command; check it exits 2 with a one-line error and leaves the directory as it was."""
    before = sorted(p.name for p in workdir.iterdir())
    result = CliRunner().invoke(app, args)
    assert not isinstance(result.exception, ModelLoaded), f"{args}: the model loaded before the input was checked"
    assert result.exit_code == 2, (args, result.output)
    assert sorted(p.name for p in workdir.iterdir()) == before, f"{args} left something behind"
    assert "Traceback" not in result.output
    return " ".join(result.output.split())


BAD_INPUT = {
    # token counts: zero, negative, empty (no silent default), fractional, and past the model's limit
    "ctx zero": (["throughput", "--ctx", "0"], "--ctx '0' is not a token count"),
    "ctx negative": (["throughput", "--ctx", "-5"], "write a positive whole number of tokens"),
    "ctx empty": (["throughput", "--ctx", ""], "--ctx is empty"),
    "ctx repeated": (["quality", "--ctx", "2k,2048"], "--ctx gives 2,048 more than once"),
    "ctx fractional": (["quality", "--ctx", "1.5k"], "--ctx '1.5k' is not a token count"),
    "throughput ctx repeated": (["throughput", "--ctx", "1k,1024"], "--ctx gives 1,024 more than once"),
    "throughput batch repeated": (["throughput", "--batch", "2,2"], "--batch gives 2 more than once"),
    "profile ctx zero": (["profile", "--ctx", "0"], "--ctx '0' is not a token count"),
    "throughput ctx too long": (["throughput", "--ctx", "5000"], "the longest --ctx that fits with this --steps is 4,064"),
    "profile ctx too long": (["profile", "--ctx", "9000"], "exceeds tiny-llama's limit of 4,096 tokens"),
    "quality ctx too long": (["quality", "--ctx", "9000"], "exceeds smollm2-135m's limit of 8192 tokens"),
    "stability too many steps": (["stability", "--steps", "9000"], "has a context of 8192 tokens"),
    "stability ctx beyond the model": (["stability", "--model", "tiny-gemma3", "--ctx", "8k", "--steps", "16"],
                                       "tiny-gemma3 has a context of 4096 tokens, but --ctx 8192 is beyond it"),
    "stability ctx too short for the steps": (["stability", "--ctx", "1k", "--steps", "1000"],
                                              "--ctx 1024 leaves a 24-token prompt before the 1000 steps"),
    "stability ctx and prefix": (["stability", "--ctx", "2k", "--prefix", "600"],
                                 "--prefix and --ctx both set the prompt's length"),
    "stability task prompts without ctx": (["stability", "--prompts", "niah_single"], "give --ctx (e.g. --ctx 8k)"),
    "stability unknown prompt source": (["stability", "--ctx", "4k", "--prompts", "prose,nope"], "unknown task 'nope'"),
    "stability fixed refresh word": (["stability", "--fixed-refresh", "often"],
                                     "--fixed-refresh 'often' is neither auto nor a whole number of steps"),
    "stability fixed refresh zero": (["stability", "--fixed-refresh", "0"], "neither auto nor a whole number"),
    "stability even neighbour pool": (["stability", "--keep-neighbours", "6"], "--keep-neighbours 6 is even"),
    # counts and lists
    "batch zero": (["throughput", "--batch", "0"], "--batch '0' is not a whole number >= 1"),
    "batch word": (["throughput", "--batch", "abc"], "--batch 'abc' is not a whole number >= 1"),
    # memory, estimated from the preset's shape before the model loads or anything is measured (throughput's with
    # its methods' state, so after the methods' modules load)
    "throughput batch beyond memory": (["throughput", "--batch", "100000"], "lower the batch size"),
    "throughput batch beyond memory at max": (["throughput", "--batch", "1,100000", "--ctx", "1k,max"],
                                              "lower the batch size"),
    "profile batch beyond memory": (["profile", "--batch", "10000000"], "lower the batch size"),
    "samples word": (["quality", "--samples", "abc"], "--samples 'abc' is not a whole number >= 1"),
    "samples per context": (["quality", "--samples", "1,2,3"], "3 counts for 1 contexts"),
    "methods empty": (["quality", "--methods", ""], "--methods is empty"),
    "paths empty": (["throughput", "--paths", ""], "--paths is empty"),
    # names that must exist
    "unknown method": (["throughput", "--methods", "h2o"], "unknown method 'h2o'; valid methods"),
    "unknown path": (["throughput", "--paths", "fast"], "--paths 'fast' is not one of: reference, optimized"),
    "quality unknown path": (["quality", "--path", "fast"], "no 'fast' path"),
    "stability unknown path": (["stability", "--path", "fast"], "no 'fast' path"),
    "profile unknown path": (["profile", "--path", "fast"], "no 'fast' path"),
    "unknown task": (["quality", "--tasks", "niah_triple"], "unknown task 'niah_triple'"),
    "unknown model": (["generate", "--model", "nope"], "valid presets: tiny-llama"),
    "model dir without config": (["generate", "--model", "notes"], "directory without config.json"),
    "missing gguf": (["generate", "--model", "weights.gguf"], "no such .gguf file"),
    "checkpoint of another architecture": (["quality", "--model", "mistral"], "model_type 'mistral' is not supported"),
    "checkpoint without weights": (["stability", "--model", "no-weights"], "has no *.safetensors weights"),
    "unknown device": (["throughput", "--device", "gpu"], "--device: unknown device 'gpu'"),
    "unknown dtype": (["quality", "--dtype", "fp8"], "--dtype 'fp8' is not one of"),
    "unknown trigger": (["generate", "--trigger", "sometimes"], "--trigger 'sometimes' is not one of"),
    "unknown prefill mode": (["throughput", "--prefill", "maybe"], "--prefill 'maybe' is not one of"),
    "graphs on a cpu": (["throughput", "--graphs"], "--graphs needs a CUDA device"),
    "quality graphs on a cpu": (["quality", "--graphs", "--device", "cpu"], "--graphs needs a CUDA device"),
    # budgets: one spelling per meaning
    "budget with decimals": (["generate", "--budget", "300.9"], "tokens are whole numbers, e.g. 300"),
    "budget 1.5": (["generate", "--budget", "1.5"], "tokens are whole numbers, e.g. 1"),
    "budget as a fraction": (["generate", "--budget", "0.15"], "0.15 is written 15%"),
    "budget word": (["generate", "--budget", "abc"], "is not a whole number of tokens (300) or a percentage"),
    "budget percentage too big": (["generate", "--budget", "150%"], "not a percentage in (0%, 100%]"),
    "k-head as a fraction": (["stability", "--k-head", "0.1"], "0.1 is written 10%"),
    "quality budget word": (["quality", "--budget", "abc"], "--budget 'abc' is not a whole number of tokens"),
    "quality budget above the context": (["quality", "--budget", "1.5"], "or a fraction of the context in (0, 1]"),
    "quality budget in tokens over two contexts": (["quality", "--budget", "600", "--ctx", "1k,2k"],
                                                   "give it with exactly one --ctx in tokens"),
    "retention word": (["quality", "--retention", "abc"], "--retention 'abc' is not a whole number of tokens"),
    "retention and budget": (["quality", "--retention", "0.2", "--budget", "0.2"], "give --budget alone"),
    "retention too small": (["quality", "--model", "tiny-llama", "--ctx", "600", "--retention", "0.01"],
                            "no room for selected tokens beside 4 sinks"),
    "memory without a unit": (["models", "--memory", "141"], "write a number and its unit, such as 141GiB"),
    # files
    "prompt file is a directory": (["generate", "--prompt-file", "notes"], "--prompt-file notes is not a file"),
    "prompt file missing": (["generate", "--prompt-file", "gone.txt"], "--prompt-file gone.txt does not exist"),
    "prompt file not text": (["generate", "--prompt-file", "binary.txt"], "is not UTF-8 text"),
    "prompt and prompt file": (["generate", "--prompt", "x", "--prompt-file", "binary.txt"], "not both"),
    "empty prompt": (["generate", "--prompt", " "], "--prompt is empty"),
    "text too short for the steps": (["stability", "--text-file", "short.txt"], "the text has at most 13 tokens"),
    "text file is a directory": (["stability", "--text-file", "notes"], "--text-file notes is not a file (a directory?)"),
    "longbench missing": (["quality", "--longbench", "gone"], "--longbench gone does not exist"),
    # ranges typer cannot express
    "top-p zero": (["generate", "--top-p", "0"], "--top-p must be above 0"),
    "topk-frac outside (0, 1)": (["stability", "--topk-frac", "1.5"], "--topk-frac must lie strictly between 0 and 1"),
    # --resume and --overwrite
    "resume without out": (["quality", "--resume"], "--resume needs --out DIR"),
    "resume and overwrite": (["quality", "--resume", "--overwrite", "--out", "x"], "not both"),
    "resume a missing run": (["quality", "--resume", "--out", "gone"], "--resume: gone does not exist"),
    "resume a folder without a run": (["quality", "--resume", "--out", "notes"], "holds no results.json"),
}


@pytest.mark.parametrize("args, message", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_is_refused_before_any_work(workdir, args, message):
    assert message in refused(args, workdir)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_contexts_out_of_order_are_measured_shortest_first_and_said_once(workdir):
    result = CliRunner().invoke(app, ["throughput", "--ctx", "3k,1k"])
    assert isinstance(result.exception, ModelLoaded)  # accepted: the run went on to load the model
    assert result.output.count("--ctx: measuring shortest first: 1,024, 3,072") == 1, result.output


def test_a_checkpoints_batch_is_refused_from_its_config_before_loading(workdir):
    checkpoint = workdir / "big"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(
        '{"model_type": "llama", "vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1024, '
        '"num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8, '
        '"max_position_embeddings": 4096}')
    (checkpoint / "model.safetensors").write_bytes(b"")
    assert "lower the batch size" in refused(["throughput", "--model", str(checkpoint), "--batch", "50000",
                                              "--ctx", "2k"], workdir)


def test_asking_for_a_gpu_that_is_not_there(workdir):
    assert "no CUDA device is visible" in refused(["quality", "--device", "cuda"], workdir)


def test_typer_refuses_out_of_range_integers(workdir):
    for args in (["quality", "--batch", "0"], ["stability", "--steps", "1"], ["generate", "--layer-groups", "3"]):
        refused(args, workdir)


def test_the_context_limit_hint_is_the_length_ctx_max_gives(tmp_path):
    """One number in every hint: the longest prompt a refused --ctx is told about is what `max` picks."""
    import re

    from sfibench.runners.quality import _fit_contexts
    from sfibench.commands.quality_options import quality_run
    from sfibench.workloads.base import PromptFormat

    result = CliRunner().invoke(app, ["quality", "--model", "tiny-llama", "--tasks", "niah_multiturn", "--ctx", "4000",
                                      "--no-chat", "--device", "cpu", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and not (tmp_path / "run").exists()
    hinted = re.search(r"the longest prompt that fits is (\d+), which --ctx max gives", " ".join(result.output.split()))
    session = Session.open("tiny-llama", "cpu")
    run = quality_run("tiny-llama", ["sfi"], ["niah_multiturn"], ["max"], [0.5], [1], batch=1, device="cpu")
    assert _fit_contexts(session, PromptFormat(session.loaded.tokenizer, False), run) == [int(hinted[1])]


# Refused by checks that need no model and no torch: each case runs in one fresh interpreter, which
# records whether torch was imported when the command exited. `--device cpu` where the check needs the
# device, so the answer does not depend on whether this torch was built with CUDA.
NO_TORCH = {
    "repeated context": (["throughput", "--ctx", "1k,1k"], "--ctx gives 1,024 more than once"),
    "repeated batch": (["throughput", "--batch", "2,2"], "--batch gives 2 more than once"),
    "unknown method": (["throughput", "--methods", "h2o"], "unknown method 'h2o'; valid methods:"),
    "unknown pinned path": (["throughput", "--methods", "sfi/gpu"], "--methods sfi/gpu: there is no 'gpu' path"),
    "optimized on a cpu": (["throughput", "--paths", "optimized", "--device", "cpu"],
                           "--paths optimized runs Triton kernels and needs a CUDA device"),
    "graphs on a cpu": (["throughput", "--graphs", "--device", "cpu"], "--graphs needs a CUDA device"),
    "context beyond the model": (["throughput", "--ctx", "5000", "--device", "cpu"], "exceeds tiny-llama's limit"),
    "profile unknown method": (["profile", "--method", "h2o"], "unknown method 'h2o'"),
    "profile batch beyond memory": (["profile", "--batch", "100000", "--device", "cpu"], "lower the batch size"),
    "generate optimized on a cpu": (["generate", "--path", "optimized", "--device", "cpu"],
                                    "--path optimized runs Triton kernels"),
    "generate unknown method": (["generate", "--method", "h2o"], "unknown method 'h2o'"),
    "quality repeated context": (["quality", "--ctx", "2k,2048"], "--ctx gives 2,048 more than once"),
    "quality unknown method": (["quality", "--methods", "h2o"], "unknown method 'h2o'"),
    "quality unknown task": (["quality", "--tasks", "nope"], "unknown task 'nope'"),
    "stability unknown path": (["stability", "--path", "fast"], "there is no 'fast' path"),
    "stability top-p zero": (["stability", "--top-p", "0"], "--top-p must be above 0"),
}
CHILD = """
import contextlib, io, json, sys
from sfibench.cli import app
results = []
for args in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            app(args, prog_name="sfibench")
        except SystemExit as stop:
            results.append({"status": stop.code, "torch": "torch" in sys.modules, "error": err.getvalue()})
print(json.dumps(results))
"""


def test_checks_that_need_no_model_fail_before_torch_is_imported(tmp_path):
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # Triton's CPU interpreter off
    import sfibench  # the child imports this checkout, wherever the installed package points

    env["PYTHONPATH"] = os.pathsep.join([str(Path(sfibench.__file__).parents[1]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps([a for a, _ in NO_TORCH.values()])], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for name, (_, message), result in zip(NO_TORCH, NO_TORCH.values(), json.loads(done.stdout)):
        error = " ".join(result["error"].split())
        assert result["status"] == 2 and error.startswith("error: ") and message in error, (name, error)
        assert not result["torch"], f"{name}: torch was imported before the command was refused"
    assert list(tmp_path.iterdir()) == []


def test_torchs_build_read_without_torch_is_the_one_torch_reports():
    from sfibench.core.device_facts import device_type, torch_build

    assert torch_build() == {"version": torch.__version__,
                             "gpu": bool(torch.version.cuda or torch.version.hip or getattr(torch.version, "rocm", None))}
    assert device_type("cpu") == "cpu"
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        device_type("gpu")


def test_every_user_error_the_cli_names_by_module_exists():
    """user_errors looks these up by module name (so entering a command imports none of them)."""
    import importlib

    from sfibench.commands.common import OTHER_USER_ERRORS

    for module, names in OTHER_USER_ERRORS.items():
        for name in names:
            assert issubclass(getattr(importlib.import_module(module), name), Exception), (module, name)
