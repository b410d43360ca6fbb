"""Throughput results as a table, plots and report.md (all rebuilt from results.json)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import ScalarFormatter
from rich.table import Table

from sfibench import registry
from sfibench.metrics.nvml import best_energy
from sfibench.reporting.formatting import commit_label, styled_table
from sfibench.reporting.plot_style import context_axis, legend_below, save, yerr

COLUMNS = ("method", "path", "ctx", "batch", "tok/s", "spread", "ms fast/dense", "ms slow", "floor ms",
           "x floor", "tokens read", "GB/s", "% roofline", "speedup", "roofline speedup")


def method_label(row: dict) -> str:
    """Optimized rows of a refreshing method say how refreshes are published: sync (the Selector inside the
    slow step) or async (on a second stream)."""
    if row.get("publish") and row["path"] == "optimized":
        return f"{row['method']} {'async' if row['publish'] == 'when_ready' else 'sync'}"
    return row["method"]


def _floor(row: dict, column: str) -> str:
    """The main step kind's floor (weights floor + K/V bytes at copy bandwidth) and the step's ratio to it."""
    floors = row.get("floor_ms") or {}
    kind = next((k for k in ("fast", "dense", "sparse") if k in floors), None)
    if kind is None:
        return "-"
    if column == "floor ms":
        return f"{floors[kind]:.2f}"
    return f"{row['ms_per_step'][kind]['p50'] / floors[kind]:.2f}x"


def dense_kernel_verdicts(rows: list[dict]) -> list[tuple[int, int, dict, dict]]:
    """(batch, context, our Full-KV kernel's row, the fastest SDPA backend's row) per measured shape.

    SDPA rows run on K/V expanded per query head are left out: they read G times the bytes counted.
    """
    shapes = dict.fromkeys((r["batch"], r["context"]) for r in rows)
    verdicts = []
    for batch, context in shapes:
        here = [r for r in rows if (r["batch"], r["context"]) == (batch, context) and r.get("ran")]
        ours = next((r for r in here if r["kernel"] == "triton split-K"), None)
        sdpa = [r for r in here if r["kernel"].startswith("sdpa") and "expanded" not in r["kernel"]]
        if ours and sdpa:
            verdicts.append((batch, context, ours, max(sdpa, key=lambda r: r["gb_s"])))
    return verdicts


def _ms(row: dict, kinds: tuple[str, ...]) -> str:
    for kind in kinds:
        if kind in row["ms_per_step"]:
            return f"{row['ms_per_step'][kind]['p50']:.2f}"
    return "-"


def table_rows(rows: list[dict]) -> list[tuple[str, ...]]:
    out = []
    for r in rows:
        speedup = r.get("speedup_vs_full_kv")
        roof = r.get("roofline_speedup")
        if speedup and not r.get("speedup_supported", True):
            speedup = None  # equal tokens read, or a spread that swamps the difference: no claim
        out.append((
            method_label(r), r["path"], f"{r['context']:,}", str(r["batch"]), f"{r['tokens_per_s']:,.1f}",
            f"±{100 * r['tokens_per_s_spread']['rel_spread'] / 2:.1f}%", _ms(r, ("fast", "dense", "sparse")),
            _ms(r, ("slow",)), _floor(r, "floor ms"), _floor(r, "x floor"), f"{r['tokens_read_mean']:,.0f}",
            f"{r['achieved_gb_s']:,.0f}",
            f"{100 * r['roofline_efficiency']:.0f}%" if "roofline_efficiency" in r else "-",
            f"{speedup:.2f}x" if speedup else "-", f"{roof:.2f}x" if roof else "-",
        ))
    return out


COMPACT_COLUMNS = ("method", "path", "ctx", "batch", "tok/s", "speedup", "tokens read")
NUMERIC = ("ctx", "batch", "tok/s", "spread", "ms fast/dense", "ms slow", "floor ms", "x floor", "tokens read", "GB/s",
           "% roofline", "speedup", "roofline speedup")
# Bytes per second against a GPU's measured copy bandwidth; a CPU's caches make the same figures meaningless.
GPU_ONLY = ("GB/s", "% roofline", "roofline speedup")


def terminal_table(document: dict, wide: bool = False) -> Table:
    """The run's rows as `sfibench throughput` prints them when it finishes: the columns read first (tok/s
    with its spread over the passes), or with `wide` every column of report.md (less the bandwidth ones on
    a CPU)."""
    on_cpu = document["provenance"].get("device") == "cpu"
    columns = tuple(c for c in COLUMNS if not (on_cpu and c in GPU_ONLY)) if wide else COMPACT_COLUMNS
    title = f"sfibench throughput: {document['config']['model']} on {document['provenance'].get('device')}"
    table = styled_table(title, columns, NUMERIC)
    for cells in table_rows(document["results"]["rows"]):
        named = dict(zip(COLUMNS, cells))
        if not wide:
            named["tok/s"] = f"{named['tok/s']} {named['spread']}"
        table.add_row(*(named[c] for c in columns))
    return table


def latency_energy_rows(rows: list[dict]) -> list[tuple[str, ...]]:
    """One line per (row, step kind): latency percentiles, then the row's peak memory, power and energy."""
    out = []
    for r in rows:
        energy = r.get("energy") or {}
        joules = energy.get("joules_per_token")
        peak = r.get("peak_memory_bytes")
        total, _ = best_energy(energy)
        power = total / energy["duration_s"] if total and energy.get("duration_s") else None
        tail = (f"{peak / 2**30:.1f}" if peak else "-", f"{power:.0f}" if power else "-",
                f"{joules:.3f}" if joules else "-")
        for i, (kind, ms) in enumerate(r["ms_per_step"].items()):
            out.append((method_label(r), r["path"], f"{r['context']:,}", str(r["batch"]), kind, str(ms["n"]),
                        *(f"{ms[q]:.2f}" for q in ("p50", "p90", "p99", "max")),
                        *(tail if i == 0 else ("", "", ""))))
    return out


def speedup_range(row: dict, rows: list[dict]) -> tuple[float | None, float | None]:
    """Bounds of a row's speedup over the timed passes: its slowest pass against Full-KV's fastest, and the
    reverse (the speedup is a ratio of pass medians, so the passes' extremes bound it)."""
    full = [r for r in rows if r["method"] == registry.dense().name and (r["context"], r["batch"]) == (row["context"], row["batch"])
            and r["path"] == row.get("full_kv_reference_path", r["path"])]
    if not full:
        return None, None
    mine, theirs = row["tokens_per_s_spread"], full[0]["tokens_per_s_spread"]
    return mine["min"] / theirs["max"], mine["max"] / theirs["min"]


def plot(rows: list[dict], run_dir: Path) -> list[Path]:
    """throughput.png (tokens/s and speedup by context, bars = range over the timed passes) and
    latency.png (per-step latency percentiles by step kind at the longest context)."""
    return [_throughput_figure(rows, run_dir / "throughput.png"), _latency_figure(rows, run_dir / "latency.png")]


def _throughput_figure(rows: list[dict], path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), layout="constrained")
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        series.setdefault((method_label(r), r["path"], r["batch"]), []).append(r)
    # colour = method and path, line and marker = batch, so sixteen series stay distinguishable
    colours = {pair: f"C{i % 10}" for i, pair in enumerate(sorted({key[:2] for key in series}))}
    batches = sorted({key[2] for key in series}, key=str)
    for (method, path_name, batch), points in sorted(series.items(), key=lambda item: str(item[0])):
        points.sort(key=lambda r: r["context"])
        style = {"marker": "osD^"[batches.index(batch) % 4], "ls": ["-", "--", ":", "-."][batches.index(batch) % 4],
                 "ms": 4, "capsize": 3, "color": colours[(method, path_name)], "label": f"{method}/{path_name} B={batch}"}
        xs = [p["context"] for p in points]
        speed = [p["tokens_per_s"] for p in points]
        axes[0].errorbar(xs, speed, yerr=yerr(speed, [p["tokens_per_s_spread"]["min"] for p in points],
                                              [p["tokens_per_s_spread"]["max"] for p in points]), **style)
        if all(p.get("speedup_vs_full_kv") is not None for p in points):
            ratio = [p["speedup_vs_full_kv"] for p in points]
            low, high = zip(*(speedup_range(p, rows) for p in points))
            axes[1].errorbar(xs, ratio, yerr=yerr(ratio, list(low), list(high)), **style)
    contexts = [r["context"] for r in rows]
    for ax, (title, unit) in zip(axes, (("decode throughput", "tokens/s (log scale)"),
                                        ("speedup vs the fastest Full-KV path", "x Full-KV tokens/s"))):
        context_axis(ax, contexts)
        ax.set_title(f"{title}; bars: range over the timed passes", fontsize=9)
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].yaxis.set_major_formatter(ScalarFormatter())  # 20, not 2 x 10^1
    axes[0].yaxis.set_minor_formatter(ScalarFormatter())
    axes[1].axhline(1.0, color="grey", lw=0.8)
    legend_below(fig, axes, columns=4)
    save(fig, path)
    return path


PERCENTILES = (("p50", "C0"), ("p90", "C1"), ("p99", "C2"), ("max", "C3"))


def _latency_figure(rows: list[dict], path: Path) -> Path:
    longest = max(r["context"] for r in rows)
    chosen = [r for r in rows if r["context"] == longest]
    labels = [(r, kind) for r in chosen for kind in r["ms_per_step"]]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(labels) + 2), 4.8), layout="constrained")
    for i, (r, kind) in enumerate(labels):
        stats = r["ms_per_step"][kind]
        ax.plot([i, i], [stats["p50"], stats["max"]], color="grey", lw=1)
        for name, color in PERCENTILES:
            ax.scatter([i], [stats[name]], color=color, s=18, zorder=3, label=name)
    ax.set_xticks(range(len(labels)), [f"{method_label(r)}/{r['path']}\nB={r['batch']} {kind} (n={r['ms_per_step'][kind]['n']})"
                                       for r, kind in labels], fontsize=7, rotation=30, ha="right")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())  # 4, 6, 10: not 4 x 10^0
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.set_ylabel("ms per decode step (log scale)")
    ax.set_title(f"step latency by kind at {longest:,} tokens: spread over every timed step", fontsize=9)
    ax.grid(alpha=0.3)
    legend_below(fig, [ax], columns=4)
    save(fig, path)
    return path


def _selector_variant(sfi: dict) -> list[str]:
    """A line naming the Selector's settings where they are not SPEC's (a step-time ablation)."""
    selector = sfi.get("selector", {})
    changed = [f"{name}={selector[name]}" for name, spec in (("use_nms", True), ("keep_neighbours", 1))
               if selector.get(name, spec) != spec]
    if not changed:
        return []
    return [f"- **SFI ablation beyond the paper**: the Selector runs with {', '.join(changed)} (SPEC 5: Soft-NMS "
            "on, no neighbour pool); the other methods are unchanged."]


def _bridge_steps(sfi: dict) -> list[str]:
    """A line saying SFI read densely for its first steps (the authors' bridge), timed as their own kind."""
    steps = sfi.get("bridge_steps", 0)
    if not steps:
        return []
    return [f"- **SFI bridge steps**: the first {steps} decode steps of every pass read the whole history before "
            "the bootstrap selection is used; the latency table times them as their own step kind, `bridge`."]


def _redone_passes(rows: list[dict]) -> str:
    """A timed pass that had to capture a CUDA graph is run again (runners/throughput_measure.py): say where."""
    redone = [f"{r['method']}{' ' + r['publish'] if r.get('publish') else ''}/{r['path']} {r['context']:,} "
              f"B={r['batch']}: {r['graphs']['timed_passes_redone']}"
              for r in rows if r.get("graphs", {}).get("timed_passes_redone")]
    if not redone:
        return ""
    return "; timed passes run again because they had to capture a graph (a capture is not decoding): " + \
        ", ".join(redone)


def _prefill_times(rows: list[dict]) -> list[str]:
    """One bullet with the prefill wall time of each (context, batch), or nothing for older results."""
    shapes = {(r["context"], r["batch"]): r for r in rows if r.get("prefill_seconds") is not None}
    if not shapes:
        return []
    times = ", ".join(f"{c:,} x {b} {r['prefill']} {r['prefill_seconds']:.2f} s" for (c, b), r in shapes.items())
    return [f"- Prefill wall time per context x batch (excluded from decode throughput): {times}. The first "
            "also pays one-time start-up (kernel compilation, library initialisation)."]


def markdown(results: dict) -> str:
    cfg, res, prov = results["config"], results["results"], results["provenance"]
    rows = res["rows"]
    lines = [
        "# sfibench throughput", "",
        f"Model `{cfg['model']}` ({res['weights']}), dtype {res['dtype']}, device {prov.get('device')}, "
        f"torch {prov.get('torch')}, triton {prov.get('triton')}, commit {commit_label(prov)}, "
        f"{prov.get('timestamp_utc')}.", "",
        f"- Decode: {cfg['steps']} teacher-forced steps of a replayed real-text token stream per pass, one "
        f"untimed warm-up pass, median of {cfg['repeats']} timed passes (spread = (max-min)/median/2)"
        + _redone_passes(rows) + ".",
        f"- CUDA graphs: {'yes' if cfg['graphs'] else 'no (eager)'}; graphed steps read up to the next multiple of "
        f"{cfg['length_bucket']} slots with a mask (at most {cfg['length_bucket'] - 1} wasted slots per layer and KV "
        "head; the optimized kernels read every length on the device and waste none). A step mixing slow and fast "
        "rows is one replay: a slow row is a dense row of the same step. The SFI Selector runs after the step: on "
        "the main stream for `sfi` (reference) and `sfi sync` (counted in the slow step), on a second CUDA stream "
        "for `sfi async` (its selection is used once published). Decoder: stacked qkv and gate_up GEMMs; fused "
        f"kernels (compiled RMSNorm/SwiGLU, Triton q/k norm + RoPE and KV append): "
        f"{'yes' if res.get('fused_elementwise') else 'no'}"
        + (f"; decode GEMVs: {res['decode_gemv']}" if res.get("decode_gemv") else "")
        + (f"; programmatic dependent launch of the Triton decode kernels: {res['pdl']}" if res.get("pdl") else "")
        + (f"; one loop in the two-segment split that straddles compact rows and tail: {res['straddle_one_loop']}"
           if res.get("straddle_one_loop") else "")
        + (f"; long fast-read splits (B > 1): {res['long_splits']}" if res.get("long_splits") else "") + ".",
        f"- Prefill: {', '.join(sorted({r['prefill'] for r in rows}))} (synthetic = random K/V written straight into "
        "the cache; speed does not depend on cache contents).",
        f"- Budgets: StreamingLLM and SnapKV read as many tokens per layer and KV head as SFI reads right after a "
        f"refresh (n_sink {cfg['sfi']['n_sink']}, k_head {cfg['sfi']['k_head']}, n_recent {cfg['sfi']['n_recent']}); "
        "keys keep their original RoPE positions.",
        *_selector_variant(cfg["sfi"]),
        *_bridge_steps(cfg["sfi"]),
        *_prefill_times(rows),
        f"- Measured copy bandwidth (read + write): {res['copy_bandwidth_gb_s']:,.0f} GB/s: the roofline ceiling.", "",
        "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(rows)]
    lines += ["", "tokens read = mean per (layer, KV head, sequence) per step; GB/s and % roofline from the bytes "
              "model (weights + K/V read + appends + refresh traffic); speedup against the fastest Full-KV path at "
              "the same shape, shown only where the row reads at least 5% fewer tokens than Full-KV and the tok/s "
              "ranges over the passes do not overlap; roofline speedup = (W + B·KV_full) / (W + B·KV_sparse + "
              "(W + B·KV_full)/N_slow); floor ms = the weights floor (the model's own GEMMs chained in one CUDA graph "
              "at this batch, measured in the same run) + the step's K/V bytes at the copy bandwidth, for the "
              "fast/dense step kind; x floor = that step's p50 / its floor.", ""]
    lines += ["## Step latency, memory and energy", "",
              "Latency per decode step (ms) by kind over all timed passes. Peak memory: torch's peak allocation "
              "during the method's passes. Energy: NVML over the timed passes (gaps between passes included), "
              "from the driver's energy counter where it exists, else the integral of the sampled power, which "
              "lags because the driver averages power over about a second; mean W = that energy / the span.", "",
              "| method | path | ctx | batch | step | n | p50 | p90 | p99 | max | peak GiB | mean W | J/token |",
              "|" + "---|" * 13]
    lines += ["| " + " | ".join(cells) + " |" for cells in latency_energy_rows(rows)]
    lines.append("")
    if res.get("dense_kernels"):
        lines += ["## Full-KV attention against PyTorch's SDPA backends", "",
                  "One layer's decode attention at the run's shapes (random q/K/V, bf16, L2 cleared before each "
                  "call, CUDA-graph replays), all kernels timed in interleaved rounds; ms = median of the rounds' "
                  "medians.", "",
                  "| batch | ctx | Full-KV kernel (Triton split-K) GB/s | best SDPA backend GB/s | ratio |",
                  "|---|---|---|---|---|"]
        for batch, context, ours, best in dense_kernel_verdicts(res["dense_kernels"]):
            lines.append(f"| {batch} | {context:,} | {ours['gb_s']:,.0f} | {best['gb_s']:,.0f} ({best['kernel']}) | "
                         f"{ours['gb_s'] / best['gb_s']:.3f} |")
        lines += ["", "| batch | ctx | kernel | ms | round medians (ms) | GB/s |", "|---|---|---|---|---|---|"]
        for k in res["dense_kernels"]:
            if k.get("ran"):
                spread = ", ".join(f"{m:.4f}" for m in k.get("round_medians", []))
                value = f"{k['ms_median']:.4f} | {spread} | {k['gb_s']:,.0f}"
            else:
                value = f"- | - | {k.get('error', 'n/a')[:60]}"
            lines.append(f"| {k['batch']} | {k['context']:,} | {k['kernel']} | {value} |")
        lines.append("")
    lines += ["![throughput](throughput.png)", "", "![latency](latency.png)", ""]
    return "\n".join(lines)
