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
from sfibench.core.errors import RunInterrupted, UsageError
from sfibench.core.provenance import provenance
from sfibench.engine.session import Session
from sfibench.metrics.longbench import DATASETS
from sfibench.options import check_session_options, split_list
from sfibench.reporting.report_run import render
from sfibench.reporting.results import read_results
from sfibench.reporting.run_dir import claimed_run_dir
from sfibench.runners.quality_batch import conditions, evaluate_batch
from sfibench.sfi.config import preset_retention
from sfibench.runners.quality_inputs import (
    SAME_ON_RESUME,
    QualityInputs,
    check_distinct,
    check_fits,
    check_inputs,
    check_resume,
    largest_context,
    parse_context,
)
from sfibench.runners.quality_ledger import QualityLedger
from sfibench.workloads.base import PromptFormat
from sfibench.workloads.longbench import PREFIX, dataset_name, longbench_samples
from sfibench.workloads.tasks import make_samples

DEFAULT_METHODS = tuple(registry.names())
DEFAULT_TASKS = ("niah_single", "niah_multiturn", "ppl")
DEFAULT_CONTEXTS = ("2k",)
DEFAULT_RETENTIONS = (0.15, 0.5)  # the paper: SFI matches Full-KV at 15-20%, eviction needs ~50%
DEFAULT_SAMPLES = (4,)


def run_quality(model: str = "smollm2-135m", methods=DEFAULT_METHODS, tasks=DEFAULT_TASKS,
                contexts=DEFAULT_CONTEXTS, retentions=None, samples=DEFAULT_SAMPLES,
                out: Path | str | None = None, overwrite: bool = False, device: str = "auto", dtype: str = "auto",
                seed: int = 0, batch: int = 4, chat: bool = True, longbench: Path | str | None = None,
                console: Console | None = None, resume: bool = False, sfi_variant: dict | None = None,
                path: str = "reference", sfi_preset: str | None = None) -> Path:
    """Run the quality benchmark and return the run directory (results.json, plots, report.md).

    `resume` continues a stopped run in `out` with the same settings: every record its results.json
    holds is kept, and only the missing ones run. `sfi_variant` changes SFI settings for an ablation
    run (see sfi/config.with_variant), e.g. {"use_nms": False}. `path` is the implementation
    path every method runs on. `sfi_preset` (sfi/config.PRESETS, in place of `retentions`, one context)
    runs every method at the budget of the authors' operating point. Ctrl-C raises RunInterrupted once what
    is done is saved and rendered.
    """
    started = time.time()
    console = console or Console(stderr=True)
    sfi_variant = sfi_variant or None  # recorded as null when SFI runs as specified
    retentions = _preset_retentions(sfi_preset, contexts, retentions)
    inputs = check_inputs(model, methods, tasks, contexts, retentions, samples, batch, longbench, path, sfi_variant)
    check_session_options(model, device, dtype)
    with claimed_run_dir(out, "quality", overwrite=overwrite, resume=resume) as run_dir:
        earlier = read_results(run_dir) if resume else None
        settings = {"methods": inputs.methods, "tasks": inputs.tasks, "retentions": inputs.retentions,
                    "samples": inputs.samples, "seed": seed, "chat": chat, "sfi_variant": sfi_variant, "path": path,
                    "sfi_preset": sfi_preset}
        if earlier:  # what can be compared before the model loads, so a mismatch costs nothing
            known = {**settings, **({"contexts": inputs.contexts} if "max" not in inputs.contexts else {})}
            check_resume(earlier["config"], known, run_dir)
        session = Session.open(model, device, dtype, seed)
        fmt = PromptFormat(session.loaded.tokenizer, chat)
        contexts = _fit_contexts(session, fmt, inputs, seed)
        plan = {c: conditions(inputs.methods, inputs.retentions, c, sfi_variant, path) for c in contexts}
        model_cfg = session.loaded.config
        config = {"model": model_cfg.name, **settings, "contexts": contexts, "batch": batch,
                  "device": str(session.device), "dtype": str(session.dtype).replace("torch.", ""),
                  "threads": torch.get_num_threads(), "longbench": str(longbench) if longbench else None,
                  # what a report needs to say what a retention is over and what SFI ran with
                  "attention_layers": {"layers": model_cfg.num_layers, "global": len(model_cfg.global_layers),
                                       "sliding_window": model_cfg.sliding_window},
                  "sfi_settings": [{"context": c, "retention": cond.retention, **cond.spec.config.budget_facts()}
                                   for c in contexts for cond in plan[c] if cond.method == registry.BUDGET_REFERENCE]}
        info = provenance()
        if earlier:
            check_resume(earlier["config"], {key: config[key] for key in SAME_ON_RESUME}, run_dir)
            info["resumed_from"] = [*earlier["provenance"].pop("resumed_from", []), earlier["provenance"]]
        ledger = QualityLedger(run_dir, config, [c.label for c in plan[contexts[0]]], info, earlier, started)
        try:
            _run_cells(session, fmt, inputs, contexts, plan, ledger, console, batch, seed)
        except KeyboardInterrupt:
            if not ledger.records:
                raise  # nothing finished: the claimed directory is removed on the way out
            render(run_dir)
            raise RunInterrupted(
                f"stopped; {len(ledger.records)} of {ledger.total} sample results are saved in {run_dir} and its "
                f"report.md covers them. To continue, repeat the command with --out {run_dir} --resume") from None
        ledger.save(complete=True)
    render(run_dir)
    return run_dir


def _preset_retentions(preset: str | None, contexts, retentions) -> list:
    """The retentions to run: given, the default ones, or those that are the presets' budgets at the context.

    `preset` is one name or several, comma-separated (paper-2k,paper-4k: both share each prefill). A
    preset's budget is fixed in tokens, so its retention differs per context; the run's conditions are
    the same at every context, hence one context per preset run."""
    if preset is None:
        return DEFAULT_RETENTIONS if retentions is None else retentions
    if retentions is not None:
        raise UsageError("give --retention or --sfi-preset, not both: the preset fixes the budget in tokens")
    if len(contexts) != 1 or parse_context(contexts[0]) == "max":
        raise UsageError(f"--sfi-preset needs exactly one --ctx in tokens, got {','.join(map(str, contexts))}: "
                         "its budget is fixed in tokens, so each context is a run of its own")
    return [preset_retention(name, parse_context(contexts[0])) for name in split_list(preset, "--sfi-preset")]


def _fit_contexts(session: Session, fmt: PromptFormat, inputs: QualityInputs, seed: int) -> list[int]:
    """Resolve --ctx max and check every context leaves room for the longest answer (needs the tokenizer)."""
    limit, name = session.max_tokens, session.loaded.config.name
    probe = min(1024, limit // 2)  # decode budgets do not depend on the context length
    reserve = max([make_samples(t, fmt, probe, 1, seed)[0].decode_budget for t in inputs.tasks
                   if not t.startswith(PREFIX)] + [DATASETS[dataset_name(f)][1] for f in inputs.files])
    contexts = [largest_context(limit, reserve) if c == "max" else c for c in inputs.contexts]
    for context in contexts:
        check_fits(context, limit, name, reserve)
    check_distinct(contexts)  # `max` may land on a length also given as a number
    return contexts


def _run_cells(session: Session, fmt: PromptFormat, inputs: QualityInputs, contexts: list[int], plan: dict,
               ledger: QualityLedger, console: Console, batch: int, seed: int) -> None:
    """Every (context, task, batch, condition) the ledger does not hold yet, saving as each finishes."""
    labels = ledger.labels
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

                    evaluate_batch(session, chunk, plan[context], on_decode=on_decode, done=done,
                                   on_records=lambda records, context=context: ledger.add(
                                       [{**record, "context": context} for record in records]))
                    if not console.is_terminal:  # a log file gets no live bar: one line per batch instead
                        console.print(f"{time.strftime('%H:%M:%S')} {task} @ {context}: "
                                      f"{start + len(chunk)}/{len(task_samples)} samples", highlight=False)
