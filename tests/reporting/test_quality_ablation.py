"""Paired differences of SFI ablation runs against a baseline on the same prompts, and the table of them."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from sfibench.core.errors import UsageError
from sfibench.metrics.paired import paired_difference_ci
from sfibench.metrics.quality import wilson_interval
from sfibench.runners.quality import run_quality
from sfibench.commands.quality_options import quality_run

# a maintainer's script, not the package
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from quality_ablation import ablation_markdown, main  # noqa: E402


def test_paired_binary_difference_is_newcombes_interval():
    # Large n: close to the paired Wald interval (b = 30 lost, c = 50 gained of 200)
    base = [1] * 30 + [0] * 50 + [1] * 60 + [0] * 60
    other = [0] * 30 + [1] * 50 + [1] * 60 + [0] * 60
    wald = math.sqrt(80 - 20 ** 2 / 200) / 200 * 1.959964
    ci = paired_difference_ci(base, other)
    assert ci["interval"] == "newcombe" and ci["mean"] == pytest.approx(0.1)
    assert (ci["low"], ci["high"]) == pytest.approx((0.1 - wald, 0.1 + wald), abs=0.004)
    # 0/4 -> 4/4: uncorrelated pairs, so the bounds are 1 - the Wilson half-widths combined: not a point
    ci = paired_difference_ci([0] * 4, [1] * 4)
    half = 1 - wilson_interval(4, 4)[0]
    assert ci["high"] == 1 and ci["low"] == pytest.approx(1 - math.sqrt(2) * half)
    # nothing changed on two concordant prompts: an interval around 0, not [0, 0]
    ci = paired_difference_ci([1, 0], [1, 0])
    assert ci["mean"] == 0 and ci["low"] < -0.3 and ci["high"] > 0.3


def test_paired_continuous_difference_is_a_t_interval():
    ci = paired_difference_ci([0.3, 0.5, 0.4], [0.2, 0.4, 0.45])
    sd = math.sqrt(((-0.1 + 0.05) ** 2 * 2 + (0.05 + 0.05) ** 2) / 2)
    assert ci["interval"] == "t" and ci["mean"] == pytest.approx(-0.05)
    assert ci["high"] - ci["mean"] == pytest.approx(4.303 * sd / math.sqrt(3))
    with pytest.raises(ValueError):
        paired_difference_ci([1.0], [])
    # KL of two identical runs is all 0: a continuous zero difference, not two concordant 0/1 scores
    ci = paired_difference_ci([0.0] * 5, [0.0] * 5, binary=False)
    assert ci["interval"] == "t" and (ci["low"], ci["high"]) == (0.0, 0.0)


def test_ablation_table_pairs_runs_of_the_same_prompts(tmp_path):
    common = dict(methods=["sfi"], tasks=["niah_single"], contexts=["600"], retentions=["0.5"], samples=["2"],
                  device="cpu", chat=False, batch=2)
    base = run_quality(quality_run("tiny-llama", out=tmp_path / "spec", **common))
    no_nms = run_quality(quality_run("tiny-llama", out=tmp_path / "no-nms", sfi_variant={"use_nms": False}, **common))
    table = ablation_markdown(base, [no_nms])
    assert "| [SPEC](" in table and "| [use_nms=False](" in table and "niah_single @ 600 tokens" in table
    assert "read 0." in table
    out = tmp_path / "tables" / "ablation.md"
    out.parent.mkdir()
    assert main([str(base), str(no_nms), "--out", str(out)]) == 0
    assert "](../no-nms/report.md)" in out.read_text()  # linked from where the file is
    other = run_quality(quality_run("tiny-llama", out=tmp_path / "other", **{**common, "retentions": ["0.4"]}))
    with pytest.raises(UsageError, match="differs from .* in retentions"):
        ablation_markdown(base, [other])
