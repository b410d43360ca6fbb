"""`sfibench throughput` run: claim the folder, measure every method, write results.json, render.

The command (commands/throughput.py) has built and checked the run (runners/throughput_run.ThroughputRun):
every option, the device defaults, `--ctx max` where the model's shape is known, and with
`check_memory_before_loading` whether every (context, batch) fits with the run's methods. What needs the
loaded model (a GGUF file's shape and limit, a checkpoint's own context limit) is checked here after the
directory is claimed and before anything is measured.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console

from sfibench.core.device import idle_cores_only, resolve_device
from sfibench.core.device_facts import DTYPE_BYTES, default_dtype
from sfibench.core.errors import RunInterrupted
from sfibench.core.parallel import interconnect, launched_ranks, rank_device, ranks
from sfibench.core.provenance import provenance
from sfibench.engine.session import Session
from sfibench.metrics.timing import measure_copy_bandwidth
from sfibench.models.shape import check_context_limit, config_before_loading
from sfibench.registry import available, check_method
from sfibench.reporting.report_run import render
from sfibench.reporting.results import read_results, write_results
from sfibench.reporting.run_dir import claimed_run_dir
from sfibench.reporting.run_files import check_same_settings
from sfibench.runners.throughput_batches import batch_plan, spec_key
from sfibench.runners.throughput_measure import (
    add_comparisons,
    check_before_loading,
    largest_batch,
    measure_all,
    method_specs,
    own_largest_batches,
)
from sfibench.runners.throughput_memory import planned_before_loading
from sfibench.runners.throughput_requests import measure_requests
from sfibench.runners.throughput_run import ThroughputRun, resolve_contexts


def _pdl_state() -> str:
    from sfibench.optimized import pdl  # Triton: imported only when a report is written

    return pdl.describe()


def resolve_methods(methods: tuple[str, ...], paths: tuple[str, ...]) -> list[tuple[str, str]]:
    """Every registered (method, path) among those asked for; `name/path` pins one path.

    Unknown names are errors; a plain name runs on each of `paths` where it is registered.
    """
    registered = available()
    for path in paths:
        if path not in {p for _, p in registered}:
            raise ValueError(f"unknown path {path!r}; valid paths: reference, optimized")
    pairs = []
    for item in methods:
        name, _, pinned = item.partition("/")
        check_method(name, pinned or next((p for n, p in registered if n == name), "reference"))
        pairs += [(name, pinned)] if pinned else [(name, p) for p in paths if (name, p) in registered]
    return list(dict.fromkeys(pairs))


def largest_batches(session: Session, run: ThroughputRun) -> dict[tuple, int]:
    """`--batch max` resolved once, where the cache is largest (the longest context), for every context: each
    method spec's own largest batch (spec_key -> batch); in request mode every spec's is the largest batch
    every method fits. Empty where the run asks for no "max"."""
    if "max" not in run.batches:
        return {}
    longest = max(run.contexts)
    if run.requests:
        batch = largest_batch(session, run.at(longest), longest)
        return {spec_key(spec): batch for spec in method_specs(run.at(longest), longest)}
    return own_largest_batches(session, run.at(longest), longest)


def planned_rows(run: ThroughputRun, own: dict[tuple, int]) -> int:
    """How many rows the whole run measures: every method spec at each context and each batch given as a
    number, and at its own largest batch (`own`, largest_batches) where the run asks for "max"; a spec whose
    largest batch is one of the numbers is measured there once."""
    fixed = [int(b) for b in run.batches if b != "max"]
    return sum(len(specs) for context in run.contexts
               for specs in batch_plan(method_specs(run.at(context), context), fixed, own).values())


def measure_at_each_budget(session: Session, run: ThroughputRun, progress, earlier: list[dict],
                           own: dict[tuple, int]) -> list[dict]:
    """measure_all with the budget reference's settings at each context (ThroughputRun.at): where a percentage
    gives each context its own, the contexts that share one are measured together (a token count: all of them,
    in one call). `own`: the "max" batches (largest_batches). Rows `earlier` holds (a resumed run's) are kept,
    not measured again."""
    groups: dict = {}
    for context in run.contexts:
        groups.setdefault(run.sfi_at(context), []).append(context)
    rows = []
    if run.requests:
        shared = max(own.values(), default=None)  # request mode's one largest batch, for every method
        batches = tuple(shared if b == "max" else int(b) for b in run.batches)
        for contexts in groups.values():
            rows += measure_requests(session, replace(run.at(contexts[0]), contexts=tuple(contexts), batches=batches),
                                     progress, earlier)
        return rows
    for contexts in groups.values():
        rows += measure_all(session, replace(run.at(contexts[0]), contexts=tuple(contexts)), progress, earlier, own)
    return rows


def dense_kernel_check(session: Session, contexts: list[int], batches: list[int]) -> list[dict]:
    """Full-KV's Triton kernel and every SDPA backend at the run's attention shapes (SPEC 6)."""
    from sfibench.metrics.dense_kernels import benchmark_dense  # Triton: imported only when asked for

    cfg, rows = session.loaded.config, []
    session.cache = None  # the last run's KV cache (up to ~120 GB at 128K) is not needed any more
    if session.device.type == "cuda":
        torch.cuda.empty_cache()
    for batch in sorted(set(batches)):
        for context in contexts:
            for result in benchmark_dense(batch, cfg.num_kv_heads, cfg.group_size, cfg.head_dim, context,
                                          session.dtype, session.device):
                rows.append({"batch": batch, "context": context, **result})
    return rows


def check_memory_before_loading(run: ThroughputRun) -> None:
    """The run's one memory check before loading (the command calls it, and a resumed run before measuring
    what it lacks): every (context, batch), with its methods, against the device's memory by the estimate
    from the model's shape (a preset's or a checkpoint's config.json), before any weight is allocated or the
    run directory claimed. A GGUF file's shape is known once it loads: prepare_cache checks each shape then."""
    dims = config_before_loading(run.model)
    if dims is None:
        return
    dims = dims.rank_share(launched_ranks())  # under tensor parallelism, what one rank holds
    device = rank_device(resolve_device(run.device))
    dtype_bytes = DTYPE_BYTES[default_dtype(device.type) if run.dtype == "auto" else run.dtype]
    planned = planned_before_loading(device)
    for context in run.contexts:  # "max" was resolved from the same shape
        check_before_loading(run.at(context), context, dims, dtype_bytes, device.type == "cuda", planned)


def recorded_settings(run: ThroughputRun) -> dict:
    """The settings results.json records that the command line sets, as results.json spells them: what a
    --resume must repeat. Contexts and batches given as "max" are resolved only by a run, so they are not
    compared; a model is compared where its name is known before loading (a preset)."""
    from sfibench.models.presets import PRESETS
    from sfibench.reporting.results import to_jsonable

    name = PRESETS[run.model].name if run.model in PRESETS else None
    settings = to_jsonable(run.record(name))
    unknown = {"model": name is None, "contexts": "max" in run.contexts, "batches": "max" in run.batches}
    return {key: value for key, value in settings.items() if not unknown.get(key)}


def run_throughput(run: ThroughputRun, console: Console) -> Path | None:
    """Run the benchmark into a claimed run directory and return it (results.json, plots, report.md). Under
    tensor parallelism every rank measures (their collectives keep them in step) and rank 0 alone claims,
    writes and returns the directory; the other ranks return None."""
    with ranks(rank_device(resolve_device(run.device))) as parallel:
        if not parallel.is_main:
            measure(run, Session.open(run.model, run.device, run.dtype, parallel=parallel), Console(quiet=True))
            return None
        with claimed_run_dir(run.out, "throughput", overwrite=run.overwrite) as run_dir:
            session = Session.open(run.model, run.device, run.dtype, parallel=parallel)
            save(run_dir, *measure(run, session, console))
    return run_dir


def resume_throughput(run: ThroughputRun, console: Console) -> Path:
    """`--resume`: a run whose results.json is whole gets its report drawn, nothing measured again; a stopped
    run (`complete` False) measures only the rows it lacks, into the same folder. The settings given must be
    the run's recorded ones."""
    with claimed_run_dir(run.out, "throughput", resume=True) as run_dir:
        earlier = read_results(run_dir)
        check_same_settings(earlier["config"], recorded_settings(run), run_dir)
        if earlier["results"].get("complete", True):
            render(run_dir)
            return run_dir
        check_memory_before_loading(run)
        cfg, results, ran_with = measure(run, Session.open(run.model, run.device, run.dtype), console,
                                         earlier["results"]["rows"])
        ran_with["resumed_from"] = [*earlier["provenance"].pop("resumed_from", []), earlier["provenance"]]
        save(run_dir, cfg, results, ran_with)
    return run_dir


def save(run_dir: Path, cfg: dict, results: dict, ran_with: dict) -> None:
    """Write results.json and draw the report; a stopped run then stops the command, saying what it kept and
    how to continue."""
    write_results(run_dir, "throughput", cfg, results, provenance_info=ran_with)
    render(run_dir)
    if not results["complete"]:
        kept = results["progress"]
        raise RunInterrupted(f"stopped; {kept['rows']} of {kept['planned']} measurements (a method at a "
                             f"context and batch) are saved in {run_dir} and its report.md covers them. To "
                             f"continue, repeat the command with --out {run_dir} --resume")


def measure(run: ThroughputRun, session: Session, console: Console,
            earlier: list[dict] = ()) -> tuple[dict, dict, dict]:
    """Every method at every shape of the run: results.json's config, results and provenance (taken while the
    steps' thread count holds). Rows `earlier` holds (a resumed run's) are kept, not measured again. Ctrl-C or
    SIGTERM after a row finished stops the measuring and returns what finished, `complete` False (before any
    row finished it stops the run)."""
    with idle_cores_only(session.device, run.threads):  # a busy core would stall every step's threads
        steps = run.steps
        if not run.requests:  # request mode checks its prompts and generation itself, in its own words
            check_context_limit(session.loaded.config, [c for c in run.contexts if c != "max"], steps)
        if "max" in run.contexts:  # a GGUF file, whose limit is known only now it has loaded
            run = replace(run, contexts=resolve_contexts(run.contexts, session.max_tokens, steps))
        contexts = list(run.contexts)
        cfg = run.record(session.loaded.config.name)
        bandwidth = measure_copy_bandwidth(session.device)
        shapes = (f"prompts {contexts}, batches {list(run.batches)}, {steps} generated tokens per request x "
                  f"{run.repeats} repeats" if run.requests else
                  f"contexts {contexts}, batches {list(run.batches)}, {steps} steps x {run.repeats} repeats")
        console.print(f"copy bandwidth {bandwidth / 1e9:,.0f} GB/s on {session.device}; {len(run.methods)} methods, "
                      f"{shapes}")

        rows: list[dict] = []

        def progress(row: dict) -> None:
            rows.append(row)
            console.print(f"  {row['method']}/{row['path']} ctx {row['context']:,} B={row['batch']}: "
                          f"{row['tokens_per_s']:,.1f} tok/s")

        own = largest_batches(session, run)
        try:
            measure_at_each_budget(session, run, progress, earlier, own)
            complete = True
        except KeyboardInterrupt:
            if not rows:
                raise  # nothing finished: the claimed directory is removed on the way out
            complete = False
        if not run.requests:  # request rows have no bytes model or floors to compare against
            add_comparisons(rows, run, session.loaded.config, session.cache_dtype_bytes, bandwidth)
        results = {
            # a stopped run keeps every finished row; `--resume` measures the rest
            "complete": complete, "progress": {"rows": len(rows), "planned": planned_rows(run, own)},
            "rows": rows, "copy_bandwidth_gb_s": bandwidth / 1e9, "dtype": str(session.dtype).removeprefix("torch."),
            "weights": "random weights at the real shape" if session.loaded.config.source == "random" else "real weights",
            # the kernels the loaded model decodes with, chosen when it was loaded (models/fused.DecodeKernels)
            "fused_elementwise": session.loaded.kernels.fused,
            "decode_gemv": session.loaded.kernels.decode_gemv(),
            # the norms' weights moved into the qkv and gate_up weights in place (Decoder.fold_input_norms)
            "input_norms_folded": session.loaded.kernels.norms_folded,
            "pdl": _pdl_state(),
            "threads": torch.get_num_threads(),  # torch's CPU threads the steps ran on (--threads, or the default)
            "dense_kernels": dense_kernel_check(session, contexts, [r["batch"] for r in rows])
            if run.dense_kernels and complete else [],
            # tensor parallelism: the ranks (processes) the model was split over, each holding 1/tp of the KV
            # heads; the rows' bytes and floors are one rank's
            "tp": session.parallel.world_size,
            "interconnect": interconnect(session.parallel, session.device),
        }
        return cfg, results, provenance()
