"""Quality scoring: task scorers, confidence intervals, and fidelity to Full-KV.

Task scorers follow RULER: a prediction earns the fraction of reference strings it contains. Matches
are whole-token (a reference digit string inside a longer number does not count), so "4992383" is
not accepted for the reference "499238" and neither is "49923830" for "4992383": a sparse method
that drops or repeats one digit must score zero, not pass a substring test.

A list answer (`ordered_list`) earns the share of its values recalled in the requested order, and a reasoned
answer (`final_answer`) is scored on what follows its last "Answer:".

Fidelity compares a method's next-token distributions with Full-KV's on the same token stream
(teacher forcing on the Full-KV continuation): KL(full || method), top-1 agreement, perplexity.
"""

from __future__ import annotations

import math
import random
import re

import torch

Z_95 = 1.959963984540054  # two-sided 95% normal quantile


def _contains_whole(prediction: str, reference: str) -> bool:
    """`reference` occurs in `prediction` not glued to further letters or digits (case-insensitive)."""
    pattern = r"(?<![0-9A-Za-z])" + re.escape(reference.strip()) + r"(?![0-9A-Za-z])"
    return re.search(pattern, prediction, flags=re.IGNORECASE) is not None


def string_match_all(prediction: str, references: list[str]) -> float:
    """Fraction of the references found in the prediction (RULER's metric for every task here)."""
    if not references:
        raise ValueError("a sample needs at least one reference answer to be scored")
    return sum(_contains_whole(prediction, ref) for ref in references) / len(references)


def numbers_in(text: str) -> list[str]:
    """Every maximal run of digits in `text`, in order ("1,234" is two numbers: 1 and 234)."""
    return re.findall(r"[0-9]+", text)


def _common_subsequence(a: list[str], b: list[str]) -> int:
    """Length of the longest common subsequence of two sequences."""
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def ordered_recall(prediction: str, references: list[str]) -> float:
    """Share of the references recalled in their order: LCS(numbers of the prediction, references) / N.

    A value counts where it stands in the requested order relative to the others: a value missing, wrong
    or out of place costs one (two swapped values cost one: one of them can stay in order), numbers of
    chatter cost nothing unless they displace a value.
    """
    if not references:
        raise ValueError("a sample needs at least one reference answer to be scored")
    return _common_subsequence(numbers_in(prediction), [r.strip() for r in references]) / len(references)


def ordered_exact(prediction: str, references: list[str]) -> float:
    """1.0 when the prediction's first N numbers are the N references in order, else 0.0 (what follows the
    list, such as a base model continuing past it, is not judged)."""
    return float(numbers_in(prediction)[:len(references)] == [r.strip() for r in references])


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (sane at 0/n and n/n, unlike the normal one)."""
    if n <= 0:
        raise ValueError("a confidence interval needs at least one sample")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in [0, {n}], got {successes}")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_ci(scores: list[float], resamples: int = 2000, seed: int = 0) -> dict:
    """Mean score with a 95% interval: Wilson when every score is 0 or 1, else a seeded bootstrap.

    Partial-credit tasks (multi-value, word lists, LongBench F1) are not binomial, so Wilson would
    misstate their spread; the percentile bootstrap makes no such assumption.
    """
    if not scores:
        raise ValueError("a confidence interval needs at least one sample")
    n, mean = len(scores), sum(scores) / len(scores)
    if all(s in (0.0, 1.0) for s in scores):
        low, high = wilson_interval(int(sum(scores)), n)
        return {"mean": mean, "low": low, "high": high, "n": n, "interval": "wilson"}
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(scores, k=n)) / n for _ in range(resamples))
    low, high = means[int(0.025 * resamples)], means[min(int(0.975 * resamples), resamples - 1)]
    return {"mean": mean, "low": low, "high": high, "n": n, "interval": "bootstrap"}


# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom (beyond: the normal's)
T_95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def token_agreement(reference: list[int], candidate: list[int]) -> float:
    """Greedy-token agreement: fraction of the reference's positions where the candidate has the same id."""
    if not reference:
        return 1.0
    return sum(a == b for a, b in zip(reference, candidate)) / len(reference)


def kl_per_step(full_logits: torch.Tensor, method_logits: torch.Tensor) -> torch.Tensor:
    """KL(full || method) in nats for each row of `[N, V]` logits."""
    p = full_logits.float().log_softmax(dim=-1)
    q = method_logits.float().log_softmax(dim=-1)
    return (p.exp() * (p - q)).sum(dim=-1).clamp(min=0.0)  # clamp: rounding can give -1e-9


def top1_agreement(full_logits: torch.Tensor, method_logits: torch.Tensor) -> float:
    """Fraction of steps where both distributions put their maximum on the same token."""
    if full_logits.shape[0] == 0:
        return 1.0
    return float((full_logits.argmax(dim=-1) == method_logits.argmax(dim=-1)).float().mean())


def negative_log_likelihood(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-step NLL (nats) of `targets [N]` under `logits [N, V]`; perplexity = exp(mean)."""
    return torch.nn.functional.cross_entropy(logits.float(), targets.long(), reduction="none")


def final_answer_text(prediction: str) -> str | None:
    """The final answer of a reasoned answer: the rest of the line of its last "Answer:" (case-insensitive), or
    the next line with a word character where that rest has none; None when there is no "Answer:". Only that
    line counts: a model that repeats the instruction ('end with a line of the form "Answer: <number>"') and
    then lists every value has not answered."""
    found = list(re.finditer(r"answer\s*:", prediction, flags=re.IGNORECASE))
    if not found:
        return None
    rest = prediction[found[-1].end():].split("\n")
    return next((line for line in rest if re.search(r"\w", line)), "")  # "**Answer:**" leaves only the emphasis


def final_answer(prediction: str, references: list[str]) -> float:
    """`string_match_all` on the final answer's line only: reasoning before it may name anything, and a prediction
    without an "Answer:" line scores 0."""
    text = final_answer_text(prediction)
    return 0.0 if text is None else string_match_all(text, references)


def exact_list(scorer: str, prediction: str, references: list[str]) -> float | None:
    """Exact match of a whole list answer (scorers that list values in order), else None."""
    return ordered_exact(prediction, references) if scorer == "ordered_list" else None


def score_answer(scorer: str, prediction: str, references: list[str], meta: dict | None = None) -> float:
    """Score one turn's prediction with the sample's scorer: `string_match_all` or `longbench:<dataset>`."""
    if scorer == "string_match_all":
        return string_match_all(prediction, references)
    if scorer == "ordered_list":
        return ordered_recall(prediction, references)
    if scorer == "final_answer":
        return final_answer(prediction, references)
    if scorer.startswith("ruler:"):  # RULER's own metrics, named in its package's evaluation configuration
        from sfibench.metrics import ruler

        return ruler.score(scorer.split(":", 1)[1], prediction, references)
    if scorer.startswith("longbench:"):
        from sfibench.metrics import longbench

        return longbench.score(scorer.split(":", 1)[1], prediction, references, (meta or {}).get("all_classes"))
    raise ValueError(f"unknown scorer {scorer!r}")
