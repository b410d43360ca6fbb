"""The regression gate's verdicts: one baseline metric against the current run's, within its tolerance.

Pure functions of two results.json documents and the baseline's tolerance rules, so they are tested
on fabricated documents. Verdicts:

- ok: within tolerance; improved: better by more than the tolerance (passes; bless it with --update);
- regressed: worse by more than the tolerance (for a speed: even the current run's best timed pass); changed: a metric that must not move (accounting,
  trigger counts) moved; missing: the current run no longer measures it; non-finite: the current value is NaN,
  infinite or null where the baseline's is a number. These four fail the gate.
- skipped: a speed figure from another device, or a metric the baseline says not to judge; untracked: no tolerance rule covers it; new: only the
  current run has it. These are shown and pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sfibench.reporting.baseline import Baseline, BaselineError, Tolerance
from sfibench.reporting.run_metrics import HIGHER, INFO, LOWER, Metric, device_identity, extract

FAILING = ("regressed", "changed", "missing", "non-finite")
NON_FINITE = "the current run's value is not a finite number (NaN, infinity or null) where the baseline's is"
_EXACT_SLACK = 1e-9  # relative: what survives a float's round trip through JSON is not a change


@dataclass(frozen=True)
class Verdict:
    key: str
    baseline: Metric | None
    current: Metric | None
    tolerance: Tolerance | None
    verdict: str
    note: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def check_comparable(name: str, baseline: dict, current: dict) -> None:
    """A baseline only says something about a run of the same command on the same model."""
    for field, what in (("command", "command"), ("model", "model")):
        had = baseline["command"] if field == "command" else baseline["config"].get("model")
        got = current["command"] if field == "command" else current["config"].get("model")
        if had != got:
            raise BaselineError(f"run {name!r}: the baseline is a `{baseline['command']}` run of "
                                f"{baseline['config'].get('model')}, the current one a `{current['command']}` run "
                                f"of {current['config'].get('model')}; compare runs of the same {what}")


def compare(name: str, baseline_doc: dict, current_doc: dict, baseline: Baseline) -> list[Verdict]:
    check_comparable(name, baseline_doc, current_doc)
    same_device = device_identity(baseline_doc["provenance"]) == device_identity(current_doc["provenance"])
    current = {m.key: m for m in extract(current_doc)}
    verdicts = []
    for metric in extract(baseline_doc):
        tolerance = baseline.tolerance(metric.key)
        now = current.pop(metric.key, None)
        if now is not None and not _finite(now.value) and _finite(metric.value):
            # whatever the metric's rule (informational, untracked, not judged here): a number that became
            # NaN or infinite is a broken run, never a pass
            verdicts.append(Verdict(metric.key, metric, now, tolerance, "non-finite", NON_FINITE))
        elif metric.better == INFO:
            continue
        elif metric.device_bound and not same_device:
            note = (f"measured on {device_identity(baseline_doc['provenance'])}, now "
                    f"{device_identity(current_doc['provenance'])}")
            verdicts.append(Verdict(metric.key, metric, now, tolerance, "skipped", note))
        elif now is None:
            verdicts.append(Verdict(metric.key, metric, None, tolerance, "missing"))
        elif tolerance is None:
            verdicts.append(Verdict(metric.key, metric, now, None, "untracked", "no tolerance rule matches"))
        elif tolerance.skip:
            verdicts.append(Verdict(metric.key, metric, now, tolerance, "skipped", tolerance.skip))
        else:
            verdict = judge(metric, now, tolerance)
            verdicts.append(Verdict(metric.key, metric, now, tolerance, verdict,
                                    NON_FINITE if verdict == "non-finite" else ""))
    verdicts += [Verdict(key, None, metric, None, "new") for key, metric in current.items() if metric.better != INFO]
    return verdicts


def judge(baseline: Metric, current: Metric, tolerance: Tolerance) -> str:
    if not _finite(current.value):  # NaN, infinity, or null (how results.json writes a non-finite number)
        return "ok" if not _finite(baseline.value) else "non-finite"
    if not _finite(baseline.value):
        return "changed"
    allowed = tolerance.allowed(baseline.value) + _EXACT_SLACK * max(1.0, abs(baseline.value))
    delta = current.value - baseline.value
    if baseline.better not in (HIGHER, LOWER):
        return "changed" if abs(delta) > allowed else "ok"
    sign = 1.0 if baseline.better == HIGHER else -1.0  # gains are positive either way
    judged = sign * delta
    if baseline.device_bound and current.low is not None and current.high is not None:
        # A speed regresses only if even the current run's best timed pass is worse than allowed, so one
        # pass slowed by a neighbour on the machine cannot fail the gate (the throughput report's rule).
        judged = sign * ((current.high if sign > 0 else current.low) - baseline.value)
    if judged < -allowed:
        return "regressed"
    return "improved" if sign * delta > allowed else "ok"
