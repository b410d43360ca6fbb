"""README's and docs/' claims, checked where a test can: the command list, the needle demo's methods, which
commands run with no arguments, that every link resolves inside the repository, that every committed run
is cited, that the generated results blocks are current, and that no page tells development history."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from no_model import ModelLoaded, forbid_model_loading
from typer.main import get_command
from typer.testing import CliRunner

from sfibench.cli import app

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the demo script lives there, beside the other maintained scripts
from needle_demo import DEMO_METHODS  # noqa: E402

README = (ROOT / "README.md").read_text(encoding="utf-8")
FINDINGS = (ROOT / "docs" / "findings.md").read_text(encoding="utf-8")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BASELINES = {"ci", "ci-h200"}  # the regression gate's baselines: kept whether or not a page cites them
COMMANDS = sorted(get_command(app).commands)
NAMES = {"full_kv": "Full-KV", "sfi": "SFI", "streaming_llm": "StreamingLLM", "snapkv": "SnapKV"}


def section(title: str, text: str = README) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_command_list_is_the_clis():
    listed = re.findall(r"^    sfibench (\w+)", section("Commands"), flags=re.MULTILINE)
    assert sorted(listed) == COMMANDS


def test_the_needle_demo_runs_the_methods_readme_names():
    demo = section("SFI sees a needle that StreamingLLM evicted", FINDINGS)
    printed = re.findall(r"^ +(\w+)  retention", demo, flags=re.MULTILINE)
    assert printed == list(DEMO_METHODS)
    named = " and ".join([", ".join(NAMES[m] for m in DEMO_METHODS[:-1]), NAMES[DEMO_METHODS[-1]]])
    assert f"decodes it with {named}" in " ".join(demo.split())



def no_argument_commands() -> list[str]:
    sentence = re.search(r"((?:`\w+`(?:, | and ))+`\w+`) run with no arguments", " ".join(README.split()))
    return re.findall(r"`(\w+)`", sentence.group(1))


@pytest.mark.parametrize("command", no_argument_commands())
def test_commands_readme_says_run_with_no_arguments_get_past_every_check(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    forbid_model_loading(monkeypatch)
    result = CliRunner().invoke(app, [command])
    assert result.exit_code == 0 or isinstance(result.exception, ModelLoaded), result.output
    assert list(tmp_path.iterdir()) == []  # the run directory claimed before the load went away again


def test_the_no_argument_sentence_names_real_commands():
    assert set(no_argument_commands()) <= set(COMMANDS)


def test_readme_docs_and_help_name_no_contract_document():
    helps = [CliRunner().invoke(app, [*command, "--help"]).output for command in [[], *([c] for c in COMMANDS)]]
    for text in [*(page.read_text(encoding="utf-8") for page in PAGES), *helps]:
        assert "SPEC.md" not in text and "DESIGN.md" not in text


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves_to_a_file_inside_the_repository(page):
    for target in re.findall(r"\]\(([^)#\s]+)[^)]*\)", page.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        resolved = (page.parent / target).resolve()
        assert resolved.is_relative_to(ROOT), f"{page.name} links outside the repository: {target}"
        assert resolved.exists(), f"{page.name} links to missing {target}"


def test_every_committed_run_is_cited_by_readme_docs_or_the_reports_index():
    cited = "\n".join(page.read_text(encoding="utf-8") for page in [*PAGES, ROOT / "reports" / "README.md"])
    patterns = set(re.findall(r"[\w.-]+-\*", cited))  # `quality-smollm2-ablation-*/` cites a family
    for entry in (ROOT / "reports").iterdir():
        if entry.name in BASELINES | {"README.md"}:
            continue
        assert entry.name in cited or any(fnmatch.fnmatch(entry.name, p) for p in patterns), \
            f"reports/{entry.name} is cited by no page: cite it, or git rm -r it (git history keeps it)"


def test_no_page_report_or_benchmark_tells_development_history():
    roots = [ROOT / "README.md", ROOT / "docs", ROOT / "reports", ROOT / "benchmarks"]
    files = [f for r in roots for f in ([r] if r.is_file() else r.rglob("*")) if f.is_file()]
    # a word of its own: a model's numbered list can hold a word ending in it followed by a number
    session = re.compile(r"\bsession ?[0-9]+", re.IGNORECASE)
    for file in files:
        relative = file.relative_to(ROOT)
        if relative.parts[:2] in {("reports", name) for name in BASELINES} or file.suffix == ".png":
            continue
        assert not session.search(file.name), f"{relative}: a file named after a development session"
        match = session.search(file.read_text(encoding="utf-8", errors="ignore"))
        assert match is None, f"{relative} names a development session ({match.group(0)!r}); say it as a fact with its commit"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_results_blocks_are_what_the_committed_reports_generate(page):
    from sfibench.reporting.readme_results import regenerate

    current, fresh = regenerate(page, ROOT / "reports")
    assert fresh == current, f"{page.name}'s results blocks are stale: run python -m sfibench.reporting.readme_results"


def test_readme_shows_the_headline_findings_as_generated_blocks():
    assert re.search(r"<!-- results:begin \w* ?throughput-qwen3-4b-h200 -->", README)
    assert re.search(r"<!-- results:begin [^>]*quality-qwen2.5-coder-1.5b-[^>]*-->", README)
    assert re.search(r"<!-- results:begin [^>]*stability-[^>]*-->", README)
    assert len(README.splitlines()) <= 250


def test_every_results_run_shows_its_conditions_and_in_the_full_view_its_plot():
    runs = 0
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for view, block in re.findall(r"<!-- results:begin (\w+ )?[^>]*-->\n(.*?)<!-- results:end -->", text, re.DOTALL):
            if view.strip() == "family":  # one table across runs: its conditions name and link each run
                runs += 1
                assert re.match(r"\*\*The [\w.-]+ family\*\*: .*Runs: \[[\w.-]+\]\((\.\./)?reports/", block), block[:80]
                assert "![" not in block
                continue
            if view.strip() == "grid":  # one table across quality runs: its conditions link each run
                runs += 1
                assert re.match(r"\*\*[\w.-]+\*\*, .*Runs: \[[\w.-]+\]\((\.\./)?reports/[\w.-]+/report\.md\)", block), block[:80]
                assert "![" not in block
                continue
            for run in re.split(r"\n(?=\*\*\[)", block.strip()):
                runs += 1
                assert re.match(r"\*\*\[[\w.-]+\]\((\.\./)?reports/[\w.-]+/report\.md\)\*\*: ", run), run[:80]
                has_plot = re.search(r"!\[[^\]]*\]\((\.\./)?reports/[\w.-]+/\w+\.png\)", run)
                assert bool(has_plot) == (view.strip() in ("", "full")), f"plot or not, by view, in {run[:80]}"
    assert runs >= 8


def test_views_of_a_throughput_run(tmp_path):
    from sfibench.reporting.readme_results import generate

    # the committed run with a reference-path row added: the full view shows it, the compact one does not
    run = tmp_path / "throughput-qwen3-0.6b-h200"
    shutil.copytree(ROOT / "reports" / run.name, run)
    doc = json.loads((run / "results.json").read_text())
    rows = doc["results"]["rows"]
    rows.append({**next(r for r in rows if r["method"] == "sfi"), "path": "reference", "publish": None})
    (run / "results.json").write_text(json.dumps(doc))

    def block(view: str) -> str:
        return generate(f"<!-- results:begin {view} {run.name} -->\n<!-- results:end -->\n", tmp_path)

    full, compact, floors = block("full"), block("compact"), block("floors")
    assert "| sfi | reference |" in full and "![throughput]" in full
    assert "| sfi | reference |" not in compact and "![throughput]" not in compact
    assert "| sfi sync | optimized |" in compact and "roofline speedup" in compact
    cells = re.findall(r"\| (\d+\.\d{3}) \((\d+\.\d\d)x\)", floors)
    assert cells and all(float(ratio) > 0.5 for _, ratio in cells)


def test_the_floors_view_refuses_a_run_that_is_not_a_throughput_run():
    from sfibench.reporting.readme_results import generate

    with pytest.raises(ValueError, match="floors"):
        generate("<!-- results:begin floors stability-smollm2 -->\n<!-- results:end -->\n", ROOT / "reports")


def test_readme_results_refuse_a_missing_or_garbled_results_json(tmp_path):
    from sfibench.reporting.readme_results import ReadmeResultsError, generate

    block = "<!-- results:begin {} -->\nold\n<!-- results:end -->\n"
    (tmp_path / "truncated").mkdir()
    (tmp_path / "truncated" / "results.json").write_text('{"schema_version": 1, "command": "quality", "con')
    with pytest.raises(ReadmeResultsError, match=r"shows truncated, but .*not valid JSON"):
        generate(block.format("truncated"), tmp_path)
    with pytest.raises(ReadmeResultsError, match=r"shows gone, but .*gone/results.json does not exist"):
        generate(block.format("gone"), tmp_path)
    with pytest.raises(ReadmeResultsError, match="without its results:end"):
        generate("<!-- results:begin gone -->\nno end\n", tmp_path)
    with pytest.raises(ReadmeResultsError, match="names no report folder"):
        generate(block.format(""), tmp_path)
