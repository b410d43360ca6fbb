"""Command-line values checked before any expensive work, each error naming its option and the fix.

Typer already checks types and simple ranges (`min=`); these cover what it cannot: comma-separated
lists, token counts such as `8k`, names that must exist here (model, device, dtype), and whether a batch
can fit; SFI's settings are checked in commands/sfi_options.py. All raise UsageError,
which the CLI prints as one line with exit 2. None of them imports torch where the answer is known without
it (a preset, a CPU-only torch build), so a bad command fails at once.
"""

from __future__ import annotations

import re
from pathlib import Path

from sfibench.core.device_facts import DTYPE_BYTES, default_dtype, device_type
from sfibench.core.errors import UsageError
from sfibench.models.shape import config_before_loading

_TOKEN_COUNT = re.compile(r"([0-9]+)(k?)")
DTYPES = ("auto", "float32", "bfloat16", "float16")
PREFILL_MODES = ("auto", "real", "synthetic")  # throughput's --prefill
THROUGHPUT_STEPS = {"cuda": 128, "cpu": 32}  # `sfibench throughput`'s decode steps per pass by device type
_MEMORY = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([kmgt]i?b)")
MEMORY_UNITS = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
                "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def split_list(text: str, option: str) -> list[str]:
    """'a, b,c' -> ['a', 'b', 'c']; an empty list is an error, never a silent default."""
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    if not items:
        raise UsageError(f"{option} is empty; give a comma-separated list, or leave the option out for its default")
    return items


def parse_tokens(text: str, option: str, allow_max: bool = False) -> int | str:
    """'3000' -> 3000, '8k' -> 8192 (k = 1,024 tokens), 'max' -> 'max' where the command allows it."""
    spelled = str(text).strip().lower()
    if allow_max and spelled == "max":
        return "max"
    match = _TOKEN_COUNT.fullmatch(spelled)
    tokens = int(match[1]) * (1024 if match[2] else 1) if match else 0
    if tokens < 1:
        spellings = "3000 or 8k" + (" or max" if allow_max else "")
        raise UsageError(f"{option} {text!r} is not a token count; write a positive whole number of tokens "
                         f"such as {spellings}")
    return tokens


def parse_memory(text: str, option: str = "--memory") -> int:
    """'141GiB' -> bytes: GiB, MiB and TiB are powers of 2, GB, MB and TB powers of 10."""
    match = _MEMORY.fullmatch(str(text).strip().lower())
    nbytes = int(float(match[1]) * MEMORY_UNITS[match[2]]) if match else 0
    if nbytes < 1:
        raise UsageError(f"{option} {text!r} is not a memory size; write a number and its unit, such as 141GiB "
                         "or 150GB")
    return nbytes


def parse_token_list(text: str, option: str, allow_max: bool = True) -> list[int | str]:
    return [parse_tokens(item, option, allow_max) for item in split_list(text, option)]


def parse_counts(text: str, option: str, allow_max: bool = False) -> list[int | str]:
    """'1,4' -> [1, 4]; each a whole number >= 1 (or 'max' where the command allows it)."""
    counts: list[int | str] = []
    for item in split_list(text, option):
        if allow_max and item.lower() == "max":
            counts.append("max")
        elif item.isdigit() and int(item) >= 1:
            counts.append(int(item))
        else:
            raise UsageError(f"{option} {item!r} is not a whole number >= 1"
                             + (" or max" if allow_max else ""))
    return counts


def check_choice(value: str, choices, option: str) -> str:
    if value not in choices:
        raise UsageError(f"{option} {value!r} is not one of: {', '.join(choices)}")
    return value


def check_path(path: str, option: str) -> str:
    """A path some method has; whether the chosen method has it is asked once its module loads."""
    from sfibench.registry import PATHS

    if path not in PATHS:
        raise UsageError(f"{option}: there is no {path!r} path; valid paths: {', '.join(PATHS)}")
    return path


def check_model(model: str) -> None:
    """A preset name, a Hugging Face checkpoint directory or a .gguf file that exists (no loading)."""
    from sfibench.models.presets import PRESETS

    if model in PRESETS:
        return
    path = Path(model)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UsageError(f"--model {path}: no such .gguf file")
        return
    if path.is_dir():
        _check_checkpoint_dir(path)
        return
    raise UsageError(f"--model {model!r} is not a preset, a checkpoint directory or a .gguf file; valid presets: "
                     f"{', '.join(PRESETS)} (`sfibench models` says which have weights here)")


def _check_checkpoint_dir(path: Path) -> None:
    """config.json naming an architecture the decoder implements, and safetensors weights beside it."""
    import json

    from sfibench.models.loading import ARCHS

    if not (path / "config.json").is_file():
        raise UsageError(f"--model {path} is a directory without config.json; give a Hugging Face "
                         "checkpoint directory (config.json + *.safetensors)")
    try:
        model_type = json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (ValueError, AttributeError):
        raise UsageError(f"--model {path}: config.json is not a JSON object; is this a checkpoint directory?") from None
    if model_type not in ARCHS:
        raise UsageError(f"--model {path}: model_type {model_type!r} is not supported; sfibench runs "
                         f"{', '.join(ARCHS)} checkpoints")
    if not any(path.glob("*.safetensors")):
        raise UsageError(f"--model {path} has no *.safetensors weights; download the checkpoint's safetensors "
                         "files into it")


def check_device(device: str):
    """The torch.device `--device` names, if this machine has it."""
    from sfibench.core.device import resolve_device

    try:
        return resolve_device(device)  # DeviceUnavailableError (a user error too) when CUDA is not here
    except ValueError as error:  # only a malformed name raises this
        raise UsageError(f"--device: {error}") from None


def device_kind(device: str) -> str:
    """'cpu' or 'cuda' for `--device`: from torch's build where that settles it, else from torch."""
    try:
        kind = device_type(device)  # DeviceUnavailableError (a user error too) for CUDA on a CPU-only build
    except ValueError as error:  # only a malformed name raises this
        raise UsageError(f"--device: {error}") from None
    return kind if kind is not None else check_device(device).type


def check_dtype(dtype: str) -> str:
    return check_choice(dtype, DTYPES, "--dtype")


def check_session_options(model: str, device: str, dtype: str) -> str:
    """The three options every model-loading command shares; returns the device's type ('cpu', 'cuda')."""
    check_model(model)
    check_dtype(dtype)
    return device_kind(device)


def check_device_needs(device: str, option: str, paths=(), graphs: bool = False) -> None:
    """The GPU-only options against the device `--device` names, before any model loads: the optimized
    path's Triton kernels (`option` is the flag that asked for it, --path or --paths) and CUDA graphs."""
    from sfibench.optimized.triton_device import triton_runs_on

    kind = device_kind(device)
    if "optimized" in paths and not triton_runs_on(kind):
        raise UsageError(f"{option} optimized runs Triton kernels and needs a CUDA device, and {kind} is not "
                         f"one; use {option} reference on this machine")
    if graphs and kind != "cuda":
        raise UsageError(f"--graphs needs a CUDA device, and {kind} is not one; leave it out (or give "
                         "--no-graphs) on this machine")


def check_top_p(top_p: float) -> None:
    """Typer bounds --top-p to [0, 1]; 0 would keep no token at all."""
    if top_p <= 0:
        raise UsageError("--top-p must be above 0; 1 keeps the whole distribution")


def check_shape_options(model: str | None, device: str, dtype: str) -> tuple[str, bool]:
    """(model, whether the device is a GPU) for the commands that default to a shape per device: the
    Qwen3-4B shape (random weights) on a GPU, tiny-llama on a CPU."""
    check_dtype(dtype)
    gpu = device_kind(device) == "cuda"
    model = model or ("qwen3-4b" if gpu else "tiny-llama")
    check_model(model)
    return model, gpu


def ordered_contexts(contexts: list[int | str], option: str = "--ctx") -> tuple[list[int | str], str]:
    """Each context once, shortest first ('max' last), and a note to print once where the order changed.
    A repeat is refused (it would measure the same shape twice and plot it as two points)."""
    repeated = sorted({f"{c:,}" if isinstance(c, int) else c for c in contexts if contexts.count(c) > 1})
    if repeated:
        raise UsageError(f"{option} gives {', '.join(repeated)} more than once; list each length once")
    ordered = sorted(contexts, key=lambda c: (c == "max", c if isinstance(c, int) else 0))
    if ordered == list(contexts):
        return ordered, ""
    return ordered, f"{option}: measuring shortest first: " + ", ".join(f"{c:,}" if isinstance(c, int) else c
                                                                        for c in ordered)


def distinct_counts(counts: list[int | str], option: str) -> list[int | str]:
    """Each count once: a repeated batch would measure the same shape twice."""
    repeated = sorted({str(c) for c in counts if counts.count(c) > 1})
    if repeated:
        raise UsageError(f"{option} gives {', '.join(repeated)} more than once; list each size once")
    return counts


def check_memory_before_loading(model: str, batches: list[int | str], contexts: list[int | str], decode: int,
                                device: str, dtype: str, synthetic_prefill: bool = False, tp: int = 1) -> None:
    """Refuse, before the model loads or anything is measured, a batch x context whose weights, KV cache
    and workspace cannot fit the device (metrics/memory.py's estimate from the preset's or the checkpoint's
    shape). The methods' own state is added once the run knows its methods; this is the part that needs
    no model. Under `--tp` the estimate is one rank's (its share of the weights, its KV heads' cache), against
    its GPU, or against its share of the host's memory, which CPU ranks divide between them."""
    from sfibench.core.device_facts import host_available_bytes, host_memory_bytes
    from sfibench.metrics.memory import check_fits, estimate_memory, planning_bytes

    config = config_before_loading(model)
    sizes = [b for b in batches if b != "max"]
    if config is None or not sizes:
        return
    if tp > 1:
        from sfibench.core.parallel import check_divisible, rank_device

        check_divisible(config.name, config.num_kv_heads, config.num_heads, config.intermediate_size, tp)
        config = config.rank_share(tp)
    kind = device_kind(device)
    if kind == "cuda":
        from sfibench.core.device import available_device_memory, total_device_memory

        resolved = check_device(device) if tp == 1 else rank_device(check_device(device))  # this rank's GPU
        free, total = available_device_memory(resolved), total_device_memory(resolved)
    else:  # the host's memory, read without torch
        free, total = host_available_bytes() // tp, host_memory_bytes() // tp
    longest = max(config.max_context - decode if c == "max" else c for c in contexts)
    planned = planning_bytes(total or free, free)
    dtype_bytes = DTYPE_BYTES[default_dtype(kind) if dtype == "auto" else dtype]
    check_fits(estimate_memory(config, max(sizes), longest + decode + 1, dtype_bytes,  # the largest may not fit
                               synthetic_prefill=synthetic_prefill, gpu=kind == "cuda", steps=decode), planned)
