"""A GGUF's conversion is kept (models/converted.py): a later load reads it, and gets the same model and
tokenizer; a changed file, a damaged or half-written copy, or a cache that cannot be written each fall back to
converting the GGUF, never to a failed load."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from sfibench.models import converted, loading
from sfibench.models.loading import find_smollm2_gguf, load_model

PROMPT = "The needle is 7301. What is the needle? Answer: <|im_end|> héllo"


@pytest.fixture(scope="module")
def conversion():
    """smollm2's GGUF converted once, straight from the file (the expensive part each test reuses)."""
    return loading._convert_gguf(find_smollm2_gguf())


@pytest.fixture()
def gguf(tmp_path, monkeypatch, conversion) -> tuple[Path, list[Path]]:
    """A copy of smollm2's GGUF with a cache of its own; converting it returns the module's conversion and
    records each call (the list)."""
    monkeypatch.setenv(converted.VARIABLE, str(tmp_path / "converted"))
    path = tmp_path / "model.gguf"
    shutil.copyfile(find_smollm2_gguf(), path)
    calls: list[Path] = []

    def convert(source: Path):
        calls.append(source)
        return conversion

    monkeypatch.setattr(loading, "_convert_gguf", convert)
    return path, calls


def same_model(a, b) -> None:
    state_a, state_b = a.model.state_dict(), b.model.state_dict()
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[name], state_b[name]) for name in state_a)
    assert a.config == b.config
    assert a.tokenizer.encode(PROMPT) == b.tokenizer.encode(PROMPT)
    assert a.tokenizer.encode(PROMPT, chat=True) == b.tokenizer.encode(PROMPT, chat=True)
    assert a.tokenizer.eos_token_id == b.tokenizer.eos_token_id


def test_a_second_load_reads_the_kept_conversion(gguf):
    path, calls = gguf
    first = load_model(str(path))
    assert calls == [path]
    folder = converted.folder_for(path)
    assert (folder / converted.SOURCE).is_file() and (folder / converted.WEIGHTS).is_file()
    second = load_model(str(path))
    assert calls == [path]  # read back, not converted again
    same_model(first, second)


def test_a_changed_gguf_is_converted_again(gguf):
    path, calls = gguf
    load_model(str(path))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the file replaced by another
    load_model(str(path))
    assert calls == [path, path]
    assert converted.read(path) is not None  # the copy now matches the file as it is


@pytest.mark.parametrize("damage", ["weights cut short", "no source record", "config not JSON"])
def test_a_damaged_or_unfinished_copy_is_converted_again(gguf, damage):
    path, calls = gguf
    load_model(str(path))
    folder = converted.folder_for(path)
    if damage == "weights cut short":
        weights = folder / converted.WEIGHTS
        weights.write_bytes(weights.read_bytes()[:1000])
    elif damage == "no source record":  # what an interrupted write leaves
        (folder / converted.SOURCE).unlink()
    else:
        (folder / converted.CONFIG).write_text("{not json", encoding="utf-8")
    assert converted.read(path) is None
    load_model(str(path))
    assert calls == [path, path]
    assert converted.read(path) is not None


def test_a_cache_that_cannot_be_written_only_costs_the_conversion(gguf, tmp_path, monkeypatch):
    path, calls = gguf
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder", encoding="utf-8")
    monkeypatch.setenv(converted.VARIABLE, str(blocked / "converted"))
    first = load_model(str(path))
    second = load_model(str(path))
    assert calls == [path, path]
    same_model(first, second)
    assert list(tmp_path.glob("**/*.partial")) == []
