"""ppl: long natural text, scored by perplexity and fidelity rather than by an answer.

The prompt is a run of essay prose just below the target length; every method is then teacher-forced
on the next `CONTINUATION` tokens of the same text, so its perplexity and its per-step KL to Full-KV
are measured on identical inputs (and SFI's sentence triggers fire at natural rates).
"""

from __future__ import annotations

from sfibench.workloads.base import Sample, fit_to_tokens, register_task
from sfibench.workloads.haystack import Haystack

CONTINUATION = 64


@register_task("ppl", f"perplexity of {CONTINUATION} tokens of essay prose after a long prefix")
def long_text(fmt, target, rng, index):
    haystack = Haystack(rng)

    def render(n: int) -> list[int]:
        return fmt.starting(fmt.tokenizer.encode(" ".join(haystack.filler(n))))

    _, ids = fit_to_tokens(render, target + CONTINUATION, most=target + CONTINUATION, what="ppl")
    return Sample("ppl", index, ids[:-CONTINUATION], [], max_answer_tokens=0, teacher=ids[-CONTINUATION:],
                  scorer="perplexity", meta={"start_sentence": haystack.start})
