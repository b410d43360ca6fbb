"""How every report and summary spells a measured number and the commit a run came from, written once."""

from __future__ import annotations


def number(value: float | None, digits: int = 3, missing: str = "n/a") -> str:
    """A measured value at fixed precision; `missing` where the run measured none."""
    return missing if value is None else f"{value:.{digits}f}"


def percent(value: float | None) -> str:
    """A share in [0, 1] as a percentage with one decimal."""
    return "n/a" if value is None else f"{100 * value:.1f}%"



def commit_label(provenance: dict) -> str:
    """'0123456789 (dirty)': the code a run used, as its provenance recorded it; every report spells it so."""
    commit = (provenance.get("git_commit") or "unknown")[:10]
    return commit + (" (dirty)" if provenance.get("git_dirty") else "")
