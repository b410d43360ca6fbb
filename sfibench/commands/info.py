"""`sfibench env` and `sfibench models`: what this machine is, and what can run on it."""

from __future__ import annotations

import typer
from rich.table import Table

from sfibench.commands.common import DEVICE_HELP, console, user_errors
from sfibench.options import check_device
from sfibench.reporting.formatting import styled_table


def env(device: str = typer.Option("auto", help=DEVICE_HELP)):
    """What this machine is: device, library versions, and on a GPU the measured copy bandwidth."""
    with user_errors():
        resolved = check_device(device)
    console.print(env_table(resolved))


def env_table(resolved) -> Table:
    """Key and value per line: provenance, the device's facts, and on a GPU its measured copy bandwidth."""
    import torch

    from sfibench.core.device import device_info
    from sfibench.core.provenance import provenance
    from sfibench.metrics.timing import measure_copy_bandwidth

    table = styled_table("sfibench env", ("key", "value"))
    table.show_header = False
    for key, value in {**provenance(), **device_info(resolved)}.items():
        table.add_row(key, str(value))
    if resolved.type == "cuda":
        bandwidth = measure_copy_bandwidth(resolved)
        table.add_row("copy bandwidth (read+write)", f"{bandwidth / 1e9:,.0f} GB/s")
    table.add_row("cuda available", str(torch.cuda.is_available()))
    return table


def models(wide: bool = typer.Option(False, "--wide", help="print all columns (default: what fits 80 columns)")):
    """Model presets, whether their weights are here, and their KV-cache bytes per token."""
    table, missing = models_table(wide)
    console.print(table)
    for name, install in missing:  # the whole command, which no table cell could hold at 80 columns
        console.print(f"{name} weights: {install}", highlight=False, soft_wrap=True)
    console.print("Any Hugging Face checkpoint directory (Llama, Qwen2, Qwen3) or .gguf path also works as --model.")


def models_table(wide: bool = False) -> tuple[Table, list[tuple[str, str]]]:
    """One row per preset (`wide`: with its layers, heads and weights file), and (name, install command) for
    each preset whose real weights are not installed."""
    from sfibench.models.loading import GEMMA3_INSTALL, SMOLLM2_INSTALL, MissingWeightsError, installed_weights
    from sfibench.models.presets import PRESETS

    columns = ("name", "arch", "layers", "heads q/kv", "head dim", "context", "params", "KV/token (bf16)", "weights")
    table = styled_table("sfibench models", columns if wide else ("name", "arch", "context", "params",
                                                                  "KV/token (bf16)", "weights"),
                         right=("layers", "head dim", "context", "params", "KV/token (bf16)"))
    missing = []
    for cfg in PRESETS.values():
        weights, detail = "random", "random (seeded)"
        if cfg.source == "gguf":
            try:
                weights, detail = "real", f"real ({installed_weights(cfg.name)})"
            except MissingWeightsError:
                weights, detail = "[red]missing[/]", "[red]missing[/]"
                missing.append((cfg.name, {"smollm2-135m": SMOLLM2_INSTALL, "gemma3-270m": GEMMA3_INSTALL}[cfg.name]))
        shape = (str(cfg.num_layers), f"{cfg.num_heads}/{cfg.num_kv_heads}", str(cfg.head_dim)) if wide else ()
        table.add_row(cfg.name, cfg.arch, *shape, f"{cfg.max_context:,}", f"{cfg.num_params() / 1e6:,.0f}M",
                      f"{cfg.kv_bytes_per_token():,} B", detail if wide else weights)
    return table, missing
