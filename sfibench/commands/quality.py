"""`sfibench quality`: check the options, run the tasks (runners/quality.py), print the cells."""

from __future__ import annotations

from pathlib import Path

import typer

from sfibench.commands.common import (
    BRIDGE_STEPS_HELP,
    DEVICE_HELP,
    DTYPE_HELP,
    EVIDENCE_NORM_HELP,
    KEEP_NEIGHBOURS_HELP,
    NMS_ALPHA_HELP,
    NMS_RADIUS_HELP,
    PATH_HELP,
    PUBLISH_HELP,
    UNTIMED_THREADS_HELP,
    console,
    err_console,
    user_errors,
)
from sfibench import registry
from sfibench.commands.ranks import TP_HELP, run_as_ranks
from sfibench.core.errors import UsageError
from sfibench.options import check_sfi_settings, split_list
from sfibench.sfi.config import SelectorConfig, SFIConfig
from sfibench.workloads.tasks import task_names


def quality(
    model: str = typer.Option("smollm2-135m", help="preset name, HF checkpoint directory or .gguf file"),
    methods: str = typer.Option(",".join(registry.names()), help="comma-separated; Full-KV always runs (it is "
                                                                  "the reference)"),
    tasks: str = typer.Option("niah_single,niah_multiturn,ppl", help=f"comma-separated: {task_names()}"),
    ctx: str = typer.Option("2k", help="prompt lengths in the model's tokens: whole tokens or k = 1,024 tokens, "
                                       "e.g. 2k,4k,8000, or max"),
    retention: str = typer.Option(None, help="budgets as fractions of the context, each in (0, 1] "
                                  "(default 0.15,0.5: where the paper says SFI matches Full-KV, and where it says "
                                  "eviction baselines need to be)"),
    sfi_preset: str = typer.Option(None, help="instead of --retention, one --ctx: every method at the budget of the "
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
    no_prior: bool = typer.Option(False, "--no-prior", help="SFI ablation: Selector without the prior"),
    no_nms: bool = typer.Option(False, "--no-nms", help="SFI ablation: Selector without Soft-NMS"),
    no_cross_head: bool = typer.Option(False, "--no-cross-head", help="SFI ablation: no cross-head exclusivity"),
    w_prefill: int = typer.Option(None, min=1, help="SFI: prompt queries used as bootstrap evidence (default 16)"),
    nms_radius: int = typer.Option(None, min=0, help=f"{NMS_RADIUS_HELP} (default {SelectorConfig.nms_radius})"),
    nms_alpha: float = typer.Option(None, min=0.0, help=f"{NMS_ALPHA_HELP} (default {SelectorConfig.nms_alpha:g})"),
    evidence_norm: str = typer.Option(None, help=f"{EVIDENCE_NORM_HELP} (default {SelectorConfig.evidence_norm})"),
    keep_neighbours: int = typer.Option(None, min=1, help=KEEP_NEIGHBOURS_HELP),
    bridge_steps: int = typer.Option(None, min=0, help=f"{BRIDGE_STEPS_HELP} (default {SFIConfig.bridge_steps})"),
    publish: str = typer.Option(None, help=f"{PUBLISH_HELP} (default {SFIConfig.publish})"),
    tp: int = typer.Option(1, min=1, help=TP_HELP),
    graphs: bool = typer.Option(None, "--graphs/--no-graphs", help="replay decode steps from CUDA graphs "
                                "(default: on with a GPU, except --engine transformers and --tp)"),
    threads: int = typer.Option(None, min=1, help=UNTIMED_THREADS_HELP),
):
    """Offline long-context tasks and fidelity to Full-KV, every method from one prefill; Ctrl-C keeps what is done."""
    from sfibench.runners.quality_inputs import quality_run

    with user_errors():
        check_sfi_settings(evidence_norm, keep_neighbours, publish, path)
        if tp > 1 and engine != "sfibench":
            raise UsageError(f"--tp {tp} splits sfibench's own decoder; use --engine sfibench, or --tp 1")
        variant = {name: False for name, off in (("use_prior", no_prior), ("use_nms", no_nms),
                                                  ("use_cross_head", no_cross_head)) if off}
        # Recorded only when given, so a run at SPEC's settings records no variant.
        variant.update({name: value for name, value in (
            ("w_prefill", w_prefill), ("nms_radius", nms_radius), ("nms_alpha", nms_alpha),
            ("evidence_norm", evidence_norm), ("keep_neighbours", keep_neighbours), ("bridge_steps", bridge_steps),
            ("publish", publish)) if value is not None})
        task_names = [task.strip() for task in tasks.split(",") if task.strip()]  # none is fine with --longbench
        run = quality_run(model, split_list(methods, "--methods"), task_names, split_list(ctx, "--ctx"),
                          None if retention is None else split_list(retention, "--retention"),
                          split_list(samples, "--samples"), batch=batch, seed=seed, chat=chat, device=device,
                          dtype=dtype, path=path, engine=engine, longbench=longbench, sfi_variant=variant,
                          sfi_preset=sfi_preset, out=out, overwrite=overwrite, resume=resume, tp=tp,
                          graphs=graphs, threads=threads)
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
        from sfibench.reporting.quality_report import results_table
        from sfibench.reporting.results import read_results

        console.print(results_table(read_results(run_dir)["results"]["cells"], wide))
        console.print(f"report: {run_dir / 'report.md'}")
