"""A quality report whose SFI cells lose to a Full-KV that solves the task (by the paired verdict where the
run kept its samples) says why, as docs/findings.md found it (Soft-NMS suppressing the needle's neighbours,
shown on Gemma-3), and names the variant flags that test it; a run that already is that variant says so
instead; a run where SFI does not lose, or loses by less than the noise, says nothing."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from sfibench.reporting.quality_summary import markdown

REPORTS = Path(__file__).resolve().parents[2] / "reports"


def committed(name: str) -> dict:
    return json.loads((REPORTS / name / "results.json").read_text())


def note(report: str) -> str:
    start = report.index("**SFI scores below Full-KV**")
    return " ".join(report[start:report.index("\n\n", start)].split())


def test_sfi_losing_to_full_kv_is_explained_with_the_findings_and_the_variant_flags():
    text = note(markdown(committed("quality-smollm2"), []))
    assert "niah_single at 2,048 tokens: 0.00 / 0.00 / 0.00 / 0.15 at retention 0.1 / 0.15 / 0.2 / 0.5, " \
           "Full-KV 1.00" in text
    assert "8,172" not in text  # Full-KV 0.60 there: a cell it does not solve decides nothing
    assert "Soft-NMS" in text and "Gemma-3" in text and "docs/findings.md" in text
    assert "`--methods sfi --no-nms --keep-neighbours 7`" in text


def test_a_run_of_the_variant_says_soft_nms_does_not_explain_its_losses():
    document = committed("quality-smollm2-4k-no-nms-keep7")
    text = note(markdown(document, []))
    assert "already ran as that variant (use_nms=False, keep_neighbours=7)" in text and "--no-nms" not in text


def test_no_note_where_sfi_does_not_lose():
    document = copy.deepcopy(committed("quality-smollm2"))
    for cell in document["results"]["cells"]:
        if cell["method"] == "sfi":
            cell["accuracy"] = 1.0
    for record in document["samples"]:
        if record["method"] == "sfi":
            record["score"] = 1.0
    assert "SFI scores below Full-KV" not in markdown(document, [])


def test_a_drop_within_the_paired_noise_is_not_called_a_loss():
    # SFI 0.95 at both budgets against Full-KV 0.96 on the same 100 prompts: 0 / 1 discordant, p = 1.
    document = committed("quality-qwen2.5-coder-1.5b-16k-multikey-sfi-no-nms-keep7-h100")
    accuracies = {c["accuracy"] for c in document["results"]["cells"] if c["method"] == "sfi"}
    assert accuracies and max(accuracies) < 0.96
    report = markdown(document, [])
    assert "SFI scores below Full-KV" not in report
    assert "SFI wrote the same" not in report  # the same right answer at both budgets explains nothing
    for record in document["samples"]:  # the same prompts, now every SFI answer wrong: both notes appear
        if record["method"] == "sfi":
            record["score"] = 0.0
    for cell in document["results"]["cells"]:
        if cell["method"] == "sfi":
            cell["accuracy"] = 0.0
    report = markdown(document, [])
    assert "SFI scores below Full-KV" in report and "**SFI wrote the same wrong answer" in report


def test_sfi_writing_the_same_answers_at_every_retention_is_said_with_the_count():
    report = markdown(committed("sfi-retention-smollm2/quality"), [])
    line = " ".join(report[report.index("**SFI wrote the same wrong answer"):].split("\n\n")[0].split())
    assert "at retention 0.15 / 0.5 on 3 of 4 niah_single prompts at 2,048 tokens" in line
    assert "docs/findings.md" in line
    document = committed("sfi-retention-smollm2/quality")
    for record in document["samples"]:  # SFI at 0.5 answers differently on three prompts: no longer half
        if record["method"] == "sfi" and record["retention"] == 0.5 and record["index"] < 3:
            record["prediction"] = ["something else"]
    assert "SFI wrote the same" not in markdown(document, [])
