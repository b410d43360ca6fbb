"""Paired statistics of quality runs: exact McNemar and sign tests, Newcombe's paired interval, the paired
bootstrap, and the report's "Paired comparisons" section and claim check built from them."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from sfibench.metrics.paired import (
    binomial_two_sided_p,
    bootstrap_mean_interval,
    compare,
    excluded_drop,
    mcnemar_exact_p,
    newcombe_interval,
)
from sfibench.reporting.quality_paired import MATCH_MARGIN, SOLVED, claim_text, comparisons, paired_section
from sfibench.reporting.quality_summary import claim_check, markdown, summarise


def test_mcnemar_exact_p_is_twice_the_smaller_binomial_tail():
    # b=4, c=2 of 6 discordant: 2 * (C(6,0) + C(6,1) + C(6,2)) / 2^6 = 2 * 22 / 64
    assert mcnemar_exact_p(4, 2) == 0.6875 == mcnemar_exact_p(2, 4)
    assert mcnemar_exact_p(0, 5) == 2 / 32
    assert mcnemar_exact_p(0, 0) == 1.0 and mcnemar_exact_p(3, 3) == 1.0  # the tails overlap: capped at 1
    tail = sum(Fraction(math.comb(40, k), 2**40) for k in range(13))
    assert binomial_two_sided_p(28, 12) == pytest.approx(float(2 * tail), rel=1e-12)
    with pytest.raises(ValueError, match=">= 0"):
        mcnemar_exact_p(-1, 2)


def test_newcombe_interval_matches_the_published_worked_example():
    """Fagerland, Lydersen and Laake (Statistical Analysis of Contingency Tables, ch. 8) apply Newcombe's
    square-and-add interval to Cavo et al. (2012): 59 / 6 / 16 / 80 gives -0.0621 (-0.1186 to -0.0046)."""
    low, high = newcombe_interval(59, 6, 16, 80)
    assert (round(low, 4), round(high, 4)) == (-0.1186, -0.0046)


@pytest.mark.parametrize("table", [(5, 9, 3, 3), (30, 4, 2, 20), (0, 3, 7, 10)])
def test_newcombe_interval_agrees_with_an_independent_computation(table):
    """scipy's Wilson intervals for the two marginals and numpy's correlation of the two 0/1 columns, with
    Newcombe's n/2 correction of a positive cross product, combined by the square-and-add formula."""
    scipy_stats = pytest.importorskip("scipy.stats")
    np = pytest.importorskip("numpy")
    both, first_only, second_only, neither = table
    first = np.array([1] * both + [1] * first_only + [0] * second_only + [0] * neither)
    second = np.array([1] * both + [0] * first_only + [1] * second_only + [0] * neither)
    n = len(first)
    p1, p2 = first.mean(), second.mean()
    l1, u1 = scipy_stats.binomtest(int(first.sum()), n).proportion_ci(method="wilson")
    l2, u2 = scipy_stats.binomtest(int(second.sum()), n).proportion_ci(method="wilson")
    phi = np.corrcoef(first, second)[0, 1] if 0 < first.sum() < n and 0 < second.sum() < n else 0.0
    scale = math.sqrt(first.sum() * (n - first.sum()) * second.sum() * (n - second.sum())) or 1.0
    if phi > 0:
        phi = max(phi - n / 2 / scale, 0.0)
    low = p1 - p2 - math.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    high = p1 - p2 + math.sqrt((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2)
    assert newcombe_interval(*table) == pytest.approx((low, high), abs=1e-9)


def test_newcombe_interval_properties():
    for table in [(8, 4, 2, 6), (0, 0, 20, 0), (20, 0, 0, 0), (1, 0, 5, 0), (3, 7, 1, 9)]:
        low, high = newcombe_interval(*table)
        estimate = (table[1] - table[2]) / sum(table)
        assert -1 <= low <= estimate <= high <= 1
        # swapping the two conditions flips the interval's sign
        assert newcombe_interval(table[0], table[2], table[1], table[3]) == pytest.approx((-high, -low))
    narrow = newcombe_interval(32, 16, 8, 24)  # four times the pairs, the same proportions
    wide = newcombe_interval(8, 4, 2, 6)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]
    with pytest.raises(ValueError, match="at least one pair"):
        newcombe_interval(0, 0, 0, 0)


def test_compare_binary_counts_discordant_prompts():
    method = [1, 1, 1, 1, 0, 0, 1, 0]
    reference = [1, 0, 0, 0, 0, 1, 1, 1]
    result = compare(method, reference)
    assert (result["b"], result["c"], result["test"], result["interval"]) == (3, 2, "McNemar", "Newcombe")
    assert result["p"] == mcnemar_exact_p(3, 2) and result["difference"] == pytest.approx(1 / 8)
    assert (result["low"], result["high"]) == newcombe_interval(2, 3, 2, 1)
    assert excluded_drop(result) == pytest.approx(-result["low"])
    assert excluded_drop({"low": 0.02}) is None


def test_compare_partial_credit_uses_the_sign_test_and_a_seeded_bootstrap():
    method = [1.0, 0.5, 0.75, 0.25, 1.0, 0.5]
    reference = [0.5, 0.5, 1.0, 0.0, 0.75, 0.25]
    result = compare(method, reference)
    assert (result["b"], result["c"], result["test"], result["interval"]) == (4, 1, "sign", "bootstrap")
    assert result["p"] == binomial_two_sided_p(4, 1)  # the tie (0.5 vs 0.5) is dropped
    differences = [m - r for m, r in zip(method, reference)]
    assert (result["low"], result["high"]) == bootstrap_mean_interval(differences)  # seeded: the same twice
    assert result["low"] <= result["difference"] <= result["high"]
    with pytest.raises(ValueError, match="0/1 scores"):
        compare(method, reference, binary=True)


def _record(task, method, retention, index, score, context=1000):
    return {"task": task, "context": context, "method": method, "retention": retention, "index": index,
            "score": float(score), "turn_scores": [float(score)], "kl": 0.0, "top1_agreement": 1.0,
            "measured_retention": 1.0 if retention is None else retention, "measured_retention_global": None,
            "steps_by_kind": {"dense": 1}}


def _synthetic_records():
    """niah_single: Full-KV right on 9 of 10; SFI right on 0-4 and 9 (b = 1, c = 4 against Full-KV);
    StreamingLLM right on 0-8 with prompt 9 missing (4 / 0 against SFI, one unpaired record each).
    niah_multikey: Full-KV right on 5 of 10, so nothing there decides anything."""
    full = [1] * 9 + [0]
    sfi = [1, 1, 1, 1, 1, 0, 0, 0, 0, 1]
    records = [_record("niah_single", "full_kv", None, i, s) for i, s in enumerate(full)]
    records += [_record("niah_single", "sfi", 0.2, i, s) for i, s in enumerate(sfi)]
    records += [_record("niah_single", "streaming_llm", 0.2, i, 1) for i in range(9)]
    records += [_record("niah_multikey", m, r, i, i % 2) for m, r in (("full_kv", None), ("sfi", 0.2))
                for i in range(10)]
    return records


def _row(rows, task, method, against):
    return next(r for r in rows if (r["task"], r["method"], r["against"]) == (task, method, against))


def test_comparisons_pair_by_prompt_against_full_kv_and_sfi():
    records = _synthetic_records()
    rows = comparisons(records, summarise(records))
    sfi = _row(rows, "niah_single", "sfi", "full_kv")
    assert (sfi["comparison"]["b"], sfi["comparison"]["c"], sfi["comparison"]["n"]) == (1, 4, 10)
    assert sfi["comparison"]["p"] == mcnemar_exact_p(1, 4) and sfi["decides"] and sfi["unpaired"] == 0
    streaming = _row(rows, "niah_single", "streaming_llm", "sfi")
    assert (streaming["comparison"]["b"], streaming["comparison"]["c"], streaming["comparison"]["n"]) == (4, 0, 9)
    assert streaming["unpaired"] == 1
    assert not any(r["method"] == "sfi" and r["against"] == "sfi" for r in rows)
    assert not _row(rows, "niah_multikey", "sfi", "full_kv")["decides"]


def test_report_section_prints_the_counts_and_says_where_full_kv_decides_nothing():
    records = _synthetic_records()
    text = "\n".join(paired_section(records, summarise(records)))
    assert "## Paired comparisons" in text
    assert "| 1000 | sfi | 0.2 | full_kv | 10 | 0.60 / 0.90 | 1 / 4 | 0.38 |" in text  # p = 2 * 6 / 32
    assert "| 1000 | streaming_llm | 0.2 | sfi | 9 | 1.00 / 0.56 | 4 / 0 | 0.12 |" in text
    assert "niah_single @ 1000 streaming_llm 0.2 vs full_kv: 1" in text  # the unpaired record is counted
    multikey = [line for line in text.splitlines() if line.startswith("| 1000 | sfi") and "0.50 / 0.50" in line]
    assert multikey and all(line.endswith(f"decides nothing: Full-KV 0.50 < {SOLVED:g} |") for line in multikey)
    assert "excludes a drop larger than" in text


def test_claim_check_matches_only_where_the_interval_excludes_a_drop_beyond_the_margin():
    records = _synthetic_records()
    checks, unsolved = claim_check(summarise(records), records)
    assert unsolved == ["niah_multikey @ 1000 (Full-KV 0.50)"]
    verdicts = checks[0]["verdicts"]
    streaming = compare([1] * 9, [1] * 9)
    assert verdicts["streaming_llm"] == (f"undecided at 0.2 (n too small: excludes only drops > "
                                         f"{-streaming['low']:.2f})")
    # 4 prompts all lost: p = 0.125 decides nothing, and an interval reaching -1 excludes no drop at all
    lost = [_record("niah_single", m, r, i, m == "full_kv") for m, r in (("full_kv", None), ("snapkv", 0.1))
            for i in range(4)]
    assert claim_check(summarise(lost), lost)[0][0]["verdicts"]["snapkv"] == \
        "undecided at 0.1 (n too small: the interval excludes no drop)"
    # 400 prompts, identical answers: the interval excludes any drop beyond the margin, so it matches
    many = [_record("niah_single", m, r, i, i % 10 != 0) for m, r in (("full_kv", None), ("sfi", 0.1))
            for i in range(400)]
    checks, _ = claim_check(summarise(many), many)
    assert checks[0]["verdicts"]["sfi"] == "0.1"
    # a drop decided at every retention
    worse = [_record("niah_single", "full_kv", None, i, 1) for i in range(40)]
    worse += [_record("niah_single", "sfi", r, i, 0) for r in (0.1, 0.5) for i in range(40)]
    assert claim_check(summarise(worse), worse)[0][0]["verdicts"]["sfi"] == (
        f"none up to 0.5 (each drops more than {MATCH_MARGIN:g})")
    assert claim_text([], 0.5) == "undecided (no paired prompts)"
    # partial credit tied on every prompt: the bootstrap has no width, so only the prompt count keeps the
    # claim check from calling 8 prompts a match
    tied = [_record("niah_multiturn", m, r, i, 0.5 + 0.5 * (i % 2)) for m, r in (("full_kv", None), ("sfi", 0.2))
            for i in range(8)]
    tied = [{**r, "score": 1.0} if r["index"] == 0 else r for r in tied]
    assert compare([1.0, 0.5], [1.0, 0.5])["low"] == 0.0
    assert claim_check(summarise(tied), tied)[0][0]["verdicts"]["sfi"] == "undecided at 0.2 (n = 8 < 100 prompts)"
    # 0 of 4 against 4 of 4: Newcombe's interval lies below 0, but exact McNemar gives p = 0.125, so no
    # direction is stated and the claim check calls it undecided rather than a drop
    few = [_record("niah_single", "full_kv", None, i, 1) for i in range(4)]
    few += [_record("niah_single", "sfi", 0.5, i, 0) for i in range(4)]
    assert compare([0.0] * 4, [1.0] * 4)["high"] < 0
    section = "\n".join(paired_section(few, summarise(few)))
    assert "| 0.12 | -1.00 [-1.00, -0.31] | excludes a drop larger than 1.00 |" in section
    assert claim_check(summarise(few), few)[0][0]["verdicts"]["sfi"].startswith("undecided at 0.5")


def test_markdown_carries_the_section_and_the_paired_claim_check():
    records = _synthetic_records()
    document = {
        "config": {"model": "tiny", "tasks": ["niah_single", "niah_multikey"], "contexts": [1000], "samples": [10],
                   "methods": ["full_kv", "sfi", "streaming_llm"], "retentions": [0.2], "dtype": "float32",
                   "chat": False, "path": "reference"},
        "provenance": {"timestamp_utc": "t", "device": "cpu", "cpu": "x", "git_commit": "0" * 40},
        "results": {"cells": summarise(records), "wall_s": 60.0}, "samples": records}
    text = markdown(document, [])
    assert "## Paired comparisons" in text and f"excludes a drop larger than {MATCH_MARGIN:g}" in text
    assert "undecided at 0.2 (n too small: excludes only drops >" in text
    without = markdown({**document, "samples": None}, [])
    assert "holds no per-sample records" in without and "undecided (no per-sample records to pair)" in without
