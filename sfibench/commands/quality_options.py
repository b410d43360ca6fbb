"""`sfibench quality`'s options checked and built into the run (runners/quality_inputs.QualityRun), before the
model loads where possible.

Unknown tasks or methods, a method without the requested path, a budget that is no share of the context or
too small for a method's fixed parts, a context a preset cannot hold, sample counts that do not match the
contexts, a LongBench path that is missing or malformed: each is one error naming the option. What needs the
model's tokenizer (the answer budget beside the longest prompt, `--ctx max`) the runner checks once it loads.
"""

from __future__ import annotations

from pathlib import Path

from sfibench import registry
from sfibench.commands.options import (
    check_device_needs,
    check_dtype,
    check_memory_before_loading,
    check_path,
    check_session_options,
    device_kind,
    parse_tokens,
    split_list,
)
from sfibench.core.budget import Budget
from sfibench.core.errors import UsageError
from sfibench.models.presets import PRESETS
from sfibench.registry import check_method
from sfibench.runners.quality_inputs import ENGINES, MAX_MARGIN, QualityRun, check_distinct, check_fits
from sfibench.sfi.config import preset_retention
from sfibench.workloads.longbench import PREFIX, load_records, longbench_files
from sfibench.workloads.tasks import expand_tasks, get_task

DEFAULT_METHODS = tuple(registry.names())
DEFAULT_TASKS = ("niah_single", "niah_multiturn", "ppl")
DEFAULT_CONTEXTS = ("2k",)
DEFAULT_RETENTIONS = (0.15, 0.5)  # the paper: SFI matches Full-KV at 15-20%, eviction needs ~50%
DEFAULT_SAMPLES = (4,)


def parse_retentions(values, contexts=(), option: str = "--budget") -> list[float]:
    """Each budget as the retention it is, the share of the context every method reads: a fraction (0.15) or a
    percentage (15%) as given, whole tokens (600) over the one context of `contexts` (a cell is one retention,
    and a token count is a different share of each context)."""
    out = []
    for value in values:
        budget = Budget.parse(str(value), option, fractions=True)
        if budget.percent is not None:
            out.append(budget.percent / 100)
            continue
        if len(contexts) != 1 or parse_context(contexts[0]) == "max":
            raise UsageError(f"{option} {value} is whole tokens, a different share of each context; give it with "
                             "exactly one --ctx in tokens, or give a share such as 15%")
        context = parse_context(contexts[0])
        out.append(budget.resolve(context, option) / context)
    return out


def parse_context(text) -> int | str:
    """'2k' -> 2048, '3000' -> 3000, 'max' -> 'max' (the largest prompt the model can hold)."""
    return parse_tokens(str(text), "--ctx", allow_max=True)


def parse_samples(values, contexts: int) -> list[int]:
    """One count for every context, or one per context; each a whole number >= 1."""
    counts = []
    for value in values:
        if not str(value).strip().isdigit() or int(value) < 1:
            raise UsageError(f"--samples {value!r} is not a whole number >= 1; give one count (4) or one per "
                             "--ctx (20,20,10)")
        counts.append(int(value))
    if len(counts) not in (1, contexts):
        raise UsageError(f"--samples has {len(counts)} counts for {contexts} contexts; give one count, or one "
                         "per --ctx")
    return counts * contexts if len(counts) == 1 else counts


def quality_run(model: str = "smollm2-135m", methods=DEFAULT_METHODS, tasks=DEFAULT_TASKS, contexts=DEFAULT_CONTEXTS,
                retentions=None, samples=DEFAULT_SAMPLES, *, batch: int = 4, seed: int = 0, chat: bool = True,
                device: str = "auto", dtype: str = "auto", path: str = "reference", engine: str = "sfibench",
                longbench: Path | str | None = None, sfi_variant: dict | None = None, sfi_preset: str | None = None,
                out: Path | str | None = None, overwrite: bool = False, resume: bool = False,
                tp: int = 1, graphs: bool | None = None, threads: int | None = None,
                budget_option: str = "--budget") -> QualityRun:
    """Check a quality run's options as given (strings or numbers) and build the run from them.

    `retentions`: budgets as `--budget` takes them (0.15, 15% or 600 tokens with one context), named
    `budget_option` in errors. `sfi_variant` changes SFI settings for an ablation, e.g. {"use_nms": False}; `sfi_preset`
    (sfi/config.PRESETS, in place of `retentions`, one context) runs every method at the budget of the
    authors' operating point."""
    if overwrite and resume:
        raise UsageError("give --overwrite (replace the run in --out) or --resume (continue it), not both")
    variant = dict(sfi_variant or {})
    retentions = _preset_retentions(sfi_preset, contexts, retentions, budget_option)
    if not methods:
        raise UsageError(f"--methods is empty; give at least one of {', '.join(registry.names())}")
    for method in methods:  # the names now; each method's paths once its module loads, below
        registry.check_name(method)
    check_path(path, "--path")
    tasks = expand_tasks(list(tasks))  # `ruler`: RULER's 13 tasks; each needs its package, checked here
    for task in tasks:
        get_task(task)
    if longbench and not Path(longbench).exists():
        raise UsageError(f"--longbench {longbench} does not exist; pass a <dataset>.jsonl file or a directory of them")
    files = longbench_files(longbench) if longbench else []
    for file in files:
        load_records(file)  # malformed files fail now, not after the model has loaded
    tasks += [PREFIX + f.stem for f in files]
    if not tasks:
        raise UsageError("no tasks to run; give --tasks or --longbench")
    if not contexts:
        raise UsageError("--ctx is empty; give prompt lengths such as 2k,4k or max")
    contexts = [parse_context(c) for c in contexts]
    check_distinct(contexts)
    samples = parse_samples(samples, len(contexts))
    if batch < 1:
        raise UsageError(f"--batch must be at least 1, got {batch}")
    if model in PRESETS:
        for context in contexts:
            if context != "max":
                check_fits(context, PRESETS[model].max_context, model)
    check_engine(engine, model, device, dtype, path)
    check_device_needs(device, "--path", [path], graphs=bool(graphs))
    if graphs and (engine != "sfibench" or tp > 1):
        raise UsageError("--graphs replays sfibench's own decoder on one GPU; use --no-graphs with "
                         f"{'--engine transformers' if engine != 'sfibench' else f'--tp {tp}'}")
    if engine == "sfibench":  # a batch of the longest prompts against the memory, before any weight is allocated
        check_memory_before_loading(model, [batch], contexts, MAX_MARGIN, device, dtype, tp=tp)
    # the methods' own checks, which load their modules (and torch), before any weights load
    from sfibench.runners.quality_batch import conditions

    methods = list(dict.fromkeys([registry.dense().name, *methods]))
    for method in methods:
        check_method(method, path)
    if model in PRESETS:
        for context in contexts:
            if context != "max":
                conditions(methods, retentions, context, variant or None, path)  # every budget fits its method
    return QualityRun(model, tuple(methods), tuple(tasks), tuple(files), tuple(contexts), tuple(retentions),
                      tuple(samples), batch=batch, seed=seed, chat=chat, device=device, dtype=dtype, path=path,
                      engine=engine, graphs=graphs,
                      longbench=None if longbench is None else Path(longbench), sfi_variant=tuple(variant.items()),
                      sfi_preset=sfi_preset, out=None if out is None else Path(out), overwrite=overwrite,
                      resume=resume, threads=threads)


def check_engine(engine: str, model: str, device: str, dtype: str, path: str) -> None:
    """--engine and the model, device and dtype it loads, before anything loads."""
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine!r} is not one of {', '.join(ENGINES)}")
    if engine == "sfibench":
        check_session_options(model, device, dtype)
        return
    from sfibench.hf.loading import check_transformers_model

    if path != "reference":
        raise UsageError(f"--engine transformers runs the reference path; drop --path {path} or use --engine sfibench")
    check_transformers_model(model)
    check_dtype(dtype)
    device_kind(device)  # a device this machine has


def _preset_retentions(preset: str | None, contexts, retentions, option: str = "--budget") -> list[float]:
    """The retentions to run: given, the default ones, or those that are the presets' budgets at the context.

    `preset` is one name or several, comma-separated (paper-2k,paper-4k: both share each prefill). A
    preset's budget is fixed in tokens, so its retention differs per context; the run's conditions are
    the same at every context, hence one context per preset run."""
    if preset is None:
        return list(DEFAULT_RETENTIONS) if retentions is None else parse_retentions(retentions, contexts, option)
    if retentions is not None:
        raise UsageError(f"give {option} or --sfi-preset, not both: the preset fixes the budget in tokens")
    if len(contexts) != 1 or parse_context(contexts[0]) == "max":
        raise UsageError(f"--sfi-preset needs exactly one --ctx in tokens, got {','.join(map(str, contexts))}: "
                         "its budget is fixed in tokens, so each context is a run of its own")
    return [preset_retention(name, parse_context(contexts[0])) for name in split_list(preset, "--sfi-preset")]
