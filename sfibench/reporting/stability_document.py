"""Reading a `sfibench stability` results document: its segments and the memories each compared.

A run analyses one segment per (context, prompt) and saves them under `segments`; runs saved before
segments existed hold their one analysis at the top level of `results`, which reads as one segment.
"""

from __future__ import annotations

# results.json records each memory's label; runs saved without them compared these three
UNLABELLED = {"stale": "SFI, selected at t0 (stale)", "fresh": "SFI, selected at t (fresh)",
              "streaming": "StreamingLLM"}
REFERENCE = "stale"  # the budget reference's memory: every other memory reads as many tokens


def segments(results: dict) -> list[dict]:
    """Every analysed segment, each with a `label` (a run of one text has the label "text")."""
    if "segments" in results:
        return results["segments"]
    return [{"label": "text", **results}]


def memory_labels(segment: dict) -> dict[str, str]:
    """Name -> label of every memory the segment compared, the budget reference's first; every memory but
    the reference's reads as many tokens per (layer, KV head) as its stale memory."""
    return {name: entry.get("label") or UNLABELLED.get(name, name) for name, entry in segment["recall"].items()}


def layer_names(results: dict, segment: dict) -> list[str]:
    """The model layer of each analysed row (every layer, in order, for runs that do not say)."""
    layers = segment.get("layers") or results.get("layers")
    if layers is None:
        layers = range(len(segment["consecutive"]["topk"]["within"]["overlap_per_layer"]))
    return [str(layer) for layer in layers]
