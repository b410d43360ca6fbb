"""How many of a needle's value tokens does SFI's bootstrap (prefill) selection hold?

For 6 seeded prompts of niah_single (a 7-digit number) and niah_single_word at 2K tokens on
smollm2-135m, SFI at retention 0.15 selects about 250 of ~1,790 candidates per layer and KV head, so
a random pick would hold any one token ~14% of the time. For each value token j this prints the share
of (layer, KV head) pairs whose selection contains it, with SPEC's Selector and without Soft-NMS.
A fast step can only attend to what the selection (or the sinks and recent window) holds, so this is
what decides whether the digits after the first can be copied before the next slow step.

    python benchmarks/selection_coverage.py      # CPU, about two minutes
"""

from __future__ import annotations

import copy

import torch

from sfibench.engine.prefill import restore
from sfibench.engine.session import Session
from sfibench.methods import create_method
from sfibench.runners.quality_batch import make_condition
from sfibench.workloads.base import PromptFormat, make_samples

CONTEXT, RETENTION, SAMPLES, MOST_TOKENS = 2048, 0.15, 6, 8


def value_token_coverage(session: Session, task: str, variant: dict) -> list[float]:
    """Share of (layer, KV head) selections holding value token j, for j = 0.. (up to MOST_TOKENS)."""
    tokenizer, cfg = session.loaded.tokenizer, session.loaded.config
    held, seen = torch.zeros(MOST_TOKENS), torch.zeros(MOST_TOKENS)
    for sample in make_samples(task, PromptFormat(tokenizer, chat=True), CONTEXT, SAMPLES, seed=0):
        prompt = sample.prompt
        value = tokenizer.encode(" " + sample.meta["needles"][0]["value"])[:MOST_TOKENS]
        start = next(i for i in range(len(prompt)) if prompt[i:i + len(value)] == value)
        prefilled = session.prefill([prompt], 16)
        spec = make_condition("sfi", RETENTION, CONTEXT, sfi_variant=variant).spec
        method = create_method(copy.deepcopy(spec), cfg, tokenizer)
        restore(session.cache, prefilled)
        method.start(session.cache, prefilled)  # the bootstrap refresh from the last prompt queries
        for layer in range(cfg.num_layers):
            selected = method.selected[layer, 0, :, : int(method.selected_count[layer, 0])]  # [H_kv, K]
            for j in range(len(value)):
                held[j] += (selected == start + j).any(dim=-1).sum()
                seen[j] += cfg.num_kv_heads
    return [float(held[j] / seen[j]) for j in range(MOST_TOKENS) if seen[j] > 0]


def main() -> None:
    torch.set_num_threads(1)
    session = Session.open("smollm2-135m", device="cpu", dtype="float32")
    for task in ("niah_single", "niah_single_word"):
        for name, variant in (("SPEC Selector", {}), ("without Soft-NMS", {"use_nms": False})):
            shares = value_token_coverage(session, task, variant)
            print(f"{task}, {name}: share of (layer, KV head) selections holding value token j = "
                  f"{', '.join(f'{s:.2f}' for s in shares)}", flush=True)


if __name__ == "__main__":
    main()
