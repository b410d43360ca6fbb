"""When a throughput run supports a speedup over Full-KV: the one rule the table, report.md and every plot use.

A ratio of tokens/s is claimed wherever the run measured a difference: the row's tok/s range over the timed
passes does not overlap Full-KV's. A slower row is then shown slower (a ratio below 1), never hidden. A row
whose ranges overlap is "no difference measured" (`= in the noise`). A measured ratio of a row that reads as
many tokens per step as Full-KV (less than 5% fewer) is marked "same tokens": it skipped nothing, so its
difference is the cost of the method's own work around the same reads, not what reading less buys.
`noise_note` says, in one line, when the passes of a run disagree so much (a busy CPU) that no figure of it can
be read to better than its spread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sfibench import registry

FEWER_TOKENS = 0.95  # a row reading more than this share of Full-KV's tokens per step reads "the same tokens"
NOISY = 0.20  # a run whose passes differ by more than ±20% of the median (somewhere) is called noisy

SAME_TOKENS = "same tokens"
IN_NOISE = "in the noise"
REFERENCE = "ref"
# what each short verdict means, for the notes under a table and a plot
MEANINGS = {
    IN_NOISE: "has a tok/s range over the timed passes that overlaps Full-KV's",
    REFERENCE: "the Full-KV row every speedup at this shape is measured against",
}


@dataclass(frozen=True)
class SpeedupClaim:
    """A row's tok/s against the fastest Full-KV path at its shape, and whether the run supports it."""

    ratio: float  # median tok/s over the reference's
    low: float  # the row's slowest pass over the reference's fastest
    high: float  # the row's fastest pass over the reference's slowest
    verdict: str  # "" where the ratio is claimed (the ranges apart), else IN_NOISE or REFERENCE
    same_tokens: bool = False  # the row reads as many tokens per step as Full-KV (not the Full-KV row itself)

    @property
    def supported(self) -> bool:
        return not self.verdict

    def cell(self) -> str:
        """How a table spells it: '2.10x', '0.34x (same tokens)', or the short verdict."""
        if not self.supported:
            return verdict_cell(self.verdict)
        return f"{self.ratio:.2f}x" + (f" ({SAME_TOKENS})" if self.same_tokens else "")


def verdict_cell(verdict: str) -> str:
    """A verdict as a table cell: 'ref' or '= same tokens'."""
    return "ref" if verdict == REFERENCE else f"= {verdict}"


def verdict_legend(verdicts) -> list[str]:
    """What each verdict among `verdicts` means, one line each, for the notes under a table."""
    present = set(verdicts)
    return [f"{verdict_cell(verdict)}: " + ("" if verdict == REFERENCE else "no difference measured, as the row ")
            + MEANINGS[verdict] for verdict in (REFERENCE, IN_NOISE) if verdict in present]


def full_kv_reference(row: dict, rows: list[dict]) -> dict | None:
    """The fastest dense row at the same (context, batch), or None where the run measured none."""
    dense = [r for r in rows if r["method"] == registry.dense().name and (r["context"], r["batch"]) == (row["context"], row["batch"])]
    return max(dense, key=lambda r: r["tokens_per_s"]) if dense else None


def speedup_claim(row: dict, rows: list[dict]) -> SpeedupClaim | None:
    """The row's claim against Full-KV at its shape; None where no Full-KV row shares the shape."""
    reference = full_kv_reference(row, rows)
    if reference is None:
        return None
    mine, theirs = row["tokens_per_s_spread"], reference["tokens_per_s_spread"]
    figures = (row["tokens_per_s"], reference["tokens_per_s"], mine["min"], mine["max"], theirs["min"], theirs["max"],
               row["tokens_read_mean"], reference["tokens_read_mean"])
    if not all(isinstance(x, (int, float)) and math.isfinite(x) and x != 0 for x in figures[:6]) or None in figures:
        return None  # a speed that was not measured as a number (saved as null) supports no claim
    ratio = row["tokens_per_s"] / reference["tokens_per_s"]
    low, high = mine["min"] / theirs["max"], mine["max"] / theirs["min"]
    same_tokens = row is not reference and \
        row["tokens_read_mean"] > FEWER_TOKENS * reference["tokens_read_mean"]
    if row is reference:
        verdict = REFERENCE
    elif not (mine["min"] > theirs["max"] or theirs["min"] > mine["max"]):
        verdict = IN_NOISE
    else:
        verdict = ""
    return SpeedupClaim(ratio, low, high, verdict, same_tokens)


def half_spread(row: dict) -> float:
    """± share of the median that the row's tok/s ranged over its timed passes."""
    return row["tokens_per_s_spread"]["rel_spread"] / 2


def noise_note(rows: list[dict]) -> str:
    """One line where the passes disagree by more than ±20% somewhere (the figures are then as uncertain as
    their spread says); empty where the run was steady."""
    spreads = sorted(half_spread(r) for r in rows)
    if not spreads or spreads[-1] <= NOISY:
        return ""
    worst = max(rows, key=half_spread)
    return (f"Noisy run: tok/s varied between timed passes by up to ±{100 * spreads[-1]:.0f}% "
            f"({worst['method']}/{worst['path']} at {worst['context']:,} tokens; median row ±"
            f"{100 * spreads[len(spreads) // 2]:.0f}%), so differences smaller than that are not measured; "
            "on a shared or busy machine, rerun when it is idle or with more --repeats.")


def verdict_notes(rows: list[dict], label) -> list[str]:
    """'no difference measured where the row ... (why): streaming_llm/reference at 1,024, ...' per verdict
    the rows have."""
    claims = [(speedup_claim(row, rows), row) for row in rows]
    return unsupported_notes((claim.verdict, f"{label(row)}/{row['path']} at {row['context']:,}")
                             for claim, row in claims if claim is not None)


def unsupported_notes(named) -> list[str]:
    """(verdict, name) pairs as one line per verdict naming every figure it applies to (the reference rows
    are the 1x line, not a missing figure, and are left out)."""
    by_verdict: dict[str, list[str]] = {}
    for verdict, name in named:
        if verdict and verdict != REFERENCE:
            by_verdict.setdefault(verdict, []).append(name)
    return [f"no difference measured where the row {MEANINGS[verdict]}: {', '.join(names)}"
            for verdict, names in by_verdict.items()]


def same_tokens_note(rows: list[dict], label) -> str:
    """One line naming every row that reads as many tokens per step as Full-KV at its shape, and why a method
    can: empty where every sparse row reads fewer."""
    named = [f"{label(row)}/{row['path']} at {row['context']:,}" for row in rows
             if (claim := speedup_claim(row, rows)) is not None and claim.same_tokens]
    if not named:
        return ""
    return (f"{SAME_TOKENS}: {', '.join(named)} read as many tokens per step as Full-KV (less than 5% "
            "fewer), because the budget (sinks + k_head + recent window) covers the context, or because the "
            "model has no layer beyond those the method reads in full (its dense first layers, its selection "
            "layers); a ratio there is the cost of the method's own work around the same reads, not what "
            "reading less buys")
