"""How reasoned answers end: an "Answer:" line, the value on it or elsewhere, the cap, a loop."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers import write_quality_run

# a maintainer's script, not the package
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from reasoned_answers import loops, main  # noqa: E402

LOOP = "The gyroscope points north and the key is hidden. " * 8


def _run(tmp_path: Path, answers: dict[str, list[tuple[str, float, bool]]]) -> Path:
    """A run whose method m gave answers[m]: (text, score, capped) per prompt, each asking for 4711."""
    samples = [{"task": "niah_reason", "context": 2048, "retention": None if m == "full_kv" else 0.25,
                "index": i, "method": m, "prediction": [text], "answers": [["4711"]], "score": score,
                "answer_capped": capped, "prompt_tokens": 2000, "steps_by_kind": {"fast": 8}}
               for m, given in answers.items() for i, (text, score, capped) in enumerate(given)]
    # a task not scored on a final answer line is left out
    samples.append({"task": "niah_single", "context": 2048, "retention": 0.25, "index": 0, "method": "sfi",
                    "prediction": ["4711"], "answers": [["4711"]], "score": 1.0, "prompt_tokens": 2000,
                    "steps_by_kind": {"fast": 1}})
    return write_quality_run(tmp_path / "run", samples)


def test_a_loop_is_a_long_sentence_repeated_in_the_second_half():
    assert loops("Some reasoning first. " + LOOP)
    assert not loops(LOOP + "x" * 800)  # the loop ended in the first half
    assert not loops("Intro. " + "1. 2. 3. " * 10)  # short pieces repeat in any list


def test_shares_per_method(tmp_path, capsys):
    run = _run(tmp_path, {
        "full_kv": [("Found it.\nAnswer: 4711", 1.0, False), ("The number 4711 was there.", 0.0, False)],
        "sfi": [("Thinking. " + LOOP, 0.0, True), ("Answer: 1234", 0.0, False)],
    })
    main([str(run)])
    out = capsys.readouterr().out
    assert "| full_kv | niah_reason | 2048 | dense | 2 | 50% | 50% | 100% | 0% | 0% |" in out
    assert "| sfi | niah_reason | 2048 | 0.25 | 2 | 50% | 0% | 0% | 50% | 50% |" in out
    assert "niah_single" not in out
    main([f"{run}:sfi"])
    assert "full_kv" not in capsys.readouterr().out.split("\n\n")[0]


def test_a_missing_run_is_one_error_line(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        main([str(tmp_path / "nowhere")])
