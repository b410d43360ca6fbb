"""`sfibench quality` run: generate the offline tasks, run every method on them, write and render.

Inputs are checked before the model loads (quality_inputs.py) and the run directory before that
(run_dir.py), so a bad command costs nothing and leaves nothing behind. Results are saved after
every condition of every batch (quality_ledger.py); Ctrl-C saves, renders the report of what is
done, and says how to continue with --resume, which picks up from the first missing sample.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sfibench import registry
from sfibench.core.device import resolve_device, torch_threads
from sfibench.core.errors import RunInterrupted
from sfibench.core.parallel import TensorParallel, rank_device, ranks
from sfibench.core.provenance import provenance
from sfibench.engine.session import Session
from sfibench.metrics.longbench import DATASETS
from sfibench.reporting.report_run import render
from sfibench.reporting.results import read_results
from sfibench.reporting.run_dir import claimed_run_dir
from sfibench.runners.quality_batch import BatchTimes, KeptDrivers, conditions, evaluate_batch
from sfibench.runners.quality_inputs import (
    SAME_ON_RESUME,
    QualityRun,
    check_distinct,
    check_fits,
    check_resume,
    largest_context,
)
from sfibench.runners.quality_ledger import QualityLedger
from sfibench.workloads.base import PromptFormat
from sfibench.workloads.longbench import PREFIX, dataset_name, longbench_samples
from sfibench.workloads.tasks import is_ruler_task, make_samples


def run_quality(run: QualityRun, console: Console | None = None) -> Path | None:
    """Run the quality benchmark and return the run directory (results.json, plots, report.md).

    `run.resume` continues a stopped run in `run.out` with the same settings: every record its
    results.json holds is kept, and only the missing ones run. Ctrl-C raises RunInterrupted once what
    is done is saved and rendered. Under tensor parallelism every rank decodes every condition (their
    collectives keep them in step) and rank 0 alone claims, writes and returns the directory; the other
    ranks keep their records in memory only and return None.
    """
    started = time.time()
    console = console or Console(stderr=True)
    with ranks(rank_device(resolve_device(run.device))) as parallel, torch_threads(run.threads):
        if not parallel.is_main:
            earlier = read_results(Path(run.out)) if run.resume else None  # rank 0 checked it is there
            _evaluate(run, None, earlier, parallel, started, Console(quiet=True))
            return None
        with claimed_run_dir(run.out, "quality", overwrite=run.overwrite, resume=run.resume) as run_dir:
            _evaluate(run, run_dir, read_results(run_dir) if run.resume else None, parallel, started, console)
        render(run_dir)
    return run_dir


def _evaluate(run: QualityRun, run_dir: Path | None, earlier: dict | None, parallel: TensorParallel,
              started: float, console: Console) -> None:
    """Every cell the run plans and `earlier` lacks, saved into `run_dir` as each finishes (None: kept in memory,
    a tensor-parallel rank other than 0)."""
    settings = {"methods": list(run.methods), "tasks": list(run.tasks), "retentions": list(run.retentions),
                "samples": list(run.samples), "seed": run.seed, "chat": run.chat, "sfi_variant": run.variant,
                "path": run.path, "sfi_preset": run.sfi_preset, "engine": run.engine}
    if earlier:  # what can be compared before the model loads, so a mismatch costs nothing
        known = {**settings, **({"contexts": list(run.contexts)} if "max" not in run.contexts else {})}
        check_resume(earlier["config"], known, run.out)
    session = _open_session(run, parallel)
    fmt = PromptFormat(session.loaded.tokenizer, run.chat)
    contexts = _fit_contexts(session, fmt, run)
    plan = {c: conditions(list(run.methods), list(run.retentions), c, run.variant, run.path) for c in contexts}
    model_cfg = session.loaded.config  # under tensor parallelism one rank's share of the heads
    # CUDA graphs by default wherever the engine's own decoder runs on one GPU (SPEC 7: an eager step measures
    # launches, and at quality's sample counts it costs most of the run)
    graphs = run.graphs if run.graphs is not None else (
        session.device.type == "cuda" and run.engine == "sfibench" and parallel.world_size == 1)
    config = {"model": model_cfg.name, **settings, "graphs": graphs, "contexts": contexts, "batch": run.batch,
              "device": str(session.device), "dtype": str(session.dtype).replace("torch.", ""),
              "threads": torch.get_num_threads(), "longbench": str(run.longbench) if run.longbench else None,
              # the ranks (processes) the model was split over, each holding 1/tp of the KV heads
              "tp": parallel.world_size,
              # what a report needs to say what a retention is over and what SFI ran with
              "attention_layers": {"layers": model_cfg.num_layers, "global": len(model_cfg.global_layers),
                                   "sliding_window": model_cfg.sliding_window},
              "sfi_settings": [{"context": c, "retention": cond.retention, **cond.spec.config.budget_facts()}
                               for c in contexts for cond in plan[c] if cond.method == registry.BUDGET_REFERENCE]}
    info = provenance()
    if earlier:
        check_resume(earlier["config"], {key: config[key] for key in SAME_ON_RESUME}, run.out)
        info["resumed_from"] = [*earlier["provenance"].pop("resumed_from", []), earlier["provenance"]]
    ledger = QualityLedger(run_dir, config, [c.label for c in plan[contexts[0]]], info, earlier, started)
    try:
        _run_cells(session, fmt, run, contexts, plan, ledger, console, graphs)
    except KeyboardInterrupt:
        if not ledger.records or run_dir is None:
            raise  # nothing finished: the claimed directory is removed on the way out
        ledger.save(complete=False)  # the wall time up to the stop, not to the last finished batch
        render(run_dir)
        raise RunInterrupted(
            f"stopped; {len(ledger.records)} of {ledger.total} sample results are saved in {run_dir} and its "
            f"report.md covers them. To continue, repeat the command with --out {run_dir} --resume") from None
    ledger.save(complete=True)


def _open_session(run: QualityRun, parallel: TensorParallel) -> Session:
    if run.engine == "transformers":
        from sfibench.hf.loading import open_session

        return open_session(run.model, run.device, run.dtype)
    return Session.open(run.model, run.device, run.dtype, run.seed, parallel=parallel)


def _fit_contexts(session: Session, fmt: PromptFormat, inputs: QualityRun) -> list[int]:
    """Resolve --ctx max and check every context leaves room for the longest answer (needs the tokenizer)."""
    limit, name = session.max_tokens, session.loaded.config.name
    # The answer budget is measured on one sample at a probe length: half the limit (room for a long-answer
    # task's many needles), or a smaller context asked for, which must hold them anyway (and fails here, clearly,
    # if it cannot). A refused --ctx is told the same longest prompt that --ctx max then picks.
    probe = min([c for c in inputs.contexts if c != "max"] + [limit // 2])
    # a RULER task's context is RULER's max_seq_length, which already holds its answer: it reserves nothing
    reserve = max([0] + [make_samples(t, fmt, probe, 1, inputs.seed)[0].decode_budget for t in inputs.tasks
                         if not t.startswith(PREFIX) and not is_ruler_task(t)]
                  + [DATASETS[dataset_name(f)][1] for f in inputs.files])
    contexts = [largest_context(limit, reserve) if c == "max" else c for c in inputs.contexts]
    for context in contexts:
        check_fits(context, limit, name, reserve)
    check_distinct(contexts)  # `max` may land on a length also given as a number
    return contexts


def _run_cells(session: Session, fmt: PromptFormat, inputs: QualityRun, contexts: list[int], plan: dict,
               ledger: QualityLedger, console: Console, graphs: bool) -> None:
    """Every (context, task, batch, condition) the ledger does not hold yet, saving as each finishes."""
    labels, batch, seed = ledger.labels, inputs.batch, inputs.seed
    drivers = KeptDrivers(session, graphs)  # each condition's graphs captured once per run, not once per batch
    total = sum(-(-n // batch) for n in inputs.samples) * len(inputs.tasks) * len(labels)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("quality", total=total)
        for context, count in zip(contexts, inputs.samples):
            for task in inputs.tasks:
                starts = range(0, count, batch)
                if all(ledger.has(task, context, range(s, min(s + batch, count)), label)
                       for s in starts for label in labels):
                    progress.advance(bar, len(starts) * len(labels))
                    continue
                ledger.start_task(task, context)
                progress.update(bar, description=f"{task} @ {context}: generating")
                if task.startswith(PREFIX):
                    file = next(f for f in inputs.files if PREFIX + f.stem == task)
                    task_samples = longbench_samples(fmt, file, context, count, seed)
                else:
                    task_samples = make_samples(task, fmt, context, count, seed)
                for start in starts:
                    chunk = task_samples[start:start + batch]
                    done = frozenset(label for label in labels
                                     if ledger.has(task, context, [s.index for s in chunk], label))
                    if not chunk or len(done) == len(labels):
                        progress.advance(bar, len(labels))
                        continue
                    progress.advance(bar, len(done - {labels[0]}))  # Full-KV runs again as the reference

                    def on_decode(label, task=task, context=context, start=start):
                        if not label.endswith("(free)"):
                            progress.advance(bar)
                        progress.update(bar, description=f"{task} @ {context} #{start}: {label}")

                    times = BatchTimes()
                    evaluate_batch(session, chunk, plan[context], on_decode=on_decode, done=done, drivers=drivers,
                                   times=times, on_records=lambda records, context=context: ledger.add(
                                       [{**record, "context": context} for record in records]))
                    if not console.is_terminal:  # a log file gets no live bar: one line per batch instead
                        console.print(f"{time.strftime('%H:%M:%S')} {task} @ {context}: "
                                      f"{start + len(chunk)}/{len(task_samples)} samples ({times.describe()})",
                                      highlight=False, soft_wrap=True)
