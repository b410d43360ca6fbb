"""A quality run as its runner takes it (`QualityRun`, built and checked by commands/quality_options.py),
and the checks the runner repeats once the model's limit and tokenizer are known: contexts the model can hold
with room for an answer, each context once, and a --resume of the same settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sfibench.core.errors import UsageError
from sfibench.workloads.base import ContextSizeError

MAX_MARGIN = 8  # tokens kept free below the model's limit by --ctx max, beyond the answer budget
SAME_ON_RESUME = ("model", "methods", "tasks", "contexts", "retentions", "samples", "seed", "chat", "dtype",
                  "sfi_variant", "path", "engine", "graphs")
# what runs written before an option existed ran with
BEFORE_OPTION = {"path": "reference", "engine": "sfibench", "graphs": False}
# What decodes: sfibench's own decoder, or the model loaded by transformers with the methods applied through
# sfibench.hf (any architecture transformers runs through its attention interface; the reference path)
ENGINES = ("sfibench", "transformers")


def check_distinct(contexts: list) -> None:
    """Each context once: a cell is (task, context, method, retention), so a repeat would merge two."""
    repeated = sorted({f"{c:,}" if isinstance(c, int) else c for c in contexts if contexts.count(c) > 1})
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


@dataclass(frozen=True)
class QualityRun:
    """Everything `sfibench quality` runs with, checked and normalised by `quality_run` before the model loads."""

    model: str
    methods: tuple[str, ...]  # the dense method first: every other method is compared with it
    tasks: tuple[str, ...]  # built-in tasks, then one `longbench:<stem>` per LongBench file
    files: tuple[Path, ...]  # the LongBench files
    contexts: tuple[int | str, ...]  # tokens, or "max" until the model is loaded
    retentions: tuple[float, ...]
    samples: tuple[int, ...]  # one per context
    batch: int = 4
    seed: int = 0
    chat: bool = True
    device: str = "auto"
    dtype: str = "auto"
    path: str = "reference"  # the implementation path every method runs on
    engine: str = "sfibench"  # one of ENGINES
    graphs: bool | None = None  # decode steps replayed from CUDA graphs; None: on with a GPU (engine sfibench)
    longbench: Path | None = None
    sfi_variant: tuple[tuple[str, object], ...] = ()  # SFI settings changed for an ablation (sfi/config.with_variant)
    sfi_preset: str | None = None  # the authors' operating point(s) the retentions came from
    out: Path | None = None
    overwrite: bool = False
    resume: bool = False  # continue a stopped run in `out` with the same settings
    threads: int | None = None  # torch's CPU threads; None: torch's own count

    @property
    def variant(self) -> dict | None:
        """The ablation as results.json records it: None when SFI runs as specified."""
        return dict(self.sfi_variant) or None


def check_resume(earlier: dict, settings: dict, run_dir: Path) -> None:
    """--resume continues only a run of the same settings: its finished cells must mean the same."""
    changed = [key for key, value in settings.items() if earlier.get(key, BEFORE_OPTION.get(key)) != value]
    if changed:
        raise UsageError(f"--resume: {run_dir} was run with different {', '.join(changed)}; repeat its settings "
                         "or choose another --out")
