"""`sfibench env` and `sfibench models`: what this machine is, and what can run on it."""

from __future__ import annotations

import typer
from rich.table import Table

from sfibench.commands.common import DEVICE_HELP, console, user_errors
from sfibench.options import check_device


def env(device: str = typer.Option("auto", help=DEVICE_HELP)):
    """What this machine is: device, library versions, and on a GPU the measured copy bandwidth."""
    import torch

    from sfibench.core.device import device_info
    from sfibench.core.provenance import provenance
    from sfibench.metrics.timing import measure_copy_bandwidth

    with user_errors():
        resolved = check_device(device)
    table = Table(title="sfibench env", show_header=False)
    for key, value in {**provenance(), **device_info(resolved)}.items():
        table.add_row(key, str(value))
    if resolved.type == "cuda":
        bandwidth = measure_copy_bandwidth(resolved)
        table.add_row("copy bandwidth (read+write)", f"{bandwidth / 1e9:,.0f} GB/s")
    table.add_row("cuda available", str(torch.cuda.is_available()))
    console.print(table)


def models():
    """Model presets, whether their weights are here, and their KV-cache bytes per token."""
    from sfibench.models.loading import GEMMA3_INSTALL, GGUF_FINDERS, SMOLLM2_INSTALL, MissingWeightsError
    from sfibench.models.presets import PRESETS

    table = Table(title="sfibench models")
    for column in ("name", "arch", "layers", "heads q/kv", "head dim", "context", "params", "KV/token (bf16)",
                   "weights"):
        table.add_column(column)
    for cfg in PRESETS.values():
        if cfg.source == "gguf":
            try:
                weights = f"real ({GGUF_FINDERS[cfg.name]().name})"
            except MissingWeightsError:
                install = {"smollm2-135m": SMOLLM2_INSTALL, "gemma3-270m": GEMMA3_INSTALL}[cfg.name]
                weights = f"[red]missing[/]: {install}"
        else:
            weights = "random (seeded)"
        table.add_row(cfg.name, cfg.arch, str(cfg.num_layers), f"{cfg.num_heads}/{cfg.num_kv_heads}",
                      str(cfg.head_dim), f"{cfg.max_context:,}", f"{cfg.num_params() / 1e6:,.0f}M",
                      f"{cfg.kv_bytes_per_token():,} B", weights)
    console.print(table)
    console.print("Any Hugging Face checkpoint directory (Llama, Qwen2, Qwen3) or .gguf path also works as --model.")
