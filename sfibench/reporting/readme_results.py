"""The results tables of README.md and docs/*.md, generated from the committed reports so they can never
drift from them.

A page marks each generated block with two comments; the first names the report folders to show,
optionally after a view (`full`, the default; `compact`; `floors`: readme_tables.VIEWS):

    <!-- results:begin compact throughput-qwen3-4b-h200 throughput-qwen3-0.6b-h200 -->
    (generated: each run's conditions, a link to its folder, its table, and in the full view its plot)
    <!-- results:end -->

The `family` view instead draws one table across the named throughput runs, a row per (model, context,
batch) and a column per method (reporting/family_table.py):

    <!-- results:begin family throughput-qwen3-8b-h200 throughput-qwen3-32b-h200 -->

The `grid` view draws one table across the named quality runs, a row per (task, context, budget) and a
column per method, an SFI ablation's column named by its flags (reporting/quality_grid_table.py):

    <!-- results:begin grid quality-qwen2.5-coder-1.5b-32k-h100 quality-qwen2.5-coder-1.5b-niah-list-16k-h100 -->

Only the text between the markers is rewritten; everything else on the page is prose written by
hand. Regenerate after committing new reports (any folder under reports/ may be named):

    python -m sfibench.reporting.readme_results            # rewrite README.md and docs/*.md
    python -m sfibench.reporting.readme_results --check    # exit 1 if a page is out of date
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from sfibench.core.errors import UsageError
from sfibench.reporting.family_table import family_block
from sfibench.reporting.quality_grid_table import grid_block
from sfibench.reporting.readme_tables import VIEWS, run_block
from sfibench.reporting.results import (
    RESULTS_FILENAME,
    InvalidResultsError,
    read_results,
    write_text_atomically,
)

FAMILY = "family"  # one table across the named throughput runs (reporting/family_table.py)
GRID = "grid"  # one table across the named quality runs (reporting/quality_grid_table.py)
BLOCK = re.compile(r"(<!-- results:begin (?P<names>[^>]*?) -->\n)(?P<body>.*?)(<!-- results:end -->)", re.DOTALL)
MARKER = re.compile(r"<!-- results:(begin|end)\b")


class ReadmeResultsError(UsageError):
    """A results block cannot be generated: its markers are unbalanced or a named run is unusable."""


def generate(readme: str, reports: Path, link_root: str = "reports") -> str:
    """`readme` with every results block regenerated from `reports/<name>/results.json`."""
    blocks = list(BLOCK.finditer(readme))
    if len(MARKER.findall(readme)) != 2 * len(blocks):
        raise ReadmeResultsError("README.md has a results:begin marker without its results:end (or the other way "
                                 "round); each block is `<!-- results:begin NAME ... -->` ... `<!-- results:end -->`")
    pieces, last = [], 0
    for block in blocks:
        names = block["names"].split()
        view = names.pop(0) if names and names[0] in (*VIEWS, FAMILY, GRID) else "full"
        if not names:
            raise ReadmeResultsError("a results:begin marker names no report folder; list them after "
                                     "`results:begin`, e.g. `<!-- results:begin stability-smollm2 -->`")
        runs = [(reports / name, f"{link_root}/{name}", _load(reports / name)) for name in names]
        if view == FAMILY:
            body = family_block(runs)
        elif view == GRID:
            body = grid_block(runs)
        else:
            body = [line for folder, link, document in runs for line in run_block(folder, link, document, view)]
        pieces += [readme[last:block.start("body")], "\n".join(body)]
        last = block.end("body")
    return "".join(pieces) + readme[last:]


def _load(folder: Path) -> dict:
    if not (folder / RESULTS_FILENAME).is_file():
        raise ReadmeResultsError(f"README.md shows {folder.name}, but {folder / RESULTS_FILENAME} does not exist; "
                                 "restore the report, or take its name out of the results:begin marker")
    try:
        return read_results(folder)
    except InvalidResultsError as error:
        raise ReadmeResultsError(f"README.md shows {folder.name}, but {error}") from None


def pages(root: Path) -> list[Path]:
    """The pages whose results blocks are generated: README.md and every docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def regenerate(page: Path, reports: Path) -> tuple[str, str]:
    """`page`'s text now and with its blocks regenerated, links written relative to the page."""
    current = page.read_text(encoding="utf-8")
    link_root = Path(os.path.relpath(reports, page.parent)).as_posix()
    return current, generate(current, reports, link_root)


def main(argv: list[str] | None = None) -> int:
    """Rewrite the pages of the current directory (a checkout's root), or with --check only compare."""
    args = sys.argv[1:] if argv is None else argv
    if set(args) - {"--check"}:
        print("usage: python -m sfibench.reporting.readme_results [--check]", file=sys.stderr)
        return 2
    stale = []
    for page in pages(Path(".")):
        try:
            current, fresh = regenerate(page, Path("reports"))
        except (OSError, UsageError) as error:
            print(f"error: {page}: {error}", file=sys.stderr)
            return 2
        if fresh == current:
            continue
        stale.append(page)
        if "--check" not in args:
            write_text_atomically(page, fresh)
            print(f"{page}: {len(BLOCK.findall(fresh))} results blocks rewritten")
    if "--check" in args and stale:
        print(f"{', '.join(map(str, stale))}: results blocks differ from reports/; "
              "run python -m sfibench.reporting.readme_results", file=sys.stderr)
        return 1
    if not stale:
        print("README.md and docs/: every results block up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
