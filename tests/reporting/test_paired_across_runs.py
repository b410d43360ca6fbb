"""Pairing one method of a quality run with one method of another run on the same prompts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sfibench.reporting.results import SCHEMA_VERSION

# a maintainer's script, not the package
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from paired_across_runs import main  # noqa: E402

CONFIG = {"model": "m", "seed": 0, "chat": True}


def _run(tmp_path: Path, name: str, method: str, scores: list[float], kls: list[float], config=None,
         prompt_tokens: int = 100, retention: float | None = 0.25) -> Path:
    run = tmp_path / name
    run.mkdir()
    where = {"task": "niah_list", "context": 1024, "retention": retention, "prompt_tokens": prompt_tokens,
             "steps_by_kind": {"fast": 8}}
    samples = [{**where, "index": i, "method": method, "score": s, "kl": k}
               for i, (s, k) in enumerate(zip(scores, kls))]
    # another method's record of the same prompt must stay out of the pairing
    samples.append({**where, "index": 0, "method": "other", "score": 1.0, "kl": 9.0})
    document = {"schema_version": SCHEMA_VERSION, "command": "quality", "config": config or CONFIG,
                "provenance": {"git_commit": "abc"}, "results": {"cells": []}, "samples": samples}
    (run / "results.json").write_text(json.dumps(document))
    return run


def test_pairs_by_prompt_and_tests_the_difference(tmp_path, capsys):
    a = _run(tmp_path, "a", "sfi", [1.0] * 10 + [0.0] * 2, [0.1] * 12)
    b = _run(tmp_path, "b", "snapkv", [0.0] * 10 + [1.0] * 2, [0.3] * 12)
    assert main([f"{a}:sfi", f"{b}:snapkv"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| niah_list"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # n, A, B; b / c = 10 / 2; exact McNemar p of 10 of 12 at 1/2 = 0.039; KL difference -0.2 exactly
    assert cells[3:6] == ["12", "0.83", "0.17"] and cells[7] == "10 / 2" and cells[8] == "0.04"
    assert cells[11] == "-0.200 [-0.200, -0.200]"


def test_only_shared_prompts_at_equal_retention_pair(tmp_path, capsys):
    a = _run(tmp_path, "a", "sfi", [1.0] * 6, [0.0] * 6)
    b = _run(tmp_path, "b", "sfi", [1.0] * 4, [0.0] * 4)
    main([f"{a}:sfi", f"{b}:sfi"])
    assert "| 0.25 | 4 |" in capsys.readouterr().out
    c = _run(tmp_path, "c", "sfi", [1.0] * 4, [0.0] * 4, retention=0.5)
    with pytest.raises(SystemExit, match="no prompt is scored by both"):
        main([f"{a}:sfi", f"{c}:sfi"])


def test_runs_of_different_prompts_are_refused(tmp_path):
    a = _run(tmp_path, "a", "sfi", [1.0] * 3, [0.0] * 3)
    seed = _run(tmp_path, "seed", "sfi", [1.0] * 3, [0.0] * 3, config={**CONFIG, "seed": 1})
    with pytest.raises(SystemExit, match="differ in seed"):
        main([f"{a}:sfi", f"{seed}:sfi"])
    longer = _run(tmp_path, "longer", "sfi", [1.0] * 3, [0.0] * 3, prompt_tokens=101)
    with pytest.raises(SystemExit, match="built different prompts"):
        main([f"{a}:sfi", f"{longer}:sfi"])
    with pytest.raises(SystemExit, match="is not RUN_DIR:METHOD"):
        main([str(a), f"{a}:sfi"])


def test_a_folder_without_a_run_is_one_error_line(tmp_path):
    a = _run(tmp_path, "a", "sfi", [1.0] * 3, [0.0] * 3)
    with pytest.raises(SystemExit, match="holds no results.json"):
        main([f"{a}:sfi", f"{tmp_path}:sfi"])
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.json").write_text('{"config": ')
    with pytest.raises(SystemExit, match="^error: "):
        main([f"{a}:sfi", f"{tmp_path / 'broken'}:sfi"])
