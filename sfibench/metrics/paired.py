"""Paired comparison of two conditions scored on the same prompts: a test, a 95% interval, the drop it excludes.

Two conditions (a method and Full-KV, or a method and SFI) answer the same prompts, so their scores are
compared prompt by prompt rather than as two independent samples: prompts both get right or both get
wrong say nothing about the difference, and the pairing narrows the interval.

- 0/1 scores: b = prompts the method gets right and the reference wrong, c = the reverse. The exact
  McNemar test is the binomial test of b out of b + c at 1/2. The interval for the difference of the two
  proportions is Newcombe's (1998, method 10): the Wilson interval of each proportion, combined with the
  correlation of the pairs (the phi coefficient, continuity-corrected towards 0 when positive, as he
  defines it).
- Partial credit (a mean of per-item credits in [0, 1]): the exact sign test on the per-prompt
  differences (ties dropped) and a seeded percentile bootstrap over prompts of the mean difference.

"Excludes a drop larger than X": X is minus the interval's lower end, the largest loss of the method
against the reference that the data still allow at 95%.
"""

from __future__ import annotations

import math
import random

from sfibench.metrics.quality import T_95, Z_95, wilson_interval

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def binomial_two_sided_p(successes: int, failures: int) -> float:
    """Exact two-sided p of `successes` out of `successes + failures` trials at probability 1/2.

    Twice the smaller tail (the distribution is symmetric), capped at 1; no trials gives 1.
    """
    if successes < 0 or failures < 0:
        raise ValueError(f"counts must be >= 0, got {successes} and {failures}")
    trials = successes + failures
    tail = sum(math.comb(trials, k) for k in range(min(successes, failures) + 1))
    return min(1.0, 2 * tail / 2**trials)  # integer numerator and denominator: exact up to the final division


def mcnemar_exact_p(b: int, c: int) -> float:
    """Exact McNemar p-value from the discordant counts b (method right only) and c (reference right only)."""
    return binomial_two_sided_p(b, c)


def newcombe_interval(both: int, first_only: int, second_only: int, neither: int,
                      z: float = Z_95) -> tuple[float, float]:
    """95% interval of p_first - p_second from a paired 2x2 table (Newcombe 1998, method 10).

    `both`: pairs where both conditions score 1; `first_only` / `second_only`: where only one does;
    `neither`: where both score 0.
    """
    counts = (both, first_only, second_only, neither)
    if min(counts) < 0 or sum(counts) == 0:
        raise ValueError(f"a paired 2x2 table needs counts >= 0 and at least one pair, got {counts}")
    n = sum(counts)
    first, second = both + first_only, both + second_only
    p1, p2 = first / n, second / n
    l1, u1 = wilson_interval(first, n, z)
    l2, u2 = wilson_interval(second, n, z)
    margins = first * (n - first) * second * (n - second)
    cross = both * neither - first_only * second_only
    # Newcombe corrects a positive cross product by n/2 towards 0, so near-independent pairs are not treated
    # as correlated; a marginal of 0 or n leaves the correlation undefined, and he takes it as 0.
    if cross > 0:
        cross = max(cross - n / 2, 0.0)
    phi = cross / math.sqrt(margins) if margins else 0.0
    below = (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
    above = (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2
    difference = p1 - p2
    return max(-1.0, difference - math.sqrt(max(below, 0.0))), min(1.0, difference + math.sqrt(max(above, 0.0)))


def bootstrap_mean_interval(differences: list[float], resamples: int = BOOTSTRAP_RESAMPLES,
                            seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile 95% interval of the mean of per-prompt differences, resampling prompts with replacement."""
    if not differences:
        raise ValueError("a bootstrap interval needs at least one paired difference")
    rng, n = random.Random(seed), len(differences)
    means = sorted(sum(rng.choices(differences, k=n)) / n for _ in range(resamples))
    return means[int(0.025 * resamples)], means[min(int(0.975 * resamples), resamples - 1)]


def is_binary(scores: list[float]) -> bool:
    return all(s in (0.0, 1.0) for s in scores)


def compare(method: list[float], reference: list[float], binary: bool | None = None) -> dict:
    """The paired comparison of `method` against `reference` (scores of the same prompts, in the same order).

    `binary` picks McNemar + Newcombe (True) or sign test + bootstrap (False); by default, whichever the
    scores allow. Returns the means, the difference method - reference with its 95% interval, the counts of
    prompts where the method is ahead (`b`) and behind (`c`), the test's p-value and the names used.
    """
    if len(method) != len(reference) or not method:
        raise ValueError(f"paired scores need equal, non-zero counts, got {len(method)} and {len(reference)}")
    n = len(method)
    if binary is None:
        binary = is_binary(method) and is_binary(reference)
    differences = [m - r for m, r in zip(method, reference)]
    ahead, behind = sum(d > 0 for d in differences), sum(d < 0 for d in differences)
    if binary:
        if not (is_binary(method) and is_binary(reference)):
            raise ValueError("McNemar and Newcombe need 0/1 scores; pass binary=False for partial credit")
        both = sum(m == 1 and r == 1 for m, r in zip(method, reference))
        low, high = newcombe_interval(both, ahead, behind, n - both - ahead - behind)
        test, interval = "McNemar", "Newcombe"
    else:
        low, high = bootstrap_mean_interval(differences)
        test, interval = "sign", "bootstrap"
    return {"n": n, "method": sum(method) / n, "reference": sum(reference) / n,
            "difference": sum(differences) / n, "low": low, "high": high, "b": ahead, "c": behind,
            "p": binomial_two_sided_p(ahead, behind), "test": test, "interval": interval}


def excluded_drop(comparison: dict) -> float | None:
    """The drop (reference - method) larger than which the interval excludes; None when it excludes any drop."""
    return -comparison["low"] if comparison["low"] < 0 else None


def paired_difference_ci(base: list[float], other: list[float], binary: bool | None = None) -> dict:
    """Mean of `other - base` over paired samples (the same prompts) with a 95% interval.

    0/1 scores: Newcombe's interval (`newcombe_interval`), which stays sane at n = 4 and at 0/n or n/n, where a
    bootstrap over so few pairs collapses to a point. Other values (KL, partial credit): the t interval of the
    mean difference. `binary` says which the values are (default: 0/1 where every value is 0 or 1); pass False
    for a continuous quantity that can happen to be all 0 (KL of identical runs).
    """
    if len(base) != len(other) or not base:
        raise ValueError(f"paired samples need equal, non-zero counts, got {len(base)} and {len(other)}")
    n = len(base)
    diffs = [o - b for b, o in zip(base, other)]
    mean = sum(diffs) / n
    if is_binary([*base, *other]) if binary is None else binary:
        both = sum(b == 1 and o == 1 for b, o in zip(base, other))
        other_only = sum(b == 0 and o == 1 for b, o in zip(base, other))
        base_only = sum(b == 1 and o == 0 for b, o in zip(base, other))
        low, high = newcombe_interval(both, other_only, base_only, n - both - other_only - base_only)
        return {"mean": mean, "low": low, "high": high, "n": n, "interval": "newcombe"}
    if n == 1:
        return {"mean": mean, "low": -math.inf, "high": math.inf, "n": 1, "interval": "t"}
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = (T_95[n - 2] if n - 1 <= len(T_95) else Z_95) * sd / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n, "interval": "t"}
