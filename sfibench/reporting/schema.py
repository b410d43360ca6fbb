"""What every file sfibench reads back must hold: results.json of each command, baseline.json, tolerance rules.

The shapes are declared as data below, one entry per command kind: the fields a reader relies on and the
type of each. A field whose name ends in "?" may be absent; fields not declared are allowed, so a newer
writer can add optional fields without this module knowing them. `validate` walks a document against its
shape and raises one SchemaError naming the file, the first field that is wrong (as a path such as
`results.rows[3].tokens_per_s`), what was expected there and what to do. Readers call it before anything
is drawn, judged or written, so a damaged or hand-edited file changes nothing.

Type spellings: "int", "number" (int or float), "str", "bool", "null", "object", "list", "any", joined with
"|" for alternatives ("number|null"); a dict is an object with those fields; ListOf and MapOf are lists and
objects of one item shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sfibench.core.errors import UsageError


class SchemaError(UsageError):
    """A file sfibench wrote, or a manifest it reads, does not hold the fields it needs."""


@dataclass(frozen=True)
class ListOf:
    """A list whose every item has the shape `item`; `min_items` 1 refuses an empty list."""

    item: Any
    min_items: int = 0


@dataclass(frozen=True)
class MapOf:
    """An object with any keys, every value of the shape `value`."""

    value: Any


NUMBER = "number"
MAYBE_NUMBER = "number|null"  # results.json writes NaN and infinity as null

TOP_LEVEL = {"schema_version": "int", "command": "str", "config": "object", "provenance": "object",
             "results": "object"}

THROUGHPUT = {
    "config": {"model": "str"},
    "results": {
        "rows": ListOf({
            "method": "str", "path": "str", "context": "int", "batch": "int",
            "tokens_per_s": MAYBE_NUMBER,
            "tokens_per_s_spread": {"min": MAYBE_NUMBER, "max": MAYBE_NUMBER},
            "ms_per_step": MapOf({"p50": MAYBE_NUMBER, "max?": MAYBE_NUMBER}),
            "tokens_read_mean": MAYBE_NUMBER, "achieved_gb_s": MAYBE_NUMBER,
            "tokens_read_by_kind?": MapOf(MAYBE_NUMBER), "slow_steps?": "int", "mean_slow_interval?": MAYBE_NUMBER,
            "speedup_vs_full_kv?": MAYBE_NUMBER, "roofline_efficiency?": MAYBE_NUMBER,
            "roofline_speedup?": MAYBE_NUMBER, "floor_ms?": "null|" + "object", "publish?": "str|null",
        }, min_items=1),
        "dense_kernels?": ListOf({"batch": "int", "context": "int", "kernel": "str"}),
        # False: a stopped run's finished rows (`--resume` measures the rest)
        "complete?": "bool", "progress?": {"rows": "int", "planned": "int"},
    },
}

_PROFILE_PART = {"ms_per_step": MapOf(MAYBE_NUMBER), "ms_per_step_range?": MapOf(ListOf(MAYBE_NUMBER)),
                 "wall_ms_per_step": MAYBE_NUMBER}
PROFILE = {
    "config": {"model": "str"},
    "results": {"method": "str", "path": "str", "context": "int", "steps": "int", "step_kinds": ListOf("str"),
                "graphs": "bool", **_PROFILE_PART, "by_kind?": MapOf(_PROFILE_PART),
                "step_ms_by_kind?": MapOf(MAYBE_NUMBER)},
}

_SEGMENT = {"label": "str", "recall": MapOf("object"), "consecutive": "object", "steps?": "int",
            "perplexity?": MAYBE_NUMBER, "chance_topk_overlap?": MAYBE_NUMBER}
STABILITY = {
    "config": {"model": "str"},
    # a run of one text keeps its segment's fields at the top of results; a run of several lists them
    "results": {"segments?": ListOf(_SEGMENT, min_items=1)},
}

QUALITY_RECORD = {"task": "str", "index": "int", "context": "int", "method": "str", "retention": MAYBE_NUMBER,
                  "steps_by_kind": MapOf("int"), "score?": MAYBE_NUMBER, "kl?": MAYBE_NUMBER,
                  "top1_agreement?": MAYBE_NUMBER, "token_agreement?": MAYBE_NUMBER,
                  "measured_retention?": MAYBE_NUMBER, "nll?": MAYBE_NUMBER, "non_finite?": ListOf("str")}
QUALITY_CELL = {"task": "str", "context": "int", "method": "str", "retention": MAYBE_NUMBER, "n": "int",
                "accuracy": MAYBE_NUMBER, "perplexity": MAYBE_NUMBER, "kl?": MAYBE_NUMBER,
                "top1_agreement?": MAYBE_NUMBER, "ci_low?": MAYBE_NUMBER, "ci_high?": MAYBE_NUMBER,
                "measured_retention?": MAYBE_NUMBER}
QUALITY = {
    # each setting's type where the run records it (--resume and the report compare and print them)
    "config": {"model?": "str", "methods?": ListOf("str"), "tasks?": ListOf("str"), "contexts?": ListOf("int"),
               "retentions?": ListOf(MAYBE_NUMBER), "samples?": ListOf("int"), "batch?": "int", "seed?": "int"},
    "results": {"cells": ListOf(QUALITY_CELL), "complete?": "bool"},
    "samples?": ListOf(QUALITY_RECORD),
}

_POINT = {"value": MAYBE_NUMBER, "low": MAYBE_NUMBER, "high": MAYBE_NUMBER}
COMPARISON = {
    "results": {"runs": ListOf("object", min_items=1),
                "rows": ListOf({"series": "str", "name": "str", "context": "int|null", "unit": "str",
                                "values": ListOf(_POINT, min_items=1)}),
                "differing_settings?": ListOf({"setting": "str", "values": ListOf("str")})},
}

RESULTS = {"throughput": THROUGHPUT, "profile": PROFILE, "stability": STABILITY, "quality": QUALITY,
           "report": COMPARISON}

TOLERANCE = {"match": "str", "abs?": MAYBE_NUMBER, "rel?": MAYBE_NUMBER, "how?": "str", "skip?": "str|null"}
BASELINE = {"format?": "int", "runs": MapOf({"argv": ListOf("str", min_items=1), "env?": MapOf("str")}),
            "tolerances?": ListOf(TOLERANCE), "history?": ListOf("object")}


def validate_results(document: Any, file: Path | str) -> dict:
    """A results.json document with every field its command's readers need; `document` back."""
    validate(document, TOP_LEVEL, file)
    shape = RESULTS.get(document["command"])
    if shape is not None:  # a command no reader knows is refused by that reader, by name
        validate(document, shape, file)
    return document


def validate_baseline(manifest: Any, file: Path | str) -> dict:
    """A baseline.json with its runs and tolerance rules readable: each rule one bound, finite, not negative."""
    validate(manifest, BASELINE, file)
    if not manifest["runs"]:
        raise SchemaError(f"{file}: field runs names no run; add one (see reports/ci/README.md), or restore the "
                          "file from version control")
    for i, rule in enumerate(manifest.get("tolerances", [])):
        bounds = [key for key in ("abs", "rel") if key in rule and rule[key] is not None]
        if rule.get("skip"):
            continue
        if len(bounds) != 1:
            raise SchemaError(f"{file}: tolerance rule tolerances[{i}] ({rule['match']!r}) needs exactly one of abs "
                              "or rel (or skip: a reason not to judge it); fix the rule or restore the file")
        value = rule[bounds[0]]
        if not math.isfinite(value) or value < 0:
            raise SchemaError(f"{file}: field tolerances[{i}].{bounds[0]} is {value!r}; a tolerance is a finite "
                              "number >= 0, so fix the rule or restore the file")
    return manifest


def validate(value: Any, shape: Any, file: Path | str, where: str = "") -> None:
    """Raise SchemaError at the first place `value` does not have `shape`."""
    if isinstance(shape, dict):
        _expect(value, "object", file, where)
        for key, field_shape in shape.items():
            name = key.removesuffix("?")
            path = f"{where}.{name}" if where else name
            if name not in value:
                if key.endswith("?"):
                    continue
                raise SchemaError(f"{file}: field {path} is missing; {_fix(file)}")
            validate(value[name], field_shape, file, path)
    elif isinstance(shape, ListOf):
        _expect(value, "list", file, where)
        if len(value) < shape.min_items:
            raise SchemaError(f"{file}: field {where} is an empty list, and a run always records at least one; "
                              f"{_fix(file)}")
        for i, item in enumerate(value):
            validate(item, shape.item, file, f"{where}[{i}]")
    elif isinstance(shape, MapOf):
        _expect(value, "object", file, where)
        for key, item in value.items():
            validate(item, shape.value, file, f"{where}.{key}" if where else key)
    else:
        _expect(value, shape, file, where)


_CHECKS = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "object": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, list),
    "any": lambda v: True,
}
_NAMES = {"int": "a whole number", "number": "a number", "str": "a string", "bool": "true or false",
          "null": "null", "object": "an object", "list": "a list", "any": "anything"}


def _expect(value: Any, types: str, file: Path | str, where: str) -> None:
    allowed = types.split("|")
    if any(_CHECKS[kind](value) for kind in allowed):
        return
    found = _NAMES[next((k for k in ("bool", "int", "number", "str", "null", "object", "list")
                         if _CHECKS[k](value)), "any")]
    wanted = " or ".join(_NAMES[kind] for kind in allowed)
    field = f"field {where}" if where else "the file"
    raise SchemaError(f"{file}: {field} is {found} ({_shown(value)}) where {wanted} belongs; {_fix(file)}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _fix(file: Path | str) -> str:
    if Path(file).name == "baseline.json":
        return "restore it from version control (git checkout) or fix that field"
    return ("the file is damaged or hand-edited: restore it from a copy, or rerun the command that wrote it into a "
            "new --out to regenerate it")
