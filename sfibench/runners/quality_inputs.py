"""Everything a user can get wrong about a quality run, checked before the model loads where possible.

Unknown tasks or methods, a method without the requested path, a retention outside (0, 1] or too
small for a method's fixed parts, a context a preset cannot hold, sample counts that do not match
the contexts, a LongBench path that is missing or malformed, an earlier run that --resume cannot
continue with these settings: each is one error naming the option. What needs the model's tokenizer
(the answer budget beside the longest prompt, `--ctx max`) is checked right after it loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sfibench import registry
from sfibench.core.budget import BudgetError
from sfibench.core.errors import UsageError
from sfibench.models.presets import PRESETS
from sfibench.options import parse_tokens
from sfibench.registry import check_method
from sfibench.runners.quality_batch import conditions
from sfibench.workloads.base import ContextSizeError
from sfibench.workloads.longbench import PREFIX, load_records, longbench_files
from sfibench.workloads.tasks import get_task

MAX_MARGIN = 8  # tokens kept free below the model's limit by --ctx max, beyond the answer budget
SAME_ON_RESUME = ("model", "methods", "tasks", "contexts", "retentions", "samples", "seed", "chat", "dtype",
                  "sfi_variant", "path")
BEFORE_OPTION = {"path": "reference"}  # what runs written before an option existed ran with


def parse_retentions(values) -> list[float]:
    """Each a share of the context in (0, 1]; '15%' is --budget's spelling and is refused here."""
    out = []
    for value in values:
        try:
            r = float(value)
        except (TypeError, ValueError):
            raise BudgetError(f"--retention {value!r} is not a number; give fractions of the context such as "
                              "0.15,0.5") from None
        if not 0 < r <= 1:
            raise BudgetError(f"retention {value} is outside (0, 1]; give fractions of the context such as 0.15")
        out.append(r)
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


def check_distinct(contexts: list) -> None:
    """Each context once: a cell is (task, context, method, retention), so a repeat would merge two."""
    repeated = sorted({str(c) for c in contexts if contexts.count(c) > 1})
    if repeated:
        raise UsageError(f"--ctx gives {', '.join(repeated)} more than once; list each length once")


def largest_context(limit: int, reserve: int) -> int:
    """The longest prompt that leaves `reserve` answer tokens and the margin: what --ctx max gives."""
    return limit - reserve - MAX_MARGIN


def check_fits(context: int, limit: int, model: str, reserve: int | None = None) -> None:
    """Before the model loads the answer budget is unknown (`reserve` None): only the limit is checked."""
    if reserve is None:
        if context + MAX_MARGIN >= limit:
            raise ContextSizeError(f"a {context}-token context exceeds {model}'s limit of {limit} tokens with room "
                                   "for an answer; --ctx max gives the longest prompt that fits")
    elif context > largest_context(limit, reserve):
        raise ContextSizeError(f"a {context}-token context exceeds {model}'s limit of {limit} tokens once "
                               f"{reserve} answer tokens and a margin of {MAX_MARGIN} are added; the longest "
                               f"prompt that fits is {largest_context(limit, reserve)}, which --ctx max gives")


@dataclass
class QualityInputs:
    """A quality run's lists, checked and normalised."""

    methods: list[str]  # Full-KV first: every other method is compared with it
    tasks: list[str]  # built-in tasks, then one `longbench:<stem>` per LongBench file
    files: list[Path]
    contexts: list[int | str]  # tokens, or "max" until the model is loaded
    retentions: list[float]
    samples: list[int]  # one per context


def check_inputs(model: str, methods, tasks, contexts, retentions, samples, batch: int,
                 longbench: Path | str | None, path: str, sfi_variant: dict | None) -> QualityInputs:
    retentions = parse_retentions(retentions)
    if not methods:
        raise UsageError("--methods is empty; give at least one of full_kv, sfi, streaming_llm, snapkv")
    methods = list(dict.fromkeys([registry.dense().name, *methods]))
    for method in methods:
        check_method(method, path)
    tasks = list(dict.fromkeys(tasks))
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
    if model in PRESETS:  # cheap checks before spending time on loading weights
        for context in contexts:
            if context != "max":
                check_fits(context, PRESETS[model].max_context, model)
                conditions(methods, retentions, context, sfi_variant, path)  # every budget fits its method
    return QualityInputs(methods, tasks, files, contexts, retentions, samples)


def check_resume(earlier: dict, settings: dict, run_dir: Path) -> None:
    """--resume continues only a run of the same settings: its finished cells must mean the same."""
    changed = [key for key, value in settings.items() if earlier.get(key, BEFORE_OPTION.get(key)) != value]
    if changed:
        raise UsageError(f"--resume: {run_dir} was run with different {', '.join(changed)}; repeat its settings "
                         "or choose another --out")
