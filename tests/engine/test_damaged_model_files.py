"""A damaged checkpoint or GGUF file is one `error:` line (no traceback) naming what is wrong and the fix,
and a run that would have written a folder leaves none."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from refusals import one_line_error
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.core.errors import ModelFileError
from sfibench.models.loading import find_smollm2_gguf, load_model

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
