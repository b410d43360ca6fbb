"""What is wrong with a model file, said in one line: the loader's boundary with the libraries that read them.

transformers (GGUF files, tokenizers), gguf and safetensors raise whatever their parsers hit first on a
damaged file (`ValueError: cannot reshape array`, `struct.error`, `SafetensorError: header too large`,
`KeyError: 'hidden_size'`). Every read of a user's file goes through `reading`, which turns those into a
ModelFileError naming the file, what is wrong and the fix. Only the reads are wrapped: an error raised
by sfibench's own code after the files are read is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from sfibench.core.errors import ModelFileError, UsageError
from sfibench.core.oom import is_out_of_memory
from sfibench.models.presets import ModelConfig

GGUF_MAGIC = b"GGUF"
REDOWNLOAD = "download it again (compare its size with the source's) or pass another --model"
# The sizes every decoder needs, as ModelConfig fields, and the config.json key each comes from.
SIZES = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "intermediate_size": "intermediate_size",
         "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
         "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim", "max_context": "max_position_embeddings"}


class MissingWeightsError(FileNotFoundError):
    """A preset's real weights are not installed; the message names the command that installs them."""


def _passes_through(error: BaseException) -> bool:
    """Errors that say nothing about the file: running out of memory while reading a large one, and the
    equally specific errors sfibench raised itself."""
    return is_out_of_memory(error) or isinstance(error, UsageError)


def _reason(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


@contextlib.contextmanager
def reading(path: Path, what: str, fix: str) -> Iterator[None]:
    """Translate any failure of the body (a library reading `path`) into one ModelFileError:
    "`path`: cannot be read as `what` (the library's reason); `fix`"."""
    try:
        yield
    except Exception as error:
        if _passes_through(error):
            raise
        if isinstance(error, PermissionError):
            raise ModelFileError(f"--model {path}: cannot be read (permission denied); make it readable by "
                                 "this user or pass another --model") from None
        raise ModelFileError(f"--model {path}: cannot be read as {what} ({_reason(error)}); {fix}") from None


def check_gguf_file(path: Path) -> None:
    """What can be seen without parsing: an empty file, or one that is not GGUF at all."""
    with reading(path, "a GGUF file", REDOWNLOAD):
        with path.open("rb") as handle:
            head = handle.read(len(GGUF_MAGIC))
    if not head:
        raise ModelFileError(f"--model {path}: the file is empty; {REDOWNLOAD}")
    if head != GGUF_MAGIC:
        raise ModelFileError(f"--model {path}: not a GGUF file (it starts with {head!r}, not {GGUF_MAGIC!r}); "
                             "pass a .gguf file, or a Hugging Face checkpoint directory")


@contextlib.contextmanager
def reading_gguf(path: Path) -> Iterator[None]:
    """A GGUF file's metadata and tensors through transformers: a file cut short fails somewhere inside
    its tensor data, an architecture transformers cannot convert says so."""
    try:
        yield
    except Exception as error:
        if _passes_through(error):
            raise
        if "not supported" in str(error):
            raise ModelFileError(f"--model {path}: {_reason(error)}; sfibench runs llama, qwen2, qwen3 and "
                                 "gemma3 models") from None
        raise ModelFileError(f"--model {path}: a damaged or incomplete GGUF file (reading it failed: "
                             f"{_reason(error)}); {REDOWNLOAD}") from None


def read_config_json(path: Path) -> dict:
    """config.json as a dict, or one line saying why it is not one."""
    fix = "restore the config.json that came with the checkpoint"
    with reading(path, "JSON", fix):
        import json

        hf = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(hf, dict):
        raise ModelFileError(f"--model {path}: holds a JSON {type(hf).__name__}, not an object of settings; {fix}")
    return hf


def check_sizes(hf: dict, path: Path) -> None:
    """Each size the settings give is a whole number >= 1 (a missing one is named where it is needed)."""
    for key in SIZES.values():
        value = hf.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ModelFileError(f"--model {path}: {key} is {value!r}, not a whole number >= 1; restore the "
                                 "config.json that came with the checkpoint")


@contextlib.contextmanager
def reading_config(path: Path) -> Iterator[None]:
    """Building a ModelConfig from a checkpoint's settings: a field that is missing or not a number."""
    fix = "restore the config.json that came with the checkpoint"
    try:
        yield
    except KeyError as error:
        raise ModelFileError(f"--model {path}: lacks the field {error.args[0]!r}, which sfibench needs to build "
                             f"the model; {fix}") from None
    except (TypeError, ValueError, ArithmeticError) as error:
        if isinstance(error, UsageError):
            raise
        raise ModelFileError(f"--model {path}: a field has a value sfibench cannot use ({_reason(error)}); "
                             f"{fix}") from None


def check_config(config: ModelConfig, path: Path) -> None:
    """Every size a positive whole number and the query heads a multiple of the KV heads, so a bad value
    is named here rather than failing inside the decoder's construction."""
    fix = "restore the config.json that came with the checkpoint"
    for field, key in SIZES.items():
        value = getattr(config, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelFileError(f"--model {path}: {key} is {value!r}, not a whole number >= 1; {fix}")
    if config.num_heads % config.num_kv_heads:
        raise ModelFileError(f"--model {path}: num_attention_heads {config.num_heads} is not a multiple of "
                             f"num_key_value_heads {config.num_kv_heads}; {fix}")


@contextlib.contextmanager
def matching_weights(path: Path) -> Iterator[None]:
    """Loading the weights into a decoder built from the config: a tensor of the wrong shape or name."""
    try:
        yield
    except (RuntimeError, ValueError) as error:
        if _passes_through(error):
            raise
        raise ModelFileError(f"--model {path}: the weights do not match the model its config describes "
                             f"({_reason(error)}); use the weights and config.json of one checkpoint") from None
