"""Selection coverage: the mass arithmetic on known weights, and an end-to-end run on tiny-llama."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

# a diagnostic script, not the package
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import selection_coverage  # noqa: E402
from selection_coverage import ROWS, coverage  # noqa: E402


def test_coverage_counts_the_mass_on_the_picks_of_the_candidates():
    # one layer, two KV heads, one answer step over 10 positions; candidates C = [2, 8)
    w = torch.tensor([[0.1, 0.1, 0.3, 0.0, 0.0, 0.2, 0.0, 0.1, 0.1, 0.1],
                      [0.0, 0.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.2, 0.2]])
    picks = {0: torch.tensor([[2, 5], [3, 4]])}
    got = coverage({0: [w]}, picks, 2, 8, value=[5, 6])
    assert got["mass_coverage"] == pytest.approx((0.5 + 0.2) / (0.6 + 0.6))
    assert got["candidate_mass"] == pytest.approx(1.2 / 2)
    assert got["fast_step_recall"] == pytest.approx(1 - (1.2 - 0.7) / 2)  # sinks and recent are always read
    assert got["value_token_held"] == [0.5, 0.0]  # position 5: one head of two; 6: none


def test_uniform_attention_gives_every_selection_the_chance_line():
    w = torch.full((3, 40), 1 / 40)
    picks = {0: torch.stack([torch.randperm(30)[:6] + 5 for _ in range(3)])}
    assert coverage({0: [w, w]}, picks, 5, 35, value=[5])["mass_coverage"] == pytest.approx(6 / 30)


def test_end_to_end_on_tiny_llama(tmp_path):
    out = tmp_path / "coverage"
    selection_coverage.main(["--model", "tiny-llama", "--tasks", "niah_single", "--ctx", "700", "--retention", "0.5",
                             "--samples", "1", "--no-chat", "--out", str(out)])
    document = json.loads((out / "results.json").read_text())
    cells = document["results"]["cells"]
    assert [c["row"] for c in cells] == ROWS
    assert len({c["k"] for c in cells}) == 1  # every row picks the same number of the same candidates
    for c in cells:
        assert 0 <= c["mass_coverage"]["mean"] <= 1 and c["candidate_mass"]["mean"] <= 1
    report = (out / "report.md").read_text()
    assert "random K of C (chance)" in report and "pure evidence" in report and "SnapKV" in report
