"""A GGUF file's conversion, kept so that only its first load pays for it.

Reading a GGUF means dequantising every tensor on the CPU and building a tokenizer from the file's vocabulary
(Qwen2.5-Coder-1.5B: about a minute on 16 cores). The result is kept under ~/.cache/sfibench/converted (or
$SFIBENCH_CONVERTED_CACHE): one folder per GGUF path holding the float32 weights as safetensors (6 GB for a
1.5B model), the model's configuration and the tokenizer's files. A later load reads that folder in seconds
when the GGUF's size and modification time still match the ones it was converted at; otherwise it converts
again and replaces the folder. Deleting the folder only costs the next load its conversion.

A copy is written whole under a temporary name and then renamed, so an interrupted write never looks finished;
a copy that cannot be written (no room, a read-only cache) or read back is skipped with the GGUF read as usual,
since a cache must never be why a load fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from sfibench.core.caches import cache_dir, sfibench_folder

VARIABLE = "SFIBENCH_CONVERTED_CACHE"
WEIGHTS, CONFIG, SOURCE, TOKENIZER = "weights.safetensors", "config.json", "source.json", "tokenizer"


def root() -> Path | None:
    """Where conversions are kept: $SFIBENCH_CONVERTED_CACHE, else ~/.cache/sfibench/converted where it can be
    written, else a per-user folder in the temporary directory (None: nowhere can be written)."""
    if os.environ.get(VARIABLE):
        return Path(os.environ[VARIABLE])
    return cache_dir(sfibench_folder("converted"), "converted")


def folder_for(gguf: Path) -> Path | None:
    """One folder per GGUF path (its name, then a hash of the resolved path, so equal names never collide)."""
    base = root()
    if base is None:
        return None
    key = hashlib.sha256(str(gguf.resolve()).encode()).hexdigest()[:12]
    return base / f"{gguf.stem}-{key}"


def _source(gguf: Path) -> dict:
    stat = gguf.stat()
    return {"path": str(gguf.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def read(gguf: Path) -> tuple[dict, dict[str, torch.Tensor], object] | None:
    """(the model's configuration, its float32 state dict, its transformers tokenizer) kept for `gguf`, or
    None where no copy matches the file as it is now."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    folder = folder_for(gguf)
    if folder is None or not (folder / SOURCE).is_file():
        return None
    try:
        if json.loads((folder / SOURCE).read_text(encoding="utf-8")) != _source(gguf):
            return None
        config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
        tokenizer = AutoTokenizer.from_pretrained(str(folder / TOKENIZER))
        return config, load_file(str(folder / WEIGHTS)), tokenizer
    except Exception:  # noqa: BLE001 - a damaged copy fails in safetensors, json or transformers: convert again
        return None


def write(gguf: Path, config: dict, state: dict[str, torch.Tensor], tokenizer) -> None:
    """Keep a conversion of `gguf`: `config` (a Hugging Face config dict), `state` (its weights; tensors that
    share storage are kept once, under their first name) and `tokenizer` (a transformers tokenizer)."""
    from safetensors.torch import save_file

    folder = folder_for(gguf)
    if folder is None:
        return
    kept, seen = {}, set()
    for name, tensor in state.items():
        alias = (tensor.data_ptr(), tuple(tensor.shape))  # a tied weight: the same tensor under a second name
        if tensor.numel() == 0 or alias not in seen:
            seen.add(alias)
            kept[name] = tensor.contiguous()
    staging = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        needed = sum(t.numel() * t.element_size() for t in kept.values())
        if shutil.disk_usage(folder.parent).free < 2 * needed:  # leave room for everything else
            return
        staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".partial"))
        save_file(kept, str(staging / WEIGHTS))
        (staging / CONFIG).write_text(json.dumps(config, default=str), encoding="utf-8")
        tokenizer.save_pretrained(str(staging / TOKENIZER))
        # written last: a folder without it is never read
        (staging / SOURCE).write_text(json.dumps(_source(gguf)), encoding="utf-8")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(staging, folder)
    except Exception:  # noqa: BLE001 - no room, no permission or a writer's own error
        return  # kept nowhere: the next load converts again
    finally:
        if staging is not None and staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
