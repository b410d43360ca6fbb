"""`sfibench generate`'s closing summary: steps by kind and tokens read against the budget in words, and
slow-step highlighting only where the output is a terminal."""

from __future__ import annotations

import io

from rich.console import Console
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.reporting.generate_summary import summary_lines
from sfibench.runners.generate import TextStreamer

SLOW_EVERY_FOURTH = ["generate", "--model", "tiny-llama", "--max-new-tokens", "10", "--budget", "15%",
                     "--trigger", "fixed", "--interval", "4", "--min-gap", "1"]


def test_the_summary_says_in_words_what_each_kind_of_step_read_and_why():
    result = CliRunner().invoke(app, SLOW_EVERY_FOURTH)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "{" not in text.split("generated")[-1]  # no Python dict in the summary
    assert "2,560 prompt tokens, 10 generated: the first by the prefill, then 7 fast steps and 2 slow steps" in text
    assert "against a budget of 384 (15.0% of the prompt)" in text
    assert "A slow step reads every cached token." in text
    assert "A fast step reads" in text and "more than the budget on average" in text
    assert "Mean retention" in text
    assert "highlighted" not in text  # CliRunner's output is no terminal: nothing is highlighted


def test_a_method_reading_exactly_its_budget_needs_no_reason():
    result = {"prompt_tokens": 1000, "generated_ids": [1, 2, 3], "budget_tokens": 100,
              "summary": {"steps_by_kind": {"sparse": 2}, "mean_retention": 0.1},
              "steps": [{"kind": "sparse", "tokens_read_mean": 100.0, "kv_length": 1001},
                        {"kind": "sparse", "tokens_read_mean": 100.0, "kv_length": 1002}]}
    lines = summary_lines(result)
    assert lines[0] == "1,000 prompt tokens, 3 generated: the first by the prefill, then 2 sparse steps."
    assert lines[1] == "Tokens read per layer and KV head: 100 on a sparse step against a budget of 100 (10.0% of the prompt)."
    assert len(lines) == 3 and lines[2].startswith("Mean retention 0.100")


class _Record:
    kinds = ["slow"]


class _Letters:
    """Token i is the character chr(i)."""

    def readable(self, ids):  # the text a reader is shown (no control tokens in this one)
        return "".join(map(chr, ids))


def test_slow_steps_are_highlighted_only_on_a_terminal():
    tokenizer = _Letters()
    for terminal in (True, False):
        console = Console(file=io.StringIO(), force_terminal=terminal, color_system="standard")
        TextStreamer(tokenizer, console, enabled=True)(0, [65], _Record())
        written = console.file.getvalue()
        assert ("\x1b[" in written) is terminal, written
