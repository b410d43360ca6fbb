"""Every code block in docs/*.md runs as written on the machine README sets up: the ```python blocks of a
page run in order as one script (a page's examples build on each other), each ```bash block on its own. A
block not meant to run says so on its first line, visibly (`# not run: <why>`), and such blocks are few and
each explained. Blocks fenced as another language (text, json) are samples, not code, and are not run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
RUNNABLE = ("python", "bash")
SAMPLES = ("text", "json", "console")
NOT_RUN = re.compile(r"^# not run: (.+)$")
FENCE = re.compile(r"^```(\w*)\s*$")


def blocks(page: Path) -> list[tuple[str, str, int]]:
    """(language, code, line number of the opening fence) of every fenced block of `page`."""
    found, language, code, start = [], None, [], 0
    for number, line in enumerate(page.read_text().splitlines(), 1):
        fence = FENCE.match(line)
        if fence and language is None:
            language, code, start = fence[1], [], number
        elif line.startswith("```") and language is not None:
            found.append((language, "\n".join(code) + "\n", start))
            language = None
        elif language is not None:
            code.append(line)
    assert language is None, f"{page.name}: the block opened at line {start} is never closed"
    return found


def not_run_reason(code: str) -> str | None:
    marked = NOT_RUN.match(code.splitlines()[0]) if code.strip() else None
    return marked[1] if marked else None


EVERY_BLOCK = [(page, *block) for page in DOCS for block in blocks(page)]
RUN_PAGES = sorted({page for page, language, code, _ in EVERY_BLOCK
                    if language in RUNNABLE and not_run_reason(code) is None}, key=str)


def test_every_block_is_code_to_run_a_marked_exception_or_a_sample():
    for page, language, code, line in EVERY_BLOCK:
        fenced = language or "nothing"
        assert language in RUNNABLE + SAMPLES, (f"{page.name}:{line}: a block fenced as {fenced}; fence code "
                                                f"as {' or '.join(RUNNABLE)}, output as text")


def test_blocks_not_run_are_few_and_each_says_why():
    code_blocks = [(page, code, line) for page, language, code, line in EVERY_BLOCK if language in RUNNABLE]
    marked = [(page, not_run_reason(code), line) for page, code, line in code_blocks if not_run_reason(code)]
    for page, reason, line in marked:
        assert len(reason.split()) >= 6, f"{page.name}:{line}: say why the block is not run, in a sentence"
    # the blocks a test cannot run are install lines, the suite itself and multi-GPU or hours-long commands:
    # at most half of the pages' code
    assert len(marked) <= max(1, len(code_blocks) // 2), [f"{p.name}:{line}" for p, _, line in marked]
    assert RUN_PAGES, "no page has a block to run: the docs test would test nothing"
    for page, language, code, line in EVERY_BLOCK:  # the marker is only meaningful on the first line
        below = code.split("\n", 1)[-1]
        assert "# not run:" not in below, f"{page.name}:{line}: a marker below the first line"


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda page: page.name)
def test_every_block_of_a_page_runs_as_written(page, tmp_path):
    """From the repository's root, as a reader who followed README runs them (sfibench importable, the real
    smollm2-135m weights installed); a failure shows the block's output."""
    runnable = [(language, code, line) for language, code, line in blocks(page)
                if language in RUNNABLE and not_run_reason(code) is None]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    script = "".join(code for language, code, _ in runnable if language == "python")
    commands = [[sys.executable, "-c", script]] if script else []
    commands += [["bash", "-euo", "pipefail", "-c", code] for language, code, _ in runnable
                 if language == "bash"]
    for command in commands:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                              check=False)
        assert done.returncode == 0, \
            f"{page.name}: {command[-1][:200]}...\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
