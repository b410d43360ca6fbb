"""A damaged or hand-edited file sfibench reads back (a run's results.json, a baseline's manifest and tolerance
rules) is one error line naming the file, the field and the fix, and nothing in the run is written or replaced;
the gate fails a metric whose current value is not a finite number where the baseline's is.

The runs are real: a tiny throughput, profile and stability run made once per module, damaged per test.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from refusals import one_line_error
from tiny_runs import TINY_RUNS
from typer.testing import CliRunner

from sfibench.cli import app

COMMANDS = TINY_RUNS


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One real run of each command, never changed: tests damage copies."""
    root = tmp_path_factory.mktemp("runs")
    made = {}
    for name, argv in COMMANDS.items():
        result = CliRunner().invoke(app, [*argv, "--out", str(root / name)])
        assert result.exit_code == 0, result.output
        made[name] = root / name
    return made


def copy_of(run: Path, where: Path) -> Path:
    return Path(shutil.copytree(run, where / run.name))


def fingerprint(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file's content hash and modification time: a rewrite with the same bytes shows too."""
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.iterdir()) if p.is_file()}


def edit(run: Path, change) -> None:
    path = run / "results.json"
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


def delete(path: str):
    def change(document):
        *parents, last = path.split(".")
        target = document
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        del target[int(last) if last.isdigit() else last]
    return change


def put(path: str, value):
    def change(document):
        *parents, last = path.split(".")
        target = document
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(last) if last.isdigit() else last] = value
    return change


# (run, damage, the field the error names)
DAMAGES = [
    ("throughput", delete("results.rows.1.context"), "results.rows[1].context is missing"),
    ("throughput", put("results.rows.0.tokens_per_s", "fast"), "results.rows[0].tokens_per_s is a string"),
    ("throughput", put("results.rows", []), "results.rows is an empty list"),
    ("throughput", put("results.rows", {"method": "sfi"}), "results.rows is an object"),
    ("throughput", put("results.rows.0.tokens_per_s_spread", [1, 2]), "results.rows[0].tokens_per_s_spread is a list"),
    ("throughput", put("results", [1]), "results is a list"),
    ("throughput", delete("config"), "config is missing"),
    ("profile", put("results.ms_per_step", [3.0]), "results.ms_per_step is a list"),
    ("profile", delete("results.step_kinds"), "results.step_kinds is missing"),
    ("profile", put("results.context", "300"), "results.context is a string"),
    ("stability", put("results.segments", []), "results.segments is an empty list"),
    ("stability", delete("results.segments.0.recall"), "results.segments[0].recall is missing"),
]


@pytest.mark.parametrize("name, damage, field", DAMAGES)
def test_report_on_a_damaged_results_file_names_the_field_and_changes_nothing(runs, tmp_path, name, damage, field):
    run = copy_of(runs[name], tmp_path)
    edit(run, damage)
    before = fingerprint(run)
    result = CliRunner().invoke(app, ["report", str(run)])
    one_line_error(result, f"{run}/results.json: field {field}", "rerun the command")
    assert fingerprint(run) == before
    assert sorted(p.name for p in run.iterdir()) == sorted(before)  # no staging folder left behind


@pytest.mark.parametrize("text", ['{"schema_version": 1, "command": "throughput", "con', "[1, 2]", "\x00\x01"])
def test_report_on_a_file_that_is_not_results_json_changes_nothing(runs, tmp_path, text):
    run = copy_of(runs["throughput"], tmp_path)
    (run / "results.json").write_text(text)
    before = fingerprint(run)
    one_line_error(CliRunner().invoke(app, ["report", str(run)]), f"{run}/results.json")
    assert fingerprint(run) == before


def test_a_value_no_renderer_can_draw_is_one_line_and_changes_nothing(runs, tmp_path):
    """A shape the schema allows but a renderer cannot use (a step kind it has no time for) still names the
    file, and the plots drawn before the failure never replace the run's."""
    run = copy_of(runs["throughput"], tmp_path)
    edit(run, put("results.rows.0.ms_per_step", {}))
    before = fingerprint(run)
    one_line_error(CliRunner().invoke(app, ["report", str(run)]), f"{run}/results.json", "cannot be drawn")
    assert fingerprint(run) == before


def test_report_compares_only_whole_runs(runs, tmp_path):
    good = copy_of(runs["throughput"], tmp_path)
    bad = copy_of(runs["throughput"], tmp_path / "bad")
    edit(bad, delete("results.rows.0.batch"))
    result = CliRunner().invoke(app, ["report", str(good), str(bad), "--out", str(tmp_path / "side")])
    one_line_error(result, "results.rows[0].batch is missing")
    assert not (tmp_path / "side").exists()


# ------------------------------------------------------------------------------------------------ the gate

RULES = [{"match": "throughput/*/tokens_read*", "abs": 0.0, "how": "deterministic"},
         {"match": "throughput/*/slow_steps", "abs": 0.0, "how": "deterministic"},
         {"match": "throughput/*", "skip": "timings"}]


@pytest.fixture
def baseline(runs, tmp_path) -> Path:
    folder = tmp_path / "baseline"
    shutil.copytree(runs["throughput"], folder / "throughput")
    manifest = {"format": 1, "runs": {"throughput": {"argv": COMMANDS["throughput"]}}, "tolerances": RULES}
    (folder / "baseline.json").write_text(json.dumps(manifest))
    return folder


def check(baseline: Path, current: Path):
    return CliRunner().invoke(app, ["check", "--baseline", str(baseline), "--current", str(current)])


def test_an_unchanged_run_passes_the_gate(baseline, runs):
    result = check(baseline, runs["throughput"])
    assert result.exit_code == 0 and "PASS" in result.output, result.output


@pytest.mark.parametrize("value", [float("nan"), float("inf"), None])
@pytest.mark.parametrize("field", ["tokens_read_mean", "tokens_per_s"])
def test_a_non_finite_current_value_fails_the_gate_and_is_named(baseline, runs, tmp_path, value, field):
    """tokens_read_mean has a tolerance; tokens_per_s is never gated as a number, yet NaN there fails too."""
    current = copy_of(runs["throughput"], tmp_path)
    document = json.loads((current / "results.json").read_text())
    row = document["results"]["rows"][1]
    row[field] = value
    (current / "results.json").write_text(json.dumps(document))  # json writes NaN and Infinity literally
    result = check(baseline, current)
    text = " ".join(result.output.split())
    assert result.exit_code == 1, text
    key = f"throughput/{row['method']}/{row['path']} B={row['batch']}@{row['context']}/{field}"
    assert f"non-finite: {key}" in text and "FAIL" in text and "Traceback" not in text


@pytest.mark.parametrize("manifest_edit, field", [
    (lambda m: m["tolerances"][0].update(abs="0"), "tolerances[0].abs is a string"),
    (lambda m: m["tolerances"][1].update(rel=float("nan"), abs=None), "tolerances[1].rel is nan"),
    (lambda m: m["tolerances"][0].update(rel=0.1), "tolerances[0] ('throughput/*/tokens_read*') needs exactly one"),
    (lambda m: m["tolerances"][1].update(abs=-1.0), "tolerances[1].abs is -1.0"),
    (lambda m: m["tolerances"][0].pop("match"), "tolerances[0].match is missing"),
    (lambda m: m.update(tolerances={"match": "*"}), "field tolerances is an object"),
    (lambda m: m["runs"]["throughput"].update(argv="throughput --model x"), "runs.throughput.argv is a string"),
])
def test_a_tolerance_rule_the_gate_cannot_read_is_one_line(baseline, runs, manifest_edit, field):
    path = baseline / "baseline.json"
    manifest = json.loads(path.read_text())
    manifest_edit(manifest)
    path.write_text(json.dumps(manifest))
    before = fingerprint(baseline / "throughput")
    one_line_error(check(baseline, runs["throughput"]), f"{path}: ", field)
    assert fingerprint(baseline / "throughput") == before


def test_a_damaged_current_run_is_one_line(baseline, runs, tmp_path):
    current = copy_of(runs["throughput"], tmp_path)
    edit(current, put("results.rows.1.tokens_read_mean", "258"))
    one_line_error(check(baseline, current), "results.rows[1].tokens_read_mean is a string")
