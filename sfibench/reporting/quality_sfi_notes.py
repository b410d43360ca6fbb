"""What a quality report says about SFI's cells beyond their numbers: where SFI scores below Full-KV, what
docs/findings.md showed to be the cause and which variant tests it; where SFI wrote the same wrong answers at
every retention, why its fidelity then barely moves with the budget."""

from __future__ import annotations

from sfibench import registry
from sfibench.reporting.quality_paired import SOLVED, comparisons, lower_by_more_than

FINDINGS = "docs/findings.md"
VARIANT_FLAGS = "--no-nms --keep-neighbours 7"


def losing_cells(cells: list[dict], records: list[dict] | None = None,
                 paired: list[dict] | None = None) -> list[tuple[dict, dict]]:
    """(SFI's cell, Full-KV's cell) for every task, context and retention where SFI scored below a Full-KV
    that solves the task (a cell Full-KV fails decides nothing). With per-sample records, "below" is the
    paired verdict (the interval excludes 0 and the exact test agrees), so a drop within noise is not one."""
    dense = {(c["task"], c["context"]): c for c in cells if c["method"] == registry.dense().name
             and c["accuracy"] is not None and c["accuracy"] >= SOLVED}
    if paired is None:  # the records' comparisons, unless the caller made them
        paired = comparisons(records or [], cells)
    sfi_against_full = {(r["task"], r["context"], r["retention"]): r["comparison"] for r in paired
                        if r["method"] == registry.BUDGET_REFERENCE and r["comparison"] is not None
                        and r["against"] == registry.dense().name}
    pairs = []
    for cell in cells:
        full = dense.get((cell["task"], cell["context"]))
        if cell["method"] != registry.BUDGET_REFERENCE or not full or cell["accuracy"] is None:
            continue
        comparison = sfi_against_full.get((cell["task"], cell["context"], cell["retention"]))
        lower = (lower_by_more_than(comparison, 0.0) if comparison is not None
                 else cell["accuracy"] < full["accuracy"])
        if lower:
            pairs.append((cell, full))
    return pairs


def below_full_kv_note(cfg: dict, cells: list[dict], records: list[dict] | None = None,
                       paired: list[dict] | None = None) -> list[str]:
    """A paragraph where SFI scored below Full-KV: the cells, the cause the findings showed on Gemma-3
    (Soft-NMS suppressing the needle's neighbours), and the variant flags that test it; empty where SFI did
    not lose."""
    losing = losing_cells(cells, records, paired)
    if not losing:
        return []
    by_shape: dict[tuple, list[tuple[dict, dict]]] = {}
    for sfi, full in losing:
        by_shape.setdefault((sfi["task"], sfi["context"]), []).append((sfi, full))
    where = "; ".join(_shape_scores(task, context, pairs) for (task, context), pairs in by_shape.items())
    variant = cfg.get("sfi_variant") or {}
    text = (f"**SFI scores below Full-KV** ({where}). Between refreshes a fast step reads only what SFI's "
            "last selection holds, and a short answer may get no refresh after the prompt's (the refresh "
            "section below counts them): it is copied from what the prompt's selection kept. On "
            f"Gemma-3-270M ({FINDINGS}, niah_single at 8K) the cause of SFI's needle failures was the "
            "Selector's Soft-NMS: it lowers every position by its distance below the highest score within "
            "±16 positions, so the tokens right after the needle's strongest peak, its remaining digits, are "
            "the last the top-K takes at any k_head; without Soft-NMS and keeping each peak's neighbours, "
            "SFI answered as Full-KV did. ")
    if variant.get("use_nms") is False or variant.get("keep_neighbours", 1) > 1:
        settings = ", ".join(f"{k}={v}" for k, v in variant.items())
        text += (f"This run's SFI already ran as that variant ({settings}), so Soft-NMS does not explain "
                 "these cells.")
    else:
        text += ("The variant that tests this on this model (an ablation beyond the paper): repeat the run "
                 f"with `--methods {registry.BUDGET_REFERENCE} {VARIANT_FLAGS}`.")
    return [text, ""]


def _shape_scores(task: str, context: int, pairs: list[tuple[dict, dict]]) -> str:
    """'niah_single at 2,048 tokens: 0.00 / 0.15 at retention 0.15 / 0.5, Full-KV 1.00'."""
    scores = " / ".join(f"{sfi['accuracy']:.2f}" for sfi, _ in pairs)
    retentions = " / ".join(f"{sfi['retention']:g}" for sfi, _ in pairs)
    return (f"{task} at {context:,} tokens: {scores} at retention {retentions}, "
            f"Full-KV {pairs[0][1]['accuracy']:.2f}")


def same_answers_note(samples: list[dict] | None) -> list[str]:
    """A line per (task, context) where SFI wrote the same wrong answer (scored below Full-KV's on that
    prompt, or below 1 where Full-KV did not run) at every retention on at least half the prompts: its
    fidelity then barely moves with the budget, and this is why (docs/findings.md measured it). The same
    right answer at every budget needs no explanation."""
    dense_scores = {(r["task"], r["context"], r["index"]): r.get("score") for r in samples or []
                    if r["method"] == registry.dense().name}
    by_shape: dict[tuple, dict[int, dict]] = {}
    for record in samples or []:
        if record["method"] == registry.BUDGET_REFERENCE and record.get("prediction") is not None:
            answers = by_shape.setdefault((record["task"], record["context"]), {})
            answers.setdefault(record["index"], {})[record["retention"]] = record
    lines = []
    for (task, context), prompts in by_shape.items():
        retentions = sorted({r for answers in prompts.values() for r in answers})
        if len(retentions) < 2:
            continue
        same = sum(len(answers) == len(retentions) and len({str(a["prediction"]) for a in answers.values()}) == 1
                   and _wrong(next(iter(answers.values())), dense_scores.get((task, context, index)))
                   for index, answers in prompts.items())
        if 2 * same >= len(prompts):
            spelled = " / ".join(f"{r:g}" for r in retentions)
            lines.append(f"**SFI wrote the same wrong answer at retention {spelled} on {same} of {len(prompts)} "
                         f"{task} prompts at {context:,} tokens**, so its fidelity there barely moves with "
                         "the budget: a larger selection did not give the heads that copy the answer what "
                         f"they need (on smollm2 at 2K, measured in {FINDINGS}: the needle's digits stay in "
                         "a minority of the (layer, KV head) selections at either budget).")
    return lines + ([""] if lines else [])


def _wrong(record: dict, dense_score: float | None) -> bool:
    """SFI's answer lost to Full-KV's on this prompt (below a perfect score where Full-KV has none)."""
    score = record.get("score")
    if score is None:
        return False
    return score < (dense_score if dense_score is not None else 1.0)
