"""RULER's two metrics, as its evaluation computes them per sample (as fractions in [0, 1], not percent).

- string_match_all: the fraction of the references that occur in the prediction (niah, vt, cwe, fwe).
- string_match_part: 1 if any reference occurs in the prediction, else 0 (qa).

Occurrence is a case-insensitive substring test, without sfibench's whole-token rule for its own tasks:
RULER's scores are what they are compared with. The prediction is first cleaned as RULER cleans it:
stripped, with control characters turned into newlines.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f]")


def clean(prediction: str) -> str:
    return _CONTROL.sub("\n", prediction.strip()).strip()


def _found(prediction: str, references: list[str]) -> list[bool]:
    if not references:
        raise ValueError("a sample needs at least one reference answer to be scored")
    text = clean(prediction).lower()
    return [reference.lower() in text for reference in references]


def string_match_all(prediction: str, references: list[str]) -> float:
    found = _found(prediction, references)
    return sum(found) / len(found)


def string_match_part(prediction: str, references: list[str]) -> float:
    return float(any(_found(prediction, references)))


METRICS = {"string_match_all": string_match_all, "string_match_part": string_match_part}


def score(metric: str, prediction: str, references: list[str]) -> float:
    """A sample's score under the RULER metric named in the package's evaluation configuration."""
    if metric not in METRICS:
        raise ValueError(f"RULER has no metric {metric!r} ({', '.join(METRICS)})")
    return METRICS[metric](prediction, references)
