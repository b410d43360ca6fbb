"""`sfibench quality`: generate the offline tasks, run every method on them, write the report.

Everything a user can get wrong (unknown task or method, a retention outside (0, 1], a context the
model cannot hold, a LongBench path that is missing or malformed) is checked before the model loads
where possible, and always before the run directory is created, so a bad command leaves nothing
behind. results.json is rewritten after every (context, task) so a long run that is stopped keeps
what it finished.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sfibench.config import BudgetError
from sfibench.engine.session import Session
from sfibench.methods import check_method
from sfibench.metrics.longbench import DATASETS
from sfibench.models.presets import PRESETS
from sfibench.reporting.quality_plots import plot_all
from sfibench.reporting.quality_run import conditions, evaluate_batch
from sfibench.reporting.quality_summary import markdown, summarise
from sfibench.reporting.results import make_run_dir, provenance, read_results, write_results
from sfibench.workloads.base import ContextSizeError, PromptFormat, get_task, make_samples
from sfibench.workloads.longbench import (
    PREFIX,
    dataset_name,
    load_records,
    longbench_files,
    longbench_samples,
)

DEFAULT_METHODS = ("full_kv", "sfi", "streaming_llm", "snapkv")
DEFAULT_TASKS = ("niah_single", "niah_multiturn", "ppl")
DEFAULT_CONTEXTS = ("2k",)
DEFAULT_RETENTIONS = (0.15, 0.5)  # the paper: SFI matches Full-KV at 15-20%, eviction needs ~50%
DEFAULT_SAMPLES = (4,)
MAX_MARGIN = 8  # tokens kept free below the model's limit by --ctx max, beyond the decode budget
SAME_ON_RESUME = ("model", "methods", "tasks", "contexts", "retentions", "samples", "seed", "chat", "dtype",
                  "sfi_variant")


def parse_retentions(values) -> list[float]:
    out = []
    for value in values:
        r = float(value)
        if not 0 < r <= 1:
            raise BudgetError(f"retention {value} is outside (0, 1]; give fractions of the context such as 0.15")
        out.append(r)
    return out


def parse_context(text: str) -> int | str:
    """'2k' -> 2048, '3000' -> 3000, 'max' -> 'max' (the largest prompt the model can hold)."""
    text = str(text).strip().lower()
    if text == "max":
        return "max"
    try:
        tokens = int(float(text[:-1]) * 1024) if text.endswith("k") else int(text)
    except ValueError:
        raise ContextSizeError(f"context {text!r} is not a token count like 2048, 2k or max") from None
    if tokens <= 0:
        raise ContextSizeError(f"context must be positive, got {text}")
    return tokens


def _check_fits(context: int, reserve: int, limit: int, model: str) -> None:
    if context + reserve > limit:
        raise ContextSizeError(f"a {context}-token context plus {reserve} decode tokens exceeds {model}'s limit of "
                               f"{limit} tokens; the largest context that fits is {limit - reserve} (or use --ctx max)")


def run_quality(model: str = "smollm2-135m", methods=DEFAULT_METHODS, tasks=DEFAULT_TASKS,
                contexts=DEFAULT_CONTEXTS, retentions=DEFAULT_RETENTIONS, samples=DEFAULT_SAMPLES,
                out: Path | str | None = None, overwrite: bool = False, device: str = "auto", dtype: str = "auto",
                seed: int = 0, batch: int = 4, chat: bool = True, longbench: Path | str | None = None,
                console: Console | None = None, resume: bool = False, sfi_variant: dict | None = None) -> Path:
    """Run the quality benchmark and return the run directory (results.json, plots, report.md).

    `resume` continues a stopped run in `out` with the same settings: every (task, context) its
    results.json already holds is kept, and only the missing ones run. `sfi_variant` changes SFI
    settings for an ablation run (see quality_run.apply_sfi_variant), e.g. {"use_nms": False}.
    """
    console = console or Console(stderr=True)
    started = time.time()
    retentions = parse_retentions(retentions)
    for method in methods:
        check_method(method, "reference")
    methods = ["full_kv"] + [m for m in methods if m != "full_kv"]
    tasks = list(tasks)
    for task in tasks:
        get_task(task)
    files = longbench_files(longbench) if longbench else []
    for file in files:
        load_records(file)  # malformed files fail now, not after the model has loaded
    tasks += [PREFIX + f.stem for f in files]
    if not tasks:
        raise ValueError("no tasks to run; give --tasks or --longbench")
    contexts = [parse_context(c) for c in contexts]
    samples = [int(s) for s in samples]
    if len(samples) not in (1, len(contexts)) or min(samples) < 1:
        raise ValueError(f"--samples takes one count or one per context ({len(contexts)}), each >= 1")
    samples = samples * len(contexts) if len(samples) == 1 else samples
    if model in PRESETS:  # cheap check before spending time on loading weights
        for context in contexts:
            if context != "max":
                _check_fits(context, 1, PRESETS[model].max_context, model)
    if batch < 1:
        raise ValueError("--batch must be >= 1")

    session = Session.open(model, device, dtype, seed)
    limit, fmt = session.max_tokens, PromptFormat(session.loaded.tokenizer, chat)
    probe = min(1024, limit // 2)  # decode budgets do not depend on the context length
    reserve = max([make_samples(t, fmt, probe, 1, seed)[0].decode_budget for t in tasks if not t.startswith(PREFIX)]
                  + [DATASETS[dataset_name(f)][1] for f in files])
    contexts = [limit - reserve - MAX_MARGIN if c == "max" else c for c in contexts]
    sfi_variant = sfi_variant or None  # recorded as null when SFI runs as specified
    plan = {c: conditions(methods, retentions, c, sfi_variant) for c in contexts}  # validates every budget
    for context in contexts:
        _check_fits(context, reserve, limit, session.loaded.config.name)

    config = {"model": session.loaded.config.name, "methods": methods, "tasks": tasks, "contexts": contexts,
              "retentions": retentions, "samples": samples, "seed": seed, "batch": batch, "chat": chat,
              "device": str(session.device), "dtype": str(session.dtype).replace("torch.", ""),
              "threads": torch.get_num_threads(), "longbench": str(longbench) if longbench else None,
              "sfi_variant": sfi_variant}
    info = provenance()
    records: list[dict] = []
    timings: dict[str, float] = {}
    if resume and out is not None and (Path(out) / "results.json").exists():
        run_dir, earlier = Path(out), read_results(out)
        changed = [k for k in SAME_ON_RESUME if earlier["config"].get(k) != config[k]]
        if changed:
            raise ValueError(f"--resume: {run_dir} was run with different {', '.join(changed)}; "
                             "repeat its settings or choose another --out")
        records, timings = earlier["samples"], earlier["results"]["seconds_by_task"]
        started -= earlier["results"]["wall_s"]  # wall time counts every session of the run
        info["resumed_from"] = [*earlier["provenance"].pop("resumed_from", []), earlier["provenance"]]
    else:
        run_dir = make_run_dir(out, "quality", overwrite)
    total = sum(-(-n // batch) * len(plan[c]) for c, n in zip(contexts, samples)) * len(tasks)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("quality", total=total)
        for context, count in zip(contexts, samples):
            for task in tasks:
                if f"{task}@{context}" in timings:  # finished by the run being resumed
                    progress.advance(bar, -(-count // batch) * len(plan[context]))
                    continue
                began = time.time()
                progress.update(bar, description=f"{task} @ {context}: generating")
                if task.startswith(PREFIX):
                    file = next(f for f in files if PREFIX + f.stem == task)
                    batch_samples = longbench_samples(fmt, file, context, count, seed)
                else:
                    batch_samples = make_samples(task, fmt, context, count, seed)
                for start in range(0, len(batch_samples), batch):
                    chunk = batch_samples[start:start + batch]

                    def on_decode(label, task=task, context=context, start=start):
                        if not label.endswith("(free)"):
                            progress.advance(bar)
                        progress.update(bar, description=f"{task} @ {context} #{start}: {label}")

                    for record in evaluate_batch(session, chunk, plan[context], on_decode=on_decode):
                        records.append({**record, "context": context})
                    if not console.is_terminal:  # a log file gets no live bar: one line per batch instead
                        console.print(f"{time.strftime('%H:%M:%S')} {task} @ {context}: "
                                      f"{start + len(chunk)}/{len(batch_samples)} samples", highlight=False)
                timings[f"{task}@{context}"] = time.time() - began
                _write(run_dir, config, records, timings, started, info)
    _write(run_dir, config, records, timings, started, info)
    write_report(run_dir)
    return run_dir


def write_report(run_dir: Path | str) -> Path:
    """(Re)draw the plots and report.md of a quality run from its results.json alone."""
    run_dir = Path(run_dir)
    document = read_results(run_dir)
    plots = [p.name for p in plot_all(document["results"]["cells"], run_dir)]
    report = run_dir / "report.md"
    report.write_text(markdown(document, plots), encoding="utf-8")
    return report


def _write(run_dir: Path, config: dict, records: list[dict], timings: dict, started: float, info: dict) -> None:
    results = {"cells": summarise(records), "wall_s": time.time() - started, "seconds_by_task": timings}
    write_results(run_dir, "quality", config, results, extra={"samples": records}, provenance_info=info)


def results_table(cells: list[dict]) -> Table:
    """The terminal summary: one row per cell."""
    table = Table(title="sfibench quality")
    for column in ("task", "context", "method", "retention", "read", "accuracy [95% CI]", "KL", "top-1", "ppl"):
        table.add_column(column)
    for c in cells:
        acc = "–" if c["accuracy"] is None else f"{c['accuracy']:.2f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}]"
        table.add_row(c["task"], str(c["context"]), c["method"], "1" if c["retention"] is None else f"{c['retention']:g}",
                      f"{c['measured_retention']:.3f}", acc, f"{c['kl']:.3f}", f"{c['top1_agreement']:.2f}",
                      "–" if c["perplexity"] is None else f"{c['perplexity']:.2f}")
    return table
