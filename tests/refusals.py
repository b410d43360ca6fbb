"""What every refusal test checks of a command that failed cleanly."""

from __future__ import annotations


def one_line_error(result, *fragments: str) -> str:
    """The output of a refused command as one string, after checking it is one error line with exit 2."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, (KeyError, ValueError, TypeError))
    text = " ".join(result.output.split())
    assert text.count("error:") == 1, text
    text = text[text.index("error:"):]  # after whatever progress the command printed before it failed
    for fragment in fragments:
        assert fragment in text, (fragment, text)
    return text
