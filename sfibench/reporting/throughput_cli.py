"""Glue for `sfibench throughput`: validate, run, compare, save results.json + plots + report.md."""

from __future__ import annotations

from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from sfibench.config import SFIConfig
from sfibench.engine.session import Session
from sfibench.methods import available, check_method
from sfibench.metrics.timing import measure_copy_bandwidth
from sfibench.models import fused
from sfibench.reporting.results import make_run_dir, write_results
from sfibench.reporting.throughput_report import COLUMNS, markdown, plot, table_rows
from sfibench.reporting.throughput_run import ThroughputConfig, add_comparisons, run_throughput

PREFILL_MODES = ("auto", "real", "synthetic")


def resolve_methods(methods: list[str], paths: list[str]) -> list[tuple[str, str]]:
    """Every registered (method, path) among those asked for; `name/path` pins one path.

    Unknown names are errors; a plain name runs on each of `paths` where it is registered.
    """
    registered = available()
    for path in paths:
        if path not in {p for _, p in registered}:
            raise ValueError(f"unknown path {path!r}; valid paths: reference, optimized")
    pairs = []
    for item in methods:
        name, _, pinned = item.partition("/")
        check_method(name, pinned or next((p for n, p in registered if n == name), "reference"))
        pairs += [(name, pinned)] if pinned else [(name, p) for p in paths if (name, p) in registered]
    return list(dict.fromkeys(pairs))


def dense_kernel_check(session: Session, contexts: list[int], batches: list[int]) -> list[dict]:
    """Full-KV's Triton kernel and every SDPA backend at the run's attention shapes (SPEC 6)."""
    from sfibench.optimized.bench_attention import benchmark_dense

    cfg, rows = session.loaded.config, []
    session.cache = None  # the last run's KV cache (up to ~120 GB at 128K) is not needed any more
    if session.device.type == "cuda":
        torch.cuda.empty_cache()
    for batch in sorted(set(batches)):
        for context in contexts:
            for result in benchmark_dense(batch, cfg.num_kv_heads, cfg.group_size, cfg.head_dim, context,
                                          session.dtype, session.device):
                rows.append({"batch": batch, "context": context, **result})
    return rows


def run_and_save(session: Session, contexts: list[int], batches: list, methods: list[str], paths: list[str],
                 steps: int, repeats: int, prefill: str, graphs: bool, length_bucket: int, dense_kernels: bool,
                 sfi: SFIConfig, out: Path | None, overwrite: bool, console: Console) -> Path:
    if prefill not in PREFILL_MODES:
        raise ValueError(f"unknown --prefill {prefill!r}; valid: {', '.join(PREFILL_MODES)}")
    for context in contexts:  # refuse now, not after the shorter contexts have run
        if context + steps > session.max_tokens:
            raise ValueError(f"context {context:,} + {steps} decode steps exceeds {session.loaded.config.name}'s "
                             f"limit of {session.max_tokens:,} tokens; use --ctx {session.max_tokens - steps} or less")
    pairs = resolve_methods(methods, paths)
    if not pairs:
        raise ValueError(f"no registered (method, path) among {methods} x {paths}; see `sfibench generate --help`")
    cfg = ThroughputConfig(model=session.loaded.config.name, contexts=contexts, batches=batches, methods=pairs,
                           steps=steps, repeats=repeats, prefill=prefill, graphs=graphs,
                           length_bucket=length_bucket, sfi=sfi)
    run_dir = make_run_dir(out, "throughput", overwrite=overwrite)  # refuse early, before any work
    bandwidth = measure_copy_bandwidth(session.device)
    console.print(f"copy bandwidth {bandwidth / 1e9:,.0f} GB/s on {session.device}; {len(pairs)} methods, "
                  f"contexts {contexts}, batches {batches}, {steps} steps x {repeats} repeats")

    def progress(row: dict) -> None:
        console.print(f"  {row['method']}/{row['path']} ctx {row['context']:,} B={row['batch']}: "
                      f"{row['tokens_per_s']:,.1f} tok/s")

    rows = run_throughput(session, cfg, progress)
    add_comparisons(rows, cfg, session.loaded.config, session.cache_dtype_bytes, bandwidth)
    results = {
        "rows": rows, "copy_bandwidth_gb_s": bandwidth / 1e9, "dtype": str(session.dtype).removeprefix("torch."),
        "weights": "random weights at the real shape" if session.loaded.config.source == "random" else "real weights",
        "fused_elementwise": fused.ops["rms_norm"] is not fused.rms_norm,
        "dense_kernels": dense_kernel_check(session, contexts, [r["batch"] for r in rows]) if dense_kernels else [],
    }
    path = write_results(run_dir, "throughput", cfg, results)
    from sfibench.reporting.results import read_results

    saved = read_results(path)
    plot(rows, run_dir)
    (run_dir / "report.md").write_text(markdown(saved))
    table = Table(title=f"sfibench throughput: {cfg.model} on {session.device}")
    for column in COLUMNS:
        table.add_column(column)
    for cells in table_rows(rows):
        table.add_row(*cells)
    console.print(table)
    return run_dir
