"""`sfibench quality`: check the options, run the tasks (runners/quality.py), print the cells."""

from __future__ import annotations

from pathlib import Path

import typer

from sfibench import registry
from sfibench.commands.common import (
    DEVICE_HELP,
    DTYPE_HELP,
    PATH_HELP,
    UNTIMED_THREADS_HELP,
    console,
    err_console,
    user_errors,
)
from sfibench.commands.ranks import TP_HELP, run_as_ranks
from sfibench.commands.sfi_options import VARIANT, SFISettings, sfi_options
from sfibench.core.errors import UsageError
from sfibench.commands.options import split_list
from sfibench.workloads.tasks import task_names


@sfi_options(*VARIANT)
def quality(
    model: str = typer.Option("smollm2-135m", help="preset name, HF checkpoint directory or .gguf file"),
    methods: str = typer.Option(",".join(registry.names()), help="comma-separated; Full-KV always runs (it is "
                                                                  "the reference)"),
    tasks: str = typer.Option("niah_single,niah_multiturn,ppl", help=f"comma-separated: {task_names()}"),
    ctx: str = typer.Option("2k", help="prompt lengths in the model's tokens: whole tokens or k = 1,024 tokens, "
                                       "e.g. 2k,4k,8000, or max"),
    budget: str = typer.Option(None, help="budgets, the tokens every method reads per layer and KV head as a share "
                               "of each context: fractions (0.15), percentages (15%), or whole tokens with one --ctx "
                               "(default 0.15,0.5: where the paper says SFI matches Full-KV, and where it says "
                               "eviction baselines need to be)"),
    retention: str = typer.Option(None, "--retention", hidden=True, help="--budget's earlier spelling"),
    sfi_preset: str = typer.Option(None, help="instead of --budget, one --ctx: every method at the budget of the "
                                   "authors' operating point, paper-2k (k_head 2048) or paper-4k (4096), with a "
                                   "256-token recent window and SPEC's triggers; both: paper-2k,paper-4k"),
    samples: str = typer.Option("4", help="samples per cell: one count, or one per --ctx (20,20,10)"),
    longbench: Path = typer.Option(None, help="LongBench <dataset>.jsonl file or a directory of them (local)"),
    chat: bool = typer.Option(True, "--chat/--no-chat", help="wrap prompts in the model's chat template"),
    batch: int = typer.Option(4, min=1, help="prompts prefilled and decoded together (fewer weight reads per "
                                             "token); keep it when resuming to reproduce the numbers exactly"),
    seed: int = typer.Option(0),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    path: str = typer.Option("reference", help="the path every method runs on: " + PATH_HELP),
    engine: str = typer.Option("sfibench", help="what decodes: sfibench (its own decoder: Llama family, Gemma-3) or "
                               "transformers (the model loaded by transformers, any architecture its attention "
                               "interface runs, the methods applied through sfibench.hf; reference path, slower; "
                               "see docs/transformers.md)"),
    out: Path = typer.Option(None, help="run directory (default runs/quality-<time>)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an earlier quality run in --out"),
    wide: bool = typer.Option(False, "--wide", help="print all columns (default: what fits 80 columns)"),
    resume: bool = typer.Option(False, "--resume", help="continue a stopped run in --out (same settings) from its "
                                                        "first missing sample"),
    tp: int = typer.Option(1, min=1, help=TP_HELP),
    graphs: bool = typer.Option(None, "--graphs/--no-graphs", help="replay decode steps from CUDA graphs "
                                "(default: on with a GPU, except --engine transformers and --tp)"),
    threads: int = typer.Option(None, min=1, help=UNTIMED_THREADS_HELP),
    sfi: SFISettings = SFISettings(),
):
    """Offline long-context tasks and fidelity to Full-KV, every method from one prefill; Ctrl-C keeps what is done."""
    from sfibench.commands.quality_options import quality_run

    with user_errors():
        sfi.check(path)
        if tp > 1 and engine != "sfibench":
            raise UsageError(f"--tp {tp} splits sfibench's own decoder; use --engine sfibench, or --tp 1")
        if budget is not None and retention is not None:
            raise UsageError("--retention is --budget's earlier spelling; give --budget alone")
        budget_option, budgets = ("--retention", retention) if retention is not None else ("--budget", budget)
        task_names = [task.strip() for task in tasks.split(",") if task.strip()]  # none is fine with --longbench
        run = quality_run(model, split_list(methods, "--methods"), task_names, split_list(ctx, "--ctx"),
                          None if budgets is None else split_list(budgets, budget_option),
                          split_list(samples, "--samples"), batch=batch, seed=seed, chat=chat, device=device,
                          dtype=dtype, path=path, engine=engine, longbench=longbench, sfi_variant=sfi.variant(),
                          sfi_preset=sfi_preset, out=out, overwrite=overwrite, resume=resume, tp=tp,
                          graphs=graphs, threads=threads, budget_option=budget_option)
        if resume and out is not None and (out / "results.json").is_file():
            # the batch sets which prompts share a pass, so a resumed run must keep it to mean the same
            from sfibench.reporting.results import read_results
            from sfibench.reporting.run_files import check_same_settings

            recorded = read_results(out)["config"]
            if "batch" in recorded:
                check_same_settings(recorded, {"batch": batch}, out)
        run_as_ranks(tp)
        from sfibench.runners.quality import run_quality  # loads torch

        run_dir = run_quality(run, err_console)
        if run_dir is None:  # a tensor-parallel rank other than 0: rank 0 reports
            return
        from sfibench.reporting.formatting import print_table
        from sfibench.reporting.quality_report import results_table
        from sfibench.reporting.results import read_results

        print_table(console, results_table(read_results(run_dir)["results"]["cells"], wide), wide)
        console.print(f"report: {run_dir / 'report.md'}")
