"""Where along a list answer the values go wrong: places right, grouped along the list."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers import write_quality_run

# a maintainer's script, not the package
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from list_recall_by_position import group_bounds, main, places_right  # noqa: E402

VALUES = [str(1000 + i) for i in range(8)]


def _run(tmp_path: Path, answers: dict[str, list[str]]) -> Path:
    """A run whose method m answered the prompts answers[m], each asking for VALUES in order."""
    samples = [{"task": "niah_list", "context": 1024, "retention": None if m == "full_kv" else 0.25,
                "index": i, "method": m, "prediction": [text], "answers": [VALUES], "score": 0.0,
                "prompt_tokens": 1000, "steps_by_kind": {"fast": 8}}
               for m, texts in answers.items() for i, text in enumerate(texts)]
    # a one-value answer has nothing to place
    samples.append({"task": "niah_single", "context": 1024, "retention": 0.25, "index": 0, "method": "sfi",
                    "prediction": ["1000"], "answers": [["1000"]], "score": 1.0, "prompt_tokens": 1000,
                    "steps_by_kind": {"fast": 1}})
    return write_quality_run(tmp_path / "run", samples)


def test_a_place_is_right_only_where_its_number_is_that_value():
    # 1001 and 1002 swapped, and the answer stops after five numbers
    assert places_right("1000, 1002. Then 1001 and 1003; 1004", VALUES) == [True, False, False, True, True,
                                                                          False, False, False]


def test_groups_cover_every_place_once():
    for count, groups in [(16, 4), (7, 3), (2, 4), (64, 4)]:
        bounds = group_bounds(count, groups)
        assert bounds[0][0] == 0 and bounds[-1][1] == count
        assert all(hi > lo for lo, hi in bounds) and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


def test_shares_per_group_and_method(tmp_path, capsys):
    right = " ".join(VALUES)
    first_half = " ".join(VALUES[:4] + ["9"] * 4)
    run = _run(tmp_path, {"full_kv": [right, right], "sfi": [right, first_half]})
    main([str(run), "--groups", "2"])
    out = capsys.readouterr().out
    assert "| full_kv | niah_list | 1024 | dense | 8 | 2 | 100% | 100% |" in out
    assert "| sfi | niah_list | 1024 | 0.25 | 8 | 2 | 100% | 50% |" in out
    assert "values 1-4 | values 5-8" in out and "niah_single" not in out
    main([f"{run}:sfi"])
    assert "full_kv" not in capsys.readouterr().out.split("\n\n")[0]


def test_bad_input_is_one_error_line(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        main([str(tmp_path / "missing")])
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--groups", "0"])


def test_shared_keeps_only_prompts_every_method_answered(tmp_path, capsys):
    right, wrong = " ".join(VALUES), "0"
    run = _run(tmp_path, {"full_kv": [right, right, wrong], "sfi": [wrong, wrong]})
    main([str(run)])
    assert "| full_kv | niah_list | 1024 | dense | 8 | 3 | 67% |" in capsys.readouterr().out
    main([str(run), "--shared"])  # the third prompt is Full-KV's alone
    assert "| full_kv | niah_list | 1024 | dense | 8 | 2 | 100% |" in capsys.readouterr().out
