"""`sfibench stability`: check the options, run the analysis (runners/stability.py), print its summary."""

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
    user_errors,
)
from sfibench.commands.sfi_options import SFISettings, sfi_options
from sfibench.core.budget import budget_record
from sfibench.core.errors import UsageError
from sfibench.commands.options import (
    check_device_needs,
    check_memory_before_loading,
    check_path,
    check_session_options,
    check_top_p,
    ordered_contexts,
    parse_token_list,
    split_list,
)


# k_head's default is StabilityConfig's (metrics/stability.DEFAULT_K_HEAD), stated without importing torch
@sfi_options("k_head", "n_sink", "n_recent", "page", "no_nms", "keep_neighbours", defaults={"k_head": "10%"})
def stability(
    model: str = typer.Option("smollm2-135m", help="preset name, HF checkpoint directory or .gguf file"),
    text_file: Path = typer.Option(None, help="natural text to teacher-force (default: the shipped English essays)"),
    generate: bool = typer.Option(False, "--generate", help="analyse the model's own sampled continuation of "
                                                           "the text's prefix instead of the text itself"),
    steps: int = typer.Option(2000, min=2, help="decode steps analysed (per context and prompt)"),
    prefix: int = typer.Option(None, min=1, help="without --ctx: prompt tokens prefilled before the first "
                                                  "analysed step (default 512)"),
    ctx: str = typer.Option(None, help="contexts to analyse, e.g. 8k,16k,32k: each prompt is CTX - STEPS tokens, "
                                       "so the last step sees CTX"),
    prompts: str = typer.Option("prose", help="with --ctx: prompt sources, the text (prose) and/or quality tasks "
                                              "such as niah_single (their prompts are always continued by the model)"),
    samples: int = typer.Option(1, min=1, help="prompts of each task per context"),
    fixed_refresh: str = typer.Option(None, help="also compare SFI's memory refreshed every N steps against it "
                                      "refreshed at sentence starts: N, or auto for the sentence trigger's rate"),
    topk_frac: float = typer.Option(0.02, help="support size k as a fraction of the context, in (0, 1)"),
    mass: float = typer.Option(0.9, help="second support: smallest candidate set holding this share of their mass"),
    max_offset: int = typer.Option(64, min=1, help="drift is binned by offset from the sentence start up to this"),
    temperature: float = typer.Option(0.7, min=0.0, help="generated text only"),
    top_p: float = typer.Option(0.95, min=0.0, max=1.0, help="generated text only"),
    seed: int = typer.Option(0),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    path: str = typer.Option("reference", help="path of the Full-KV method the dense probe stands for: " + PATH_HELP),
    out: Path = typer.Option(None, help="run directory (default runs/stability-<time>)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an earlier stability run in --out"),
    resume: bool = typer.Option(False, "--resume", help="finish a run in --out whose results.json is whole (same "
                                                        "settings): draw its report without analysing again"),
    wide: bool = typer.Option(False, "--wide", help="print all columns (default: what fits 80 columns)"),
    threads: int = typer.Option(None, min=1, help=UNTIMED_THREADS_HELP),
    sfi: SFISettings = SFISettings(),
):
    """Is the dominant attention support stable within a sentence? Dense attention over real text.

    SFI's memory is compared at its k_head (a percentage of the context at the sentence start) and geometry;
    its Selector settings (--no-nms, --keep-neighbours) are compared as a variant beside it."""
    with user_errors():
        # the checks that need no model (and on a CPU-only torch no torch) first, so a bad command fails at once
        check_path(path, "--path")
        check_top_p(top_p)
        sfi.check(path)
        trigger, interval = ("sentence", None) if fixed_refresh is None else ("fixed", parse_refresh(fixed_refresh))
        contexts = () if ctx is None else tuple(ordered_contexts(parse_token_list(ctx, "--ctx", allow_max=False))[0])
        if contexts and prefix is not None:
            raise UsageError("--prefix and --ctx both set the prompt's length (with --ctx it is CTX - STEPS); "
                             "give one of them")
        check_session_options(model, device, dtype)
        check_device_needs(device, "--path", [path])
        from sfibench.metrics.stability import StabilityConfig  # loads torch
        from sfibench.runners.stability import StabilityRun, run_stability

        # the weights and the longest prompt's cache against the memory, before any weight is allocated
        longest = max(contexts) - steps if contexts else (StabilityConfig.prefix if prefix is None else prefix)
        check_memory_before_loading(model, [1], [max(longest, 1)], steps, device, dtype)

        registry.check_method(registry.dense().name, path)
        geometry = ("n_sink", "n_recent", "page", "k_head")  # SFI's memory itself; the rest make its variant
        analysis = StabilityConfig(
            model=model, text_file=None if text_file is None else str(text_file), generate=generate, steps=steps,
            prefix=StabilityConfig.prefix if prefix is None else prefix, contexts=contexts,
            prompts=tuple(split_list(prompts, "--prompts")), samples=samples, topk_frac=topk_frac, mass=mass,
            max_offset=max_offset, trigger=trigger, interval=interval, variant=sfi.part(geometry, inside=False).variant(),
            temperature=temperature, top_p=top_p, seed=seed, device=device, dtype=dtype, path=path,
            sfi=sfi.part(geometry).config(), **({"k_head": sfi.k_head()} if sfi["k_head"] is not None else {}))
        if resume and overwrite:
            raise UsageError("--resume keeps the run in --out and --overwrite replaces it; give one of them")
        if resume:
            from dataclasses import asdict

            from sfibench.reporting.results import to_jsonable
            from sfibench.reporting.report_run import finish_saved_run

            settings = to_jsonable({**asdict(analysis), "k_head": budget_record(analysis.k_head)})
            run_dir = finish_saved_run(out, "stability", {k: v for k, v in settings.items() if k != "device"})
        else:
            run_dir = run_stability(StabilityRun(analysis, out=out, overwrite=overwrite, threads=threads))
        from sfibench.reporting.formatting import print_table
        from sfibench.reporting.results import read_results
        from sfibench.reporting.stability_markdown import terminal_table

        print_table(console, terminal_table(read_results(run_dir), wide), wide)
        console.print(f"report: {run_dir / 'report.md'}")


def parse_refresh(text: str) -> int | None:
    """--fixed-refresh: 'auto' (None: the sentence trigger's rate, measured on the text) or a whole N >= 1."""
    spelled = str(text).strip().lower()
    if spelled == "auto":
        return None
    if spelled.isdigit() and int(spelled) >= 1:
        return int(spelled)
    raise UsageError(f"--fixed-refresh {text!r} is neither auto nor a whole number of steps >= 1; give e.g. 32 "
                     "or auto")
