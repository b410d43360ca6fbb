"""A quality run's per-sample records, saved as they arrive so a stopped run keeps what it finished.

A record is one sample under one condition (method at a retention). After every condition of every
batch the whole set is rewritten atomically into results.json with the cells recomputed from it, so
Ctrl-C or a crash loses at most the decode pass in flight, and --resume runs only what is missing.
Records are kept in the order an uninterrupted run produces them (context, task, batch, condition,
sample), so a resumed run's results.json, and every mean and interval in its cells, equal those of
an uninterrupted run with the same settings and --batch.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from sfibench.reporting.quality_summary import summarise
from sfibench.reporting.results import write_results
from sfibench.runners.quality_batch import condition_label


def _key(record: dict) -> tuple:
    return record["task"], record["context"], record["index"], condition_label(record["method"], record["retention"])


class QualityLedger:
    def __init__(self, run_dir: Path | None, config: dict, labels: list[str], provenance: dict, earlier: dict | None,
                 started: float):
        self.run_dir, self.config, self.labels, self.provenance = run_dir, config, labels, provenance
        self.records = {_key(r): r for r in earlier["samples"]} if earlier else {}
        results = earlier["results"] if earlier else {}
        self.timings: dict[str, float] = dict(results.get("seconds_by_task", {}))
        self.wall_before = results.get("wall_s", 0.0)  # wall time counts every session of the run
        self.started = started
        self.task_clock: tuple[str, float, float] | None = None
        self.total = sum(count for count in config["samples"]) * len(config["tasks"]) * len(labels)

    def has(self, task: str, context: int, indices, label: str) -> bool:
        return all((task, context, index, label) in self.records for index in indices)

    def start_task(self, task: str, context: int) -> None:
        """Time from here on counts towards `task@context` (added to what earlier sessions spent)."""
        key = f"{task}@{context}"
        self.task_clock = key, time.time(), self.timings.get(key, 0.0)

    def add(self, records: list[dict]) -> None:
        """Keep the records and save; a record the ledger already holds keeps its first version. A figure that
        is not a finite number (a model whose weights or activations hold NaN or overflow) is saved as null,
        and the record's `non_finite` names each such field, so a reader tells it from one not measured."""
        for record in records:
            bad = sorted(key for key, value in record.items() if isinstance(value, float) and not math.isfinite(value))
            self.records.setdefault(_key(record), {**record, "non_finite": bad} if bad else record)
        self.save(complete=False)

    def save(self, complete: bool) -> None:
        """Rewrite results.json; a ledger without a run directory (a tensor-parallel rank other than 0) keeps
        its records in memory only."""
        if self.run_dir is None:
            return
        if self.task_clock is not None:
            key, began, before = self.task_clock
            self.timings[key] = before + time.time() - began
        records = sorted(self.records.values(), key=self._order)
        results = {"cells": summarise(records), "wall_s": self.wall_before + time.time() - self.started,
                   "seconds_by_task": self.timings, "complete": complete,
                   "progress": {"results": len(records), "planned": self.total}}
        write_results(self.run_dir, "quality", self.config, results, extra={"samples": records},
                      provenance_info=self.provenance)

    def _order(self, record: dict) -> tuple:
        cfg = self.config
        return (cfg["contexts"].index(record["context"]), cfg["tasks"].index(record["task"]),
                record["index"] // cfg["batch"], self.labels.index(_key(record)[3]), record["index"])
