"""A results.json flattened into named metrics: what `sfibench report` puts side by side and `check` gates.

Each measuring command stores its numbers in its own shape; this module reads each shape once and
returns flat `Metric`s with a stable key, the direction that counts as better, a 95% interval where
the run measured one, and the context it was measured at (the x axis of comparison plots). Only the
saved document is read, never engine objects, so the gate keeps working while the engine changes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from functools import partial

from sfibench import registry
from sfibench.metrics.quality import mean_ci
from sfibench.reporting.speedup_claims import speedup_claim
from sfibench.reporting.stability_document import segments
from sfibench.reporting.throughput_report import method_label

HIGHER, LOWER, SAME, INFO = "higher", "lower", "same", "info"  # which way is better; INFO is never gated


@dataclass(frozen=True)
class Metric:
    command: str
    series: str  # what was measured: a method (and task) or a stability measure
    context: int | None  # tokens; None when the metric is not tied to one context
    name: str  # the quantity: kl, accuracy, tokens_read_mean, ...
    value: float | None
    better: str
    unit: str = ""
    low: float | None = None  # 95% interval, when the run measured one
    high: float | None = None
    device_bound: bool = False  # a speed figure: comparable only between runs on the same device
    # a ratio the run does not support: speedup_claims' short verdict ("same tokens", ...), so a comparison
    # shows "no difference measured" with why rather than the number; "" where the figure stands
    verdict: str = ""

    @property
    def key(self) -> str:
        where = "" if self.context is None else f"@{self.context}"
        return f"{self.command}/{self.series}{where}/{self.name}"


def extract(document: dict) -> list[Metric]:
    """Every metric of one results.json document, in a stable order."""
    command = document.get("command")
    if command not in EXTRACTORS:
        raise ValueError(f"no metrics are defined for `{command}` runs")
    return EXTRACTORS[command](document)


def device_identity(provenance: dict) -> str:
    """The hardware a speed figure belongs to: the GPU's name, or for a CPU its model and core count."""
    device = provenance.get("device") or "unknown"
    if device == "cpu":
        return f"cpu: {provenance.get('cpu')} x{provenance.get('cpu_count')}"
    return device


# --------------------------------------------------------------------------------------------------
# quality: per (task, context, method, retention) cell, intervals from the per-sample records

QUALITY_METRICS = (  # (record field, metric name, better, unit)
    ("score", "accuracy", HIGHER, "share of samples"),
    ("kl", "kl", LOWER, "nats"),
    ("top1_agreement", "top1_agreement", HIGHER, "share of steps"),
    ("token_agreement", "token_agreement", HIGHER, "share of tokens"),
    ("measured_retention", "measured_retention", SAME, "tokens read / KV length"),
)


def _quality(document: dict) -> list[Metric]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in document.get("samples") or []:
        groups[(record["task"], record["context"], record["method"], record["retention"])].append(record)
    metrics = []
    for (task, context, method, retention), records in sorted(groups.items(), key=_cell_order):
        series = f"{task} {method}" + ("" if retention is None else f"@{retention:g}")
        for field, name, better, unit in QUALITY_METRICS:
            values = [r[field] for r in records if r.get(field) is not None]
            if any(field in r.get("non_finite", ()) for r in records) or (
                    values and any(field in r and r[field] is None for r in records)):
                values = [math.nan]  # some samples' outputs were not finite (saved as null): so is the mean
            if values and not (method == registry.dense().name and name in ("kl", "top1_agreement", "token_agreement")):
                mean, low, high = (interval(values, scores=name == "accuracy") if all(map(math.isfinite, values))
                                   else (math.nan, None, None))
                metrics.append(Metric("quality", series, context, name, mean, better, unit, low, high))
        nlls = [r["nll"] for r in records if r.get("nll") is not None]
        if nlls:
            mean, low, high = interval(nlls)  # perplexity is exp(mean NLL): its interval maps through exp
            metrics.append(Metric("quality", series, context, "perplexity", math.exp(mean), LOWER, "",
                                  math.exp(low), math.exp(high)))
        if any(kind in r["steps_by_kind"] for r in records for kind in ("slow", "fast")):  # a refreshing method
            steps = defaultdict(int)
            for record in records:
                for kind, count in record["steps_by_kind"].items():
                    steps[kind] += count
            total = sum(steps.values())
            metrics.append(Metric("quality", series, context, "slow_step_share", steps["slow"] / total if total else None,
                                  SAME, "slow steps / steps"))
    return metrics


def interval(values: list[float], scores: bool = False) -> tuple[float, float, float]:
    """(mean, low, high) with the 95% interval of sfibench's quality reports (Wilson for 0/1 scores,
    else bootstrap). Measurements that never varied have no spread to show; scores always get
    Wilson's interval, which is wide at 0/n and n/n too."""
    if not scores and min(values) == max(values):
        return values[0], values[0], values[0]
    ci = mean_ci(values)
    return ci["mean"], ci["low"], ci["high"]


def _cell_order(item: tuple) -> tuple:
    task, context, method, retention = item[0]
    return task, context, method != registry.dense().name, method, retention or 0.0


# --------------------------------------------------------------------------------------------------
# stability: the summary figures of each analysed segment

STABILITY_FIGURES = (  # (path in results, better, unit)
    ("consecutive.topk.within.overlap_mean", SAME, "overlap"),
    ("consecutive.topk.across.overlap_mean", SAME, "overlap"),
    ("consecutive.mass.within.jaccard_mean", SAME, "Jaccard"),
    ("consecutive.mass.across.jaccard_mean", SAME, "Jaccard"),
    ("recall.stale.mean", HIGHER, "share of attention mass"),
    ("recall.fresh.mean", HIGHER, "share of attention mass"),
    ("recall.streaming.mean", SAME, "share of attention mass"),
    ("recall.stale.tokens_read_mean", SAME, "tokens"),
    ("sentences.starts", SAME, "sentences"),
    ("perplexity", LOWER, ""),
)


def _stability(document: dict) -> list[Metric]:
    """The figures of each segment; a run of one text without contexts is the series "text", as runs saved
    before segments existed are."""
    metrics = []
    for segment in segments(document["results"]):
        series = "text" if segment.get("context_asked") is None else segment["label"]
        for path, better, unit in STABILITY_FIGURES:
            value = segment
            for part in path.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            metrics.append(Metric("stability", series, None, path, value, better, unit))
    return metrics


# --------------------------------------------------------------------------------------------------
# throughput: accounting is exact; speed is gated only as a ratio to Full-KV on the same device


def _throughput(document: dict) -> list[Metric]:
    metrics = []
    for row in document["results"]["rows"]:
        metric = partial(Metric, "throughput", f"{method_label(row)}/{row['path']} B={row['batch']}", row["context"])
        spread = row["tokens_per_s_spread"]
        metrics.append(metric("tokens_per_s", row["tokens_per_s"], INFO, "tokens/s", spread["min"], spread["max"],
                              device_bound=True))
        metrics.append(metric("tokens_read_mean", row["tokens_read_mean"], SAME, "tokens per layer and KV head"))
        metrics += [metric(f"tokens_read_{kind}", tokens, SAME, "tokens per layer and KV head")
                    for kind, tokens in sorted(row.get("tokens_read_by_kind", {}).items())]
        if "slow_steps" in row:
            metrics.append(metric("slow_steps", row["slow_steps"], SAME, "steps"))
        if row.get("mean_slow_interval") is not None:
            metrics.append(metric("mean_slow_interval", row["mean_slow_interval"], SAME, "steps"))
        if row.get("speedup_vs_full_kv") is not None:
            claim = speedup_claim(row, document["results"]["rows"])
            low, high = (claim.low, claim.high) if claim else (None, None)
            metrics.append(metric("speedup_vs_full_kv", row["speedup_vs_full_kv"], HIGHER, "x Full-KV", low, high,
                                  device_bound=True, verdict=claim.verdict if claim else ""))
    return metrics


# --------------------------------------------------------------------------------------------------
# profile: milliseconds per component (never gated: eager, one short window)


def _profile(document: dict) -> list[Metric]:
    result = document["results"]
    series = f"{result['method']}/{result['path']}"
    metrics = [Metric("profile", series, result["context"], f"{name} ms", ms, INFO, "ms per step", device_bound=True)
               for name, ms in sorted(result["ms_per_step"].items())]
    metrics.append(Metric("profile", series, result["context"], "wall ms", result["wall_ms_per_step"], INFO,
                          "ms per step", device_bound=True))
    return metrics


EXTRACTORS = {"quality": _quality, "stability": _stability, "throughput": _throughput, "profile": _profile}
