"""The needle demo docs/findings.md quotes: a 3,900-token haystack with one needle word at 60% depth, answered
by each method at a budget of 15% of the prompt, on smollm2-135m on the CPU (about a minute).

    python benchmarks/needle_demo.py

The prompt and the per-method decoding are sfibench/workloads/needle_demo.py's;
tests/commands/test_readme.py checks that findings.md shows one line per method of DEMO_METHODS, in this
order.
"""

from __future__ import annotations

from sfibench.engine.session import Session
from sfibench.workloads.needle_demo import answers_at_retention, needle_prompt

DEMO_METHODS = ("full_kv", "sfi", "streaming_llm")


def main() -> None:
    session = Session.open("smollm2-135m", "cpu")
    prompt, word = needle_prompt(session.loaded.tokenizer, 3900, seed=23, depth=0.6)
    print(f"{len(prompt)}-token prompt, needle word {word!r} at 60% depth; budget 15% of the prompt")
    for method, (text, retention) in answers_at_retention(session, prompt, list(DEMO_METHODS), 0.15).items():
        print(f"{method:>14}  retention {retention:.3f}  answer {text.split('<|im_end|>')[0]!r}")


if __name__ == "__main__":
    main()
