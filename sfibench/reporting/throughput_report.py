"""Throughput results as a table, plots and report.md (all rebuilt from results.json)."""

from __future__ import annotations

from rich.table import Table

from sfibench.metrics.nvml import best_energy
from sfibench.reporting.formatting import commit_label, cpu_threads, styled_table, tensor_parallel_lines
from sfibench.reporting.speedup_claims import (
    half_spread,
    noise_note,
    same_tokens_note,
    speedup_claim,
    verdict_legend,
    verdict_notes,
)
from sfibench.reporting.throughput_equal_memory import markdown_section as equal_memory_section

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
        claim = speedup_claim(r, rows)  # the one rule report.md and the plots apply too
        roof = r.get("roofline_speedup")
        out.append((
            method_label(r), r["path"], f"{r['context']:,}", str(r["batch"]), f"{r['tokens_per_s']:,.1f}",
            f"±{100 * half_spread(r):.1f}%", _ms(r, ("fast", "dense", "sparse")),
            _ms(r, ("slow",)), _floor(r, "floor ms"), _floor(r, "x floor"), f"{r['tokens_read_mean']:,.0f}",
            f"{r['achieved_gb_s']:,.0f}",
            f"{100 * r['roofline_efficiency']:.0f}%" if "roofline_efficiency" in r else "-",
            claim.cell() if claim else "-", f"{roof:.2f}x" if roof else "-",
        ))
    return out


COMPACT_COLUMNS = ("method", "path", "ctx", "batch", "tok/s", "speedup", "tokens read")
NUMERIC = ("ctx", "batch", "tok/s", "spread", "ms fast/dense", "ms slow", "floor ms", "x floor", "tokens read", "GB/s",
           "% roofline", "speedup", "roofline speedup")
# Bytes per second against a GPU's measured copy bandwidth; a CPU's caches make the same figures meaningless.
GPU_ONLY = ("GB/s", "% roofline", "roofline speedup")


def on_cpu(document: dict) -> bool:
    return document["provenance"].get("device") == "cpu"


def columns(document: dict, wide: bool = True) -> tuple[str, ...]:
    """The columns a run's table shows: on a CPU, none of the bandwidth ones (a CPU's caches make bytes per
    second against its copy bandwidth meaningless, so they read 0 or 1%)."""
    if not wide:
        return COMPACT_COLUMNS
    return tuple(c for c in COLUMNS if not (on_cpu(document) and c in GPU_ONLY))


def terminal_table(document: dict, wide: bool = False) -> Table:
    """The run's rows as `sfibench throughput` prints them when it finishes: the columns read first (tok/s
    with its spread over the passes), or with `wide` every column of report.md. `table_notes` are printed
    under it."""
    shown = columns(document, wide)
    title = f"sfibench throughput: {document['config']['model']} on {document['provenance'].get('device')}"
    table = styled_table(title, shown, NUMERIC)
    rows = document["results"]["rows"]
    for cells in table_rows(rows):
        named = dict(zip(COLUMNS, cells))
        if not wide:
            named["tok/s"] = f"{named['tok/s']} {named['spread']}"
        table.add_row(*(named[c] for c in shown))
    return table


def table_notes(document: dict) -> list[str]:
    """What the speedup cells that are not plain ratios mean, the noise warning, and on a CPU why the sparse
    methods come out slower there; each line only where the run has what it explains."""
    rows = document["results"]["rows"]
    lines = verdict_legend(claim.verdict for claim in (speedup_claim(r, rows) for r in rows) if claim)
    notes = (same_tokens_note(rows, method_label), noise_note(rows), cpu_note(document))
    return lines + [note for note in notes if note]


def cpu_note(document: dict) -> str:
    """Why a sparse method measured slower than Full-KV on a CPU is no verdict on the method, and where its
    speed shows; empty on a GPU, or where no sparse row was measured slower."""
    rows = document["results"]["rows"]
    claims = [speedup_claim(r, rows) for r in rows]
    if not on_cpu(document) or not any(c is not None and c.supported and c.ratio < 1 for c in claims):
        return ""
    return ("On a CPU's reference path a sparse method decodes slower than Full-KV: choosing positions and "
            "gathering their keys and values costs more than the reads it saves, because no step of this size "
            "is bound by memory bandwidth on a CPU. Their speed shows on a GPU's optimized path, where the step "
            "is bandwidth-bound (README's decode-speed table, docs/performance.md).")


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


def _budget_line(cfg: dict) -> str:
    """How the run set every method's budget: SFI's settings (its tokens after a refresh), or --budget."""
    sfi = cfg["sfi"]
    if cfg.get("budget") is None:
        return (f"- Budgets: StreamingLLM and SnapKV read as many tokens per layer and KV head as SFI reads "
                f"right after a refresh (n_sink {sfi['n_sink']}, k_head {sfi['k_head']}, "
                f"n_recent {sfi['n_recent']}); keys keep their original RoPE positions.")
    fixed = "" if sfi["k_head"] is None else \
        f": n_sink {sfi['n_sink']}, k_head {sfi['k_head']}, n_recent {sfi['n_recent']}"
    budget = cfg["budget"]
    spelled = f"{budget} of each context" if isinstance(budget, str) else f"{budget:,} tokens"
    return (f"- Budgets: every method reads {spelled} per layer and KV head (--budget), "
            f"SFI by its budget rule (a quarter in the recent window, the rest selected beside the "
            f"sinks{fixed}); "
            "keys keep their original RoPE positions.")


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


def _decode_lines(cfg: dict, res: dict, prov: dict, cpu: bool) -> list[str]:
    """How the steps ran: graphed or eager, where the Selector runs, which kernels the decoder used. A CPU
    run has none of the GPU machinery, so its line says only what ran."""
    if cpu:
        return [f"- Steps run eagerly, one after another on the CPU{cpu_threads(prov)}; the SFI Selector runs inside "
                "the slow step. Decoder: stacked qkv and gate_up products (torch's F.linear), no fused kernels."]
    return [
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
    ]


def _column_notes(cpu: bool) -> str:
    speedup = ("speedup against the fastest Full-KV path at the same shape, a ratio (below 1: slower) "
               "wherever the tok/s ranges over the passes do not overlap, marked `(same tokens)` where the row "
               "reads less than 5% fewer tokens than Full-KV (else `= in the noise`: no difference measured; "
               "`ref` marks the Full-KV row itself)")
    if cpu:
        return (f"tokens read = mean per (layer, KV head, sequence) per step; {speedup}; floor ms = the model's own "
                "products chained eagerly at this batch, measured in the same run, + the step's K/V bytes at the "
                "measured copy bandwidth, for the fast/dense step kind; x floor = that step's p50 / its floor.")
    return (f"tokens read = mean per (layer, KV head, sequence) per step; GB/s and % roofline from the bytes model "
            f"(weights + K/V read + appends + refresh traffic); {speedup}; roofline speedup = (W + B·KV_full) / "
            "(W + B·KV_sparse + (W + B·KV_full)/N_slow); floor ms = the weights floor (the model's own GEMMs chained "
            "in one CUDA graph at this batch, measured in the same run) + the step's K/V bytes at the copy "
            "bandwidth, for the fast/dense step kind; x floor = that step's p50 / its floor.")


def _latency_section(rows: list[dict], cpu: bool) -> list[str]:
    """Per-step latency by kind; on a GPU also peak memory and NVML energy (a CPU run measures neither)."""
    if cpu:
        lines = ["## Step latency", "", "Latency per decode step (ms) by kind over all timed passes.", "",
                 "| method | path | ctx | batch | step | n | p50 | p90 | p99 | max |", "|" + "---|" * 10]
        return lines + ["| " + " | ".join(cells[:10]) + " |" for cells in latency_energy_rows(rows)] + [""]
    lines = ["## Step latency, memory and energy", "",
             "Latency per decode step (ms) by kind over all timed passes. Peak memory: torch's peak allocation "
             "during the method's passes. Energy: NVML over the timed passes (gaps between passes included), "
             "from the driver's energy counter where it exists, else the integral of the sampled power, which "
             "lags because the driver averages power over about a second; mean W = that energy / the span.", "",
             "| method | path | ctx | batch | step | n | p50 | p90 | p99 | max | peak GiB | mean W | J/token |",
             "|" + "---|" * 13]
    return lines + ["| " + " | ".join(cells) + " |" for cells in latency_energy_rows(rows)] + [""]


def markdown(results: dict) -> str:
    cfg, res, prov = results["config"], results["results"], results["provenance"]
    rows, cpu = res["rows"], on_cpu(results)
    shown = columns(results)
    lines = [
        "# sfibench throughput", "",
        f"Model `{cfg['model']}` ({res['weights']}), dtype {res['dtype']}, device {prov.get('device')}, "
        f"torch {prov.get('torch')}" + ("" if cpu else f", triton {prov.get('triton')}")
        + f", commit {commit_label(prov)}, {prov.get('timestamp_utc')}.", "",
        f"- Decode: {cfg['steps']} teacher-forced steps of a replayed real-text token stream per pass, one "
        f"untimed warm-up pass, median of {cfg['repeats']} timed passes (spread = (max-min)/median/2)"
        + _redone_passes(rows) + ".",
        *_decode_lines(cfg, res, prov, cpu),
        *tensor_parallel_lines(res, "bytes, floors and memory are one rank's, and each floor adds the "
                                   "step's all-reduces (two a layer) at their measured time"),
        f"- Prefill: {', '.join(sorted({r['prefill'] for r in rows}))} (synthetic = random K/V written straight into "
        "the cache; speed does not depend on cache contents).",
        _budget_line(cfg),
        *_selector_variant(cfg["sfi"]),
        *_bridge_steps(cfg["sfi"]),
        *_prefill_times(rows),
        *([] if cpu else [f"- Measured copy bandwidth (read + write): {res['copy_bandwidth_gb_s']:,.0f} GB/s: the "
                          "roofline ceiling."]),
        "",
    ]
    if res.get("complete") is False:  # a stopped run keeps its finished rows
        kept = res.get("progress") or {}
        lines += [f"**Stopped early (partial)**: {kept.get('rows', len(rows))} of {kept.get('planned', '?')} "
                  "measurements (a method at a context and batch) finished; repeating the command with "
                  "`--out` this folder and `--resume` measures the rest.", ""]
    note = noise_note(rows)
    lines += [f"**{note}**", ""] if note else []
    lines += ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(dict(zip(COLUMNS, cells))[c] for c in shown) + " |" for cells in table_rows(rows)]
    lines += ["", _column_notes(cpu), ""]
    same = same_tokens_note(rows, method_label)
    verdicts = verdict_notes(rows, method_label) + ([same] if same else [])
    lines += [f"- {line[0].upper()}{line[1:]}." for line in verdicts] + ([""] if verdicts else [])
    lines += equal_memory_section(rows, method_label)
    slower_on_cpu = cpu_note(results)
    lines += [f"**{slower_on_cpu}**", ""] if slower_on_cpu else []
    lines += _latency_section(rows, cpu)
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
