"""Fixtures shared by the test suite. The real smollm2-135m model is loaded once per session.

Without CUDA the Triton kernels run in Triton's interpreter on CPU tensors. The interpreter is chosen
when a kernel is decorated, i.e. when its module is first imported, so the variable is set here, before
any test module imports sfibench (`setdefault`: an explicit TRITON_INTERPRET from the caller wins).

The test files sit in folders named like the package's parts (kernels/, methods/, engine/, commands/,
reporting/, support/); the modules they share (helpers.py, method_matrix.py, ...) sit here, and test modules
import each other by basename, so this folder and each of its folders go on sys.path before collection
(pytest's default `prepend` import mode; test basenames are unique across the folders).

The interpreter runs a kernel thousands of times slower than a GPU, so the kernel and method matrices are
split: the default run keeps one case of each parametrized kernel test (a test in kernels/) and one case of
each method on each path, and marks the other cases `full`, as it marks the regression gate's end-to-end
reruns, which .ci/run also runs as `sfibench check` (pyproject's addopts deselect `full`; .ci/run and
`-m "full or not full"` run everything).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
KERNEL_TESTS = TESTS / "kernels"  # Triton kernels checked against their torch oracles
TEST_FOLDERS = sorted(p for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))
for folder in (TESTS, *TEST_FOLDERS):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# GGUF conversions (models/converted.py) go to a folder of this run, removed when it ends, not to the user's
# ~/.cache; pytest-xdist's workers and the CLI's subprocesses inherit it, so each GGUF converts once per run.
if "SFIBENCH_CONVERTED_CACHE" not in os.environ:
    os.environ["SFIBENCH_CONVERTED_CACHE"] = tempfile.mkdtemp(prefix="sfibench-converted-")
    atexit.register(shutil.rmtree, os.environ["SFIBENCH_CONVERTED_CACHE"], True)

# pytest-xdist runs one worker per core; each worker's torch would start a thread per core as well, and
# the oversubscribed threads spin-wait on each other (a tiny Gemma-3 decode: 0.4 s alone, 27 s so).
# Each worker takes its share of the cores instead.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

from sfibench.models.loading import load_model

# Method matrices: the cases that run by default (each method, on each of its paths, at least once).
DEFAULT_CASES = {
    # the reference path at batch 3 (which also decodes a row alone); the optimized path, whose kernels run
    # in Triton's interpreter on a CPU, at batch 1 (test_paths_agree decodes it batched against the reference)
    "test_methods.py::test_matrix_every_method_runs_and_batched_rows_match_single":
        lambda p: p["model_name"] == "tiny-qwen3" and p["batch"] == (3 if p["path"] == "reference" else 1),
    "test_paths_agree.py::test_paths_agree_on_tokens_and_reads": lambda p: p["model_name"] == "tiny-qwen3",
    "test_paths_agree.py::test_paths_agree_with_sliding_window_layers": lambda p: p["name"] == "sfi",
    # both paths are compared case by case in test_paths_agree; the equalities with Full-KV hold per path
    "test_retrieval_methods.py::test_a_budget_covering_the_history_is_full_kv": lambda p: p["path"] == "reference",
    "test_retrieval_methods.py::test_tidaldecode_with_no_layer_left_to_select_in_reads_everything":
        lambda p: p["path"] == "reference",
    # sfibench.hf against the engine on the tiny models, and on architectures outside the engine's: SFI by default
    "test_hf.py::test_tiny_models_give_the_engines_tokens_and_reads": lambda p: p["name"] == "sfi",
    "test_hf_use.py::test_other_architectures_run_every_method": lambda p: p["name"] == "sfi",
}

# Whole-command reruns and real-model runs of minutes on 2 cores. The regression gate's reruns (three
# `sfibench stability` runs): by default the gate is tested on fabricated runs, and .ci/run reruns the
# committed baseline besides.
FULL_TESTS = {
    "test_check.py::test_a_rerun_of_the_unchanged_tree_passes",
    "test_check.py::test_a_rerun_with_a_random_selector_fails",
    # the optimized path on the real 30-layer model runs in Triton's interpreter: minutes on 2 cores; the
    # tiny models' paths-agree cases cover the same kernels by default
    "test_paths_agree.py::test_paths_agree_on_smollm2",
    # three rank processes and the test's own each load the real model: about 3 minutes on 2 cores
    "test_tp.py::test_smollm2_split_over_its_three_kv_heads_decodes_as_one_process",
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items):
    seen = set()
    for item in items:
        module, test = item.path.name, item.originalname
        if f"{module}::{test}" in FULL_TESTS:
            item.add_marker(pytest.mark.full)
        params = getattr(getattr(item, "callspec", None), "params", None)
        if params is None:
            continue
        rule = DEFAULT_CASES.get(f"{module}::{test}")
        if rule is not None:
            default = rule(params)
        elif item.path.parent == KERNEL_TESTS:  # the first case of each parametrized kernel test runs
            default = (module, test) not in seen
            seen.add((module, test))
        else:
            continue
        if not default:
            item.add_marker(pytest.mark.full)


@pytest.fixture(scope="session")
def smollm2():
    torch.manual_seed(0)
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def byte_fmt():
    """Prompts in byte tokens, chat-wrapped: the task generators' tests without a model."""
    from sfibench.models.tokenizer import ByteTokenizer, Tokenizer
    from sfibench.workloads.base import PromptFormat

    return PromptFormat(Tokenizer(ByteTokenizer()), chat=True)


@pytest.fixture(scope="session")
def smollm2_fmt():
    """The real smollm2 tokenizer (no model weights): lengths must hold in the model's own tokens."""
    from transformers import AutoTokenizer

    from sfibench.models.loading import MissingWeightsError, find_smollm2_gguf
    from sfibench.models.tokenizer import Tokenizer
    from sfibench.workloads.base import PromptFormat

    try:
        path = find_smollm2_gguf()
    except MissingWeightsError:
        pytest.skip("smollm2-135m weights are not installed")
    return PromptFormat(Tokenizer(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)), chat=True)


@pytest.fixture(scope="session")
def tiny_models():
    return {name: load_model(name) for name in ("tiny-llama", "tiny-qwen2", "tiny-qwen3")}
