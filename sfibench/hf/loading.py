"""A model loaded by transformers for the engine to run through sfibench.hf (`--engine transformers`).

The engine's own decoder covers the Llama family and Gemma-3; transformers runs any causal LM whose
attention goes through its AttentionInterface. Here a checkpoint directory (config.json and weights,
any architecture transformers knows), a .gguf file, or a preset with real weights (its GGUF) is loaded
with transformers and wrapped as the engine's Decoder (model.TransformersDecoder), so the engine's
prefill, step driver and every command built on them run it unchanged: same methods, same reports.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import torch

from sfibench.core.device import resolve_device
from sfibench.core.errors import UsageError
from sfibench.engine.session import Session, parse_dtype
from sfibench.hf.model import engine_view
from sfibench.models.loading import GGUF_FINDERS, LoadedModel
from sfibench.models.loading_errors import REDOWNLOAD, check_gguf_file, reading, reading_gguf
from sfibench.models.presets import PRESETS
from sfibench.models.tokenizer import ByteTokenizer, Tokenizer, check_round_trip


def check_transformers_model(model: str) -> None:
    """What `--engine transformers` can load, checked without loading: a preset with real weights, a .gguf
    file, or a directory with a config.json naming its architecture."""
    if model in PRESETS:
        if PRESETS[model].source == "random":
            with_weights = ", ".join(name for name, preset in PRESETS.items() if preset.source != "random")
            raise UsageError(f"--engine transformers loads real weights and {model} is a random-weight preset; "
                             f"give a checkpoint directory, a .gguf file or {with_weights}, or drop --engine")
        return
    path = Path(model)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UsageError(f"--model {path}: no such .gguf file")
        return
    if not (path / "config.json").is_file():
        raise UsageError(f"--model {model!r}: --engine transformers needs a checkpoint directory with config.json, "
                         "a .gguf file or a preset with real weights")
    try:
        model_type = json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (ValueError, AttributeError):
        raise UsageError(f"--model {path}: config.json is not a JSON object; is this a checkpoint directory?") from None
    if not model_type:
        raise UsageError(f"--model {path}: config.json names no model_type, so transformers cannot tell what "
                         "architecture to build")


def load_transformers(model: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Load `model` with transformers and wrap it as the engine's Decoder (its attention becomes sfibench's)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    check_transformers_model(model)
    hf_logging.disable_progress_bar()
    path = Path(model)
    if model in PRESETS or path.suffix == ".gguf":
        path = GGUF_FINDERS[model]() if model in PRESETS else path
        check_gguf_file(path)
        # the GGUF converter draws its own progress bar
        with reading_gguf(path), contextlib.redirect_stderr(io.StringIO()):
            hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
            backend = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    else:
        with reading(path, "a transformers checkpoint", REDOWNLOAD):
            hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        backend = ByteTokenizer()  # as the engine reads a checkpoint without tokenizer files
        if (path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists():
            with reading(path, "a tokenizer (tokenizer.json, tokenizer_config.json)",
                         "restore the tokenizer files that came with the checkpoint"):
                backend = AutoTokenizer.from_pretrained(str(path))
    decoder = engine_view(hf.to(device).eval())
    tokenizer = Tokenizer(backend)
    check_round_trip(tokenizer, decoder.config.vocab_size, path.name)  # converters have produced broken ones
    return LoadedModel(decoder, tokenizer, decoder.config)


def open_session(model: str, device: str = "auto", dtype: str = "auto") -> Session:
    """The engine's Session over a model loaded by transformers."""
    resolved = resolve_device(device)
    torch_dtype = parse_dtype(dtype, resolved)
    return Session(load_transformers(model, resolved, torch_dtype), resolved, torch_dtype)
