"""A request-mode throughput run (--prompt-len, --gen-len) as a table, report.md and requests.png, rebuilt
from results.json: per method and batch what a serving user measures of a request of P prompt tokens and G
generated tokens."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.table import Table

from sfibench.reporting.formatting import commit_label, number, percent, styled_table
from sfibench.reporting.plot_style import context_label, legend_below, save
from sfibench.reporting.throughput_report import method_label

GIB = 1024**3
COLUMNS = ("method", "path", "prompt", "gen", "batch", "TTFT s", "TPOT p50 ms", "p99 ms", "max ms", "e2e s",
           "out tok/s", "slow /1k tok", "slow time", "peak GiB", "estimate GiB")
COMPACT = ("method", "prompt", "batch", "TTFT s", "TPOT p50 ms", "p99 ms", "out tok/s", "slow /1k tok")
NUMERIC = COLUMNS[2:]
PLOT = "requests.png"
SMOOTHING = 32  # steps per point of the plotted line (a running median; slow steps are drawn as dots besides)


def is_request_run(document: dict) -> bool:
    return bool(document["config"].get("requests"))


def table_rows(rows: list[dict]) -> list[tuple[str, ...]]:
    out = []
    for r in rows:
        tpot = r["tpot_ms"]
        estimate = (r.get("memory_estimate") or {}).get("total")
        peak = r.get("peak_memory_bytes")
        out.append((method_label(r), r["path"], context_label(r["context"]), context_label(r["gen_len"]),
                    str(r["batch"]), number(r["ttft_s"], 3), number(tpot["p50"], 2), number(tpot["p99"], 2),
                    number(tpot["max"], 2), number(r["e2e_s"], 2), number(r["tokens_per_s"], 1),
                    number(r["slow_per_1k_tokens"], 1), percent(r["slow_time_share"]),
                    "n/a" if peak is None else number(peak / GIB, 2),
                    "n/a" if estimate is None else number(estimate / GIB, 2)))
    return out


def terminal_table(document: dict, wide: bool = False) -> Table:
    shown = COLUMNS if wide else COMPACT
    title = (f"sfibench throughput, requests: {document['config']['model']} on "
             f"{document['provenance'].get('device')}")
    table = styled_table(title, shown, NUMERIC)
    for cells in table_rows(document["results"]["rows"]):
        named = dict(zip(COLUMNS, cells))
        table.add_row(*(named[c] for c in shown))
    return table


README = ("method", "path", "prompt", "gen", "batch", "TTFT s", "TPOT p50 ms", "p99 ms", "e2e s", "out tok/s",
          "slow /1k tok")


def readme_table(link: str, document: dict) -> tuple[str, list[str]]:
    """A results block's conditions and table for a request run (reporting/readme_tables.py)."""
    cfg, results = document["config"], document["results"]
    conditions = (f"{cfg['model']} ({results['weights']}), {results['dtype']}, requests of "
                  f"{', '.join(context_label(c) for c in cfg['contexts'])} prompt tokens + "
                  f"{context_label(cfg['gen_len'])} generated, {cfg['repeats']} timed pass(es), SFI's "
                  f"triggers driven by {_texts(results['rows'])}")
    lines = [f"![step time by position]({link}/{PLOT})", "",
             "| " + " | ".join(README) + " |", "|" + " --- |" * len(README)]
    for cells in table_rows(results["rows"]):
        named = dict(zip(COLUMNS, cells))
        lines.append("| " + " | ".join(named[c] for c in README) + " |")
    return conditions, lines


def table_notes(document: dict) -> list[str]:
    return [text_line(document)] + [line for line in caveats(document["results"]["rows"]) if line]


def _texts(rows: list[dict]) -> str:
    return ", ".join(sorted({r["text"] for r in rows}))


def text_line(document: dict) -> str:
    return f"Decode inputs, and so what drove SFI's triggers: {_texts(document['results']['rows'])}."


def caveats(rows: list[dict]) -> list[str]:
    """What a reader must know to trust a row: graphs captured inside a timed pass, timed passes whose tokens
    differ (the numbers then describe different texts), where the peak memory passed its estimate."""
    captured = [r for r in rows if r["graphs"]["timed_captures"]]
    differing = [r for r in rows if not r["passes_agree"]]
    over = [r for r in rows if r.get("peak_memory_bytes") and r["peak_memory_bytes"]
            > (r.get("memory_estimate") or {}).get("total", float("inf"))]

    def names(chosen):
        return ", ".join(f"{method_label(r)}/{r['path']} P={r['context']:,} B={r['batch']}" for r in chosen)

    return [
        f"Graphs captured inside timed passes (a capture's time is in those steps): {names(captured)}."
        if captured else "",
        f"The timed passes wrote different tokens in: {names(differing)}." if differing else "",
        f"Peak memory above the estimate: {names(over)}." if over else "",
    ]


CLOCKS = ("- Clocks: the host's, one per request; each token is copied to the host as it is chosen, as "
          "a streaming client receives it. TTFT = the prefill + the method's start on the prompt + the first "
          "token. TPOT = the time from one token on the host to the next, over every step of every timed "
          "pass (p50 / p99 / max). End-to-end = the same clock when the request is done: TTFT + the sum of "
          "the steps + the host's bookkeeping after the last token")
COLUMN_NOTES = ("- Output tok/s = batch x generated tokens / end-to-end seconds. Slow /1k tok = refreshing "
                "(slow) rows per 1,000 generated tokens of a sequence; slow time = the share of the decode "
                "time in batch steps where any row refreshed. Peak: torch's peak allocation over the "
                "method's requests (graphs included), beside the memory estimate the run planned with for a "
                "cache of prompt + generation.")


def _request_line(cfg: dict, rows: list[dict]) -> str:
    prefills = "/".join(sorted({r["prefill"] for r in rows}))
    graphs = (f"on (reads sized to multiples of {cfg['length_bucket']} slots, one graph per size and step "
              "kind, captured in an untimed warm-up request)" if cfg["graphs"]
              else "off (an untimed warm-up request first)")
    return (f"- Each request: a {prefills} prefill of its prompt (timed once per prompt length and batch, "
            "after a short warm-up prefill), the first token from the prefill's logits, then "
            f"{cfg['gen_len'] - 1:,} decode steps with the cache growing to prompt + {cfg['gen_len']:,} "
            f"tokens; CUDA graphs {graphs}; {cfg['repeats']} timed request pass(es), medians over them.")


def markdown(document: dict) -> str:
    cfg, res, prov = document["config"], document["results"], document["provenance"]
    rows = res["rows"]
    prompts = ", ".join(f"{c:,}" for c in cfg["contexts"])
    unmarked = max(r["unmarked_s"] for r in rows) * 1e3
    lines = [
        f"# sfibench throughput: requests of {prompts} prompt tokens and {cfg['gen_len']:,} generated tokens",
        "",
        f"Model `{cfg['model']}` ({res['weights']}), dtype {res['dtype']}, device {prov.get('device')}, "
        f"torch {prov.get('torch')}, commit {commit_label(prov)}, {prov.get('timestamp_utc')}.", "",
        f"- {text_line(document)}",
        _request_line(cfg, rows),
        f"{CLOCKS} (at most {unmarked:.3f} ms here).",
        COLUMN_NOTES,
        "",
    ]
    if res.get("complete") is False:
        kept = res.get("progress") or {}
        lines += [f"**Stopped early (partial)**: {kept.get('rows', len(rows))} of {kept.get('planned', '?')} "
                  "measurements finished; repeating the command with `--out` this folder and `--resume` "
                  "measures the rest.", ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(rows)]
    lines += ["", *(f"**{line}**" for line in caveats(rows) if line)]
    lines += ["", f"![step time by position]({PLOT})", ""]
    return "\n".join(lines)


def _running_median(values: list[float], width: int) -> list[float]:
    import numpy as np

    if len(values) <= width:
        return list(values)
    windows = np.lib.stride_tricks.sliding_window_view(np.asarray(values), width)
    return list(np.median(windows, axis=1))


def plot(rows: list[dict], path: Path) -> Path:
    """Step time against position in the generation, one panel per (prompt length, batch), one line per method
    (a running median) with its slow steps as dots."""
    shapes = sorted({(r["context"], r["batch"]) for r in rows})
    fig, axes = plt.subplots(len(shapes), 1, figsize=(10, 3.4 * len(shapes)), layout="constrained",
                             squeeze=False)
    labels = sorted({(method_label(r), r["path"]) for r in rows})
    colours = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    for ax, (context, batch) in zip(axes[:, 0], shapes):
        chosen = [r for r in rows if (r["context"], r["batch"]) == (context, batch)]
        # a short generation is smoothed less, so its line still spans it
        width = max(1, min(SMOOTHING, min(len(r["step_ms"]) for r in chosen) // 8))
        for r in chosen:
            label = (method_label(r), r["path"])
            steps = r["step_ms"]
            smooth = _running_median(steps, width)
            first = 1 + (width - 1) / 2  # each point at the middle of its window (step 1 is position 1)
            ax.plot([first + i for i in range(len(smooth))], smooth, color=colours[label], lw=1.2,
                    label=f"{label[0]}/{label[1]}")
            slow = r["slow_positions"]
            if slow:
                ax.scatter(slow, [steps[i - 1] for i in slow], color=colours[label], s=6, alpha=0.6)
        ax.set_title(f"prompt {context_label(context)}, batch {batch}: ms per step (line: running median of "
                     f"{width} steps; dots: slow steps)", fontsize=9)
        ax.set_ylabel("ms per step")
        ax.set_xlabel("position in the generation (tokens after the first)")
        ax.grid(alpha=0.3)
    legend_below(fig, list(axes[:, 0]), columns=4)
    save(fig, path)
    return path
