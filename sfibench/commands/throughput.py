"""`sfibench throughput`: check the options, run the benchmark (runners/throughput.py), print the table."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer

from sfibench import registry
from sfibench.commands.common import (
    DEVICE_HELP,
    DTYPE_HELP,
    PATHS,
    TIMED_THREADS_HELP,
    console,
    user_errors,
)
from sfibench.commands.ranks import TP_HELP, check_tp, run_as_ranks
from sfibench.commands.sfi_options import ALL, SFISettings, sfi_options
from sfibench.core.budget import Budget
from sfibench.core.errors import UsageError
from sfibench.engine.workspace import LENGTH_BUCKET
from sfibench.models.shape import check_context_limit, config_before_loading
from sfibench.runners.throughput_run import ThroughputRun, check_request_limit, resolve_contexts
from sfibench.commands.options import (
    PREFILL_MODES,
    THROUGHPUT_STEPS,
    check_choice,
    check_device_needs,
    check_path,
    check_shape_options,
    distinct_counts,
    ordered_contexts,
    parse_counts,
    parse_token_list,
    parse_tokens,
    split_list,
)


# every SFI setting but --publish: the optimized path is timed with each publish mode (SFIConfig.variants)
@sfi_options(*(name for name in ALL if name != "publish"))
def throughput(
    model: str = typer.Option(None, help="default: qwen3-4b (random weights) on a GPU, tiny-llama on a CPU"),
    ctx: str = typer.Option(None, help="contexts in tokens (k = 1,024), e.g. 8k,32k,max; max = the model's limit "
                                       "minus --steps (default: 8k,32k,max on a GPU, 1k,3k on a CPU)"),
    batch: str = typer.Option(None, help="batch sizes, e.g. 1,4; 'max' = the largest that fits at the longest "
                                         "context (default: 1,4 on a GPU, 1 on a CPU)"),
    methods: str = typer.Option(",".join(registry.names()), help="comma-separated; name/path pins one path "
                                                                     "(full_kv/optimized)"),
    paths: str = typer.Option(None, help="reference,optimized (default: both on a GPU, reference on a CPU)"),
    steps: int = typer.Option(None, min=2, help="decode steps per pass (default 128 on a GPU, 32 on a CPU)"),
    prompt_len: str = typer.Option(None, help="request mode: prompt lengths in tokens, e.g. 32k,120k (with "
                                              "--gen-len, instead of --ctx and --steps)"),
    gen_len: str = typer.Option(None, help="request mode: tokens each request generates after its prompt, "
                                           "the cache growing as it writes, e.g. 8k"),
    gen_text: str = typer.Option("auto", help="request mode's text: own (the model's greedy tokens), "
                                              "replay (a real-text stream), auto (own with real weights, "
                                              "else replay)"),
    repeats: int = typer.Option(3, min=1, help="timed passes (median and spread reported)"),
    prefill: str = typer.Option("auto", help="real, synthetic, or auto (synthetic from 16K tokens)"),
    graphs: bool = typer.Option(None, "--graphs/--no-graphs", help="CUDA graphs (default: on with a GPU)"),
    length_bucket: int = typer.Option(LENGTH_BUCKET, min=1, help="graphed steps read up to a multiple of this"),
    dense_kernels: bool = typer.Option(True, help="time Full-KV's kernel against every SDPA backend (GPU)"),
    budget: str = typer.Option(None, help="tokens read per layer and KV head by every method: whole tokens (2308) "
                                          "or a percentage of each context (15%), SFI's by its budget rule "
                                          "(default: SFI at its own settings, every other method at the tokens it "
                                          "reads after a refresh)"),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    out: Path = typer.Option(None, help="run directory (default runs/throughput-<time>)"),
    overwrite: bool = typer.Option(False, help="replace an earlier throughput run in --out"),
    resume: bool = typer.Option(False, "--resume", help="continue a run in --out (same settings): measure only "
                                                        "what a stopped run lacks, or draw a whole run's report"),
    wide: bool = typer.Option(False, "--wide", help="print all columns (default: what fits 80 columns)"),
    tp: int = typer.Option(1, min=1, help=TP_HELP),
    threads: int = typer.Option(None, min=1, help=TIMED_THREADS_HELP),
    sfi: SFISettings = SFISettings(),
):
    """Decode speed of every method: tok/s, ms/step by kind, GB/s against the measured roofline; with
    --prompt-len and --gen-len, requests: time to first token, time per output token, end-to-end."""
    with user_errors():
        # Every check before the runner's import needs no model and no measurement, and (where torch's build
        # says there is no GPU) no torch: a bad command fails at once. Options as given first, then the
        # device, which sets the defaults.
        given_contexts = None if ctx is None else ordered_contexts(parse_token_list(ctx, "--ctx"))
        given_batches = None if batch is None else distinct_counts(parse_counts(batch, "--batch", allow_max=True),
                                                                   "--batch")
        method_list = tuple(split_list(methods, "--methods"))
        for item in method_list:
            name, _, pinned = item.partition("/")
            registry.check_name(name)
            if pinned:
                check_path(pinned, f"--methods {item}")
        check_choice(prefill, PREFILL_MODES, "--prefill")
        requests = check_request_options(prompt_len, gen_len, gen_text, ctx, steps)
        if requests:
            given_contexts, steps = requests
        sfi.check("optimized")
        given_budget = None if budget is None else Budget.parse(budget)
        model, gpu = check_shape_options(model, device, dtype)
        steps = steps or THROUGHPUT_STEPS["cuda" if gpu else "cpu"]
        contexts, order_note = given_contexts or ordered_contexts(parse_token_list("8k,32k,max" if gpu else "1k,3k",
                                                                                   "--ctx"))
        batches = given_batches or ([1, 4] if gpu else [1])
        default_paths = "reference,optimized" if gpu else "reference"
        path_list = tuple(check_choice(p, PATHS, "--paths")
                          for p in split_list(default_paths if paths is None else paths, "--paths"))
        pinned = tuple(item.partition("/")[2] for item in method_list)
        check_tp(tp, bool(graphs))
        check_device_needs(device, "--paths", path_list + pinned, bool(graphs))
        shape = config_before_loading(model)
        if requests:
            check_request_limit(shape, [c for c in contexts if c != "max"], steps)
        else:
            check_context_limit(shape, [c for c in contexts if c != "max"], steps)
        if shape is not None:  # --ctx max, once, from the shape (a GGUF file's once it loads)
            contexts = resolve_contexts(contexts, shape.max_context, steps)
        known = [c for c in contexts if c != "max"]
        run = ThroughputRun(model=model, device=device, dtype=dtype, contexts=tuple(contexts), batches=tuple(batches),
                            methods=(), steps=steps, repeats=repeats, prefill=prefill,
                            graphs=gpu and tp == 1 if graphs is None else graphs, length_bucket=length_bucket,
                            dense_kernels=dense_kernels and gpu and not requests, k_head=sfi.k_head(),
                            budget=given_budget, sfi=sfi.config(), out=out, overwrite=overwrite,
                            threads=threads, requests=bool(requests), text=gen_text)
        for context in known:  # a percentage must give a token, and a budget must leave SFI room to select
            run.sfi_at(context)
        if resume and overwrite:
            raise UsageError("--resume keeps the run in --out and --overwrite replaces it; give one of them")
        if not resume:
            run_as_ranks(tp)
        from sfibench.runners.throughput import (  # loads torch
            check_memory_before_loading,
            resolve_methods,
            resume_throughput,
            run_throughput,
        )

        pairs = resolve_methods(method_list, path_list)
        if not pairs:
            raise UsageError(f"--methods {methods} has no method registered on --paths {','.join(path_list)}; "
                             "pin one with name/path, e.g. full_kv/optimized")
        run = replace(run, methods=tuple(pairs))
        if order_note:
            console.print(order_note, highlight=False)
        if resume:
            run_dir = resume_throughput(run, console)
        else:
            check_memory_before_loading(run)  # the run's one memory check, before the model loads
            run_dir = run_throughput(run, console)
        if run_dir is None:  # a tensor-parallel rank other than 0: rank 0 reports
            return
        from sfibench.reporting.formatting import print_table
        from sfibench.reporting.report_run import terminal_summary
        from sfibench.reporting.results import read_results

        document = read_results(run_dir)
        table, *notes = terminal_summary(document, wide)
        print_table(console, table, wide)
        for note in notes:
            console.print(note, highlight=False)
        plots = "requests.png" if requests else "throughput.png, latency.png"
        console.print(f"[green]wrote[/] {run_dir}/results.json, report.md, {plots}")


GEN_TEXTS = ("auto", "own", "replay")


def check_request_options(prompt_len: str | None, gen_len: str | None, gen_text: str, ctx: str | None,
                          steps: int | None) -> tuple[list, int] | None:
    """Request mode's prompt lengths (shortest first) and tokens generated per request, or None for the
    fixed-context mode; checked before anything loads."""
    check_choice(gen_text, GEN_TEXTS, "--gen-text")
    if prompt_len is None and gen_len is None:
        if gen_text != "auto":
            raise UsageError("--gen-text sets request mode's text; give it with --prompt-len and --gen-len")
        return None
    if prompt_len is None or gen_len is None:
        raise UsageError("request mode takes --prompt-len and --gen-len together, e.g. --prompt-len 32k "
                         "--gen-len 8k")
    if ctx is not None or steps is not None:
        raise UsageError("--ctx and --steps set the fixed-context mode; request mode takes --prompt-len and "
                         "--gen-len instead")
    generated = parse_tokens(gen_len, "--gen-len")
    if generated < 2:
        raise UsageError("--gen-len 1 is the prefill's token alone, with no decode step to time; "
                         "give at least 2")
    return ordered_contexts(parse_token_list(prompt_len, "--prompt-len"), "--prompt-len"), generated
