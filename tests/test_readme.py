"""README's claims, checked where a test can: its command list, the needle demo's methods, which
commands run with no arguments, and that README, docs/ and --help point only inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from no_model import ModelLoaded, forbid_model_loading
from typer.main import get_command
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.workloads.needle_demo import DEMO_METHODS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
COMMANDS = sorted(get_command(app).commands)
NAMES = {"full_kv": "Full-KV", "sfi": "SFI", "streaming_llm": "StreamingLLM", "snapkv": "SnapKV"}


def section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_command_list_is_the_clis():
    listed = re.findall(r"^    sfibench (\w+)", section("Commands"), flags=re.MULTILINE)
    assert sorted(listed) == COMMANDS


def test_the_needle_demo_runs_the_methods_readme_names():
    demo = section("SFI sees a needle that StreamingLLM evicted")
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


def test_readme_docs_and_help_point_only_inside_the_repository():
    helps = [CliRunner().invoke(app, [*command, "--help"]).output for command in [[], *([c] for c in COMMANDS)]]
    docs = [path.read_text(encoding="utf-8") for path in (ROOT / "docs").glob("*.md")]
    for text in [README, *docs, *helps]:
        assert "SPEC.md" not in text and "DESIGN.md" not in text and "../" not in text
    for page, text in [(ROOT / "README.md", README), *zip((ROOT / "docs").glob("*.md"), docs)]:
        for target in re.findall(r"\]\(([^)#]+)\)", text):
            if not target.startswith("http"):
                assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_readme_results_blocks_are_what_the_committed_reports_generate():
    from sfibench.reporting.readme_results import generate

    assert README.count("<!-- results:begin ") >= 5
    assert generate(README, ROOT / "reports") == README, \
        "README.md's results blocks are stale: run python -m sfibench.reporting.readme_results"


def test_every_readme_results_run_shows_its_plot_and_conditions():
    blocks = re.findall(r"<!-- results:begin [^>]*-->\n(.*?)<!-- results:end -->", README, flags=re.DOTALL)
    runs = [run for block in blocks for run in re.split(r"\n(?=\*\*\[)", block.strip())]
    assert len(runs) >= 8
    for run in runs:
        assert re.match(r"\*\*\[[\w.-]+\]\(reports/[\w.-]+/report\.md\)\*\*: ", run), run[:80]
        assert re.search(r"!\[[^\]]*\]\(reports/[\w.-]+/\w+\.png\)", run), f"no plot in {run[:80]}"


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
