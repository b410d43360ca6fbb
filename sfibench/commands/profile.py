"""`sfibench profile`: check the options, profile the steps (runners/profile.py), print the components."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer

from sfibench import registry
from sfibench.commands.common import (
    DEVICE_HELP,
    DTYPE_HELP,
    METHOD_NAMES,
    PATH_HELP,
    TIMED_THREADS_HELP,
    console,
    user_errors,
)
from sfibench.commands.ranks import TP_HELP, run_as_ranks
from sfibench.commands.sfi_options import ALL, SFISettings, sfi_options
from sfibench.core.budget import Budget, budget_record
from sfibench.core.errors import UsageError
from sfibench.models.shape import PROFILE_MARGIN, check_context_limit
from sfibench.commands.options import (
    check_path,
    check_device_needs,
    check_memory_before_loading,
    check_shape_options,
    parse_tokens,
)


@sfi_options(*ALL)
def profile(
    model: str = typer.Option(None, help="default: qwen3-4b (random weights) on a GPU, tiny-llama on a CPU"),
    ctx: str = typer.Option(None, help="context in tokens (k = 1,024; default 32k on a GPU, 3k on a CPU)"),
    method: str = typer.Option("sfi", help=METHOD_NAMES),
    path: str = typer.Option("reference", help=PATH_HELP),
    steps: int = typer.Option(16, min=1, help="eager decode steps profiled, plus the first step of each other "
                                              "kind the method has (SFI: a slow step)"),
    batch: int = typer.Option(1, min=1, help="sequences decoded together, each replaying its own text"),
    budget: str = typer.Option(None, help="tokens read per layer and KV head by the method: whole tokens (2308) "
                                          "or a percentage of the context (15%), by the method's own budget rule "
                                          "(default: the method's own settings; SFI's k_head, sinks and window)"),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    out: Path = typer.Option(None, help="run directory (default runs/profile-<time>)"),
    overwrite: bool = typer.Option(False, help="replace an earlier profile run in --out"),
    resume: bool = typer.Option(False, "--resume", help="finish a run in --out whose results.json is whole (same "
                                                        "settings): draw its report without profiling again"),
    wide: bool = typer.Option(False, "--wide", help="print all columns (default: what fits 80 columns)"),
    tp: int = typer.Option(1, min=1, help=TP_HELP),
    threads: int = typer.Option(None, min=1, help=TIMED_THREADS_HELP),
    sfi: SFISettings = SFISettings(),
):
    """Where one decode step's time goes: attention, SFI selector, MLP, other ops, launch gaps."""
    from sfibench.models.presets import PRESETS

    with user_errors():
        # the checks that need no model (and on a CPU-only torch no torch) first, so a bad command fails at once
        registry.check_name(method)
        check_path(path, "--path")
        sfi.check(path if method == registry.BUDGET_REFERENCE else None)
        given_budget = None if budget is None else Budget.parse(budget)
        given_context = None if ctx is None else parse_tokens(ctx, "--ctx")
        model, gpu = check_shape_options(model, device, dtype)
        if tp > 1 and gpu and path == "optimized":  # profile_graphed: a GPU's optimized step is profiled graphed
            raise UsageError(f"--tp {tp} runs without CUDA graphs, and on a GPU the optimized path is profiled "
                             "CUDA-graphed; use --path reference, or --tp 1")
        check_device_needs(device, "--path", [path])
        context = given_context or parse_tokens("32k" if gpu else "3k", "--ctx")
        check_context_limit(PRESETS.get(model), [context], steps + PROFILE_MARGIN)
        budget_tokens = None if given_budget is None else given_budget.resolve(context)
        # what results.json records beside the shape: a budget and SFI's settings, where given
        given = {**({"budget": budget_record(given_budget)} if given_budget else {}),
                 **({"sfi_settings": dict(sfi.given)} if sfi.given else {})}
        if method == registry.BUDGET_REFERENCE:
            sfi.k_head().resolve(context, "--k-head", at_most_context=False)  # a percentage must give a token
        check_memory_before_loading(model, [batch], [context], steps + PROFILE_MARGIN, device, dtype,
                                    synthetic_prefill=True, tp=tp)  # the smaller prefill workspace: a lower bound
        if resume and overwrite:
            raise UsageError("--resume keeps the run in --out and --overwrite replaces it; give one of them")
        if resume:
            from sfibench.models.presets import PRESETS
            from sfibench.reporting.report_run import finish_saved_run

            settings = {"context": context, "method": method, "path": path, "steps": steps, "batch": batch,
                        **given, **({"model": PRESETS[model].name} if model in PRESETS else {})}
            run_dir = finish_saved_run(out, "profile", settings)
            _print(run_dir, wide)
            return
        run_as_ranks(tp)
        from sfibench.runners.profile import ProfileRun, run_profile  # loads torch

        registry.check_method(method, path)
        config = registry.default_config(method)
        if method == registry.BUDGET_REFERENCE:
            config = sfi.config(config)
            config = replace(config, k_head=sfi.k_head().resolve(context, "--k-head", at_most_context=False))
        if budget_tokens is not None:
            config = config.with_budget(budget_tokens)
        run = ProfileRun(model=model, device=device, dtype=dtype, method=method, path=path, context=context,
                         steps=steps, batch=batch, out=out, overwrite=overwrite, threads=threads, config=config,
                         given=given)
        run_dir = run_profile(run)
        if run_dir is None:  # a tensor-parallel rank other than 0: rank 0 reports
            return
        _print(run_dir, wide)


def _print(run_dir: Path, wide: bool) -> None:
    from sfibench.reporting.formatting import print_table
    from sfibench.reporting.profile_report import terminal_table
    from sfibench.reporting.results import read_results

    print_table(console, terminal_table(read_results(run_dir), wide), wide)
    console.print(f"[green]wrote[/] {run_dir}/results.json, report.md and profile.png")
