"""Selection coverage: how much of Full-KV's attention each Selector variant's bootstrap selection holds.

    python benchmarks/selection_coverage.py --out DIR [--model smollm2-135m] [--ctx 2k]
        [--retention 0.15 | --sfi-preset paper-2k,paper-4k] [--tasks niah_single,niah_single_word]
        [--samples 6] [--no-chat]

A fast step reads sinks + the selection + the recent window, so what it can copy is what the selection
made at the prompt's end (the bootstrap refresh) holds until the next slow step. Per sample and budget:

1. The prompt is prefilled once; Full-KV writes the answer greedily. At each of its decode steps (the
   queries that write answer tokens 2..n; token 1 comes from the prompt's last query, which is part of
   SFI's own evidence, so it is left out) and each global layer and KV head, the attention weights over
   the whole history are kept, averaged over the KV head's G query heads (what SFI's selection serves).
2. Every row picks K = SFI's k_head at this budget among the same candidates C = [n_sink, recent_start)
   of the prompt: SFI's Selector and its variants (the bootstrap SFI itself runs, from the last
   w_prefill prompt queries); pure evidence (the pooled evidence f alone: no prior, Soft-NMS or
   cross-head stage); SnapKV's score (the last 64 prompt queries' attention, max-pooled over 7) taking
   its top K of C; and K uniformly random candidates, the chance line (expected coverage K / |C|).
3. Attention-mass coverage = mass on the K picks / mass on all of C, summed over the answer steps, global
   layers and KV heads of a sample (mass-weighted), then averaged over samples with a 95% bootstrap
   interval. Fast-step recall = the share of the whole attention mass a fast step would read (sinks,
   picks, and the recent window, which keeps every token after the prompt's recent_start). Value-token
   coverage = the share of (global layer, KV head) selections holding the needle's value token j.

Writes DIR/results.json (per-sample numbers, provenance) and DIR/report.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

from sfibench.baselines.full_kv import FullKVConfig
from sfibench.engine.method import MethodSpec
from sfibench.core.provenance import provenance
from sfibench.engine.prefill import restore
from sfibench.engine.session import Session
from sfibench.engine.turns import Script, run_scripts
from sfibench.registry import create_method
from sfibench.metrics.quality import mean_ci
from sfibench.reporting.formatting import commit_label
from sfibench.runners.quality_batch import make_condition
from sfibench.commands.quality_options import parse_context
from sfibench.sfi import geometry
from sfibench.sfi.config import preset_retention
from sfibench.sfi.selector import top_k_positions
from sfibench.workloads.base import PromptFormat
from sfibench.workloads.tasks import make_samples

MOST_VALUE_TOKENS = 8
# (row name, SFI settings changed from SPEC): the Selector variants, each picking K of C from its own bootstrap
SFI_VARIANTS = (
    ("SFI (SPEC)", {}),
    ("SFI without Soft-NMS", {"use_nms": False}),
    ("SFI, --keep-neighbours 7", {"keep_neighbours": 7}),
    ("SFI without Soft-NMS, --keep-neighbours 7", {"use_nms": False, "keep_neighbours": 7}),
    ("SFI without the prior (lambda = 0)", {"use_prior": False}),
    ("SFI, --evidence-norm visible", {"evidence_norm": "visible"}),
    ("pure evidence (pooled f only)", {"use_prior": False, "use_nms": False, "use_cross_head": False}),
)
SNAPKV, RANDOM = "SnapKV's score, top K of C", "random K of C (chance)"
ROWS = [name for name, _ in SFI_VARIANTS] + [SNAPKV, RANDOM]


def answer_attention(session: Session, prefilled, sample, stop: frozenset, method=None,
                     cap: int | None = None) -> tuple[dict, list[int]]:
    """Full-KV's greedy answer; per global layer, its G-pooled attention weights `[steps, H_kv, L_t]` (a list).

    `method`: another method that attends densely at every step (it then writes Full-KV's answer); `cap`: at
    most this many answer tokens (default: the task's own cap)."""
    cfg = session.loaded.config
    if method is None:
        spec = MethodSpec("full_kv", "reference", FullKVConfig())
        method = create_method(spec, cfg, session.loaded.tokenizer)
    weights: dict[int, list[torch.Tensor]] = {layer: [] for layer in cfg.global_layers}
    attend = method.attend

    def probe(q, cache, ctx, plan):
        if ctx.layer in weights:  # batch of one: row 0; the step's own key is already in the cache
            length = int(ctx.kv_lengths_host[0])
            keys = cache.k[ctx.layer, 0, :, :length].float()  # [H_kv, L, D]
            query = q[0, :, 0].float().view(cfg.num_kv_heads, cfg.group_size, -1)  # [H_kv, G, D]
            logits = torch.einsum("hgd,hld->hgl", query, keys) * query.shape[-1] ** -0.5  # as dense_attention
            weights[ctx.layer].append(logits.softmax(dim=-1).mean(dim=1))
        return attend(q, cache, ctx, plan)

    method.attend = probe
    stream = run_scripts(session.loaded.model, session.cache, method, prefilled,
                         [Script(cap or sample.max_answer_tokens, [], stop)],
                         pad_id=session.loaded.tokenizer.eos_token_id or 0)[0]
    return weights, stream.answers[0]


def sfi_picks(session: Session, prefilled, spec: MethodSpec) -> dict[int, torch.Tensor]:
    """The bootstrap selection of SFI with `spec`, per global layer: absolute positions `[H_kv, K]`."""
    cfg = session.loaded.config
    method = create_method(copy.deepcopy(spec), cfg, session.loaded.tokenizer)
    restore(session.cache, prefilled)
    method.start(session.cache, prefilled)
    return published_picks(method)


def published_picks(method) -> dict[int, torch.Tensor]:
    """The selection an SFI method has published for row 0, per global layer: positions `[H_kv, K]`."""
    sel, picks = method.sel, {}
    for layer in method.model_config.global_layers:
        buffer = int(sel.published_host[layer, 0])
        count = int(sel.counts[buffer, layer, 0].max())
        picks[layer] = sel.positions[buffer, layer, 0, :, :count].clone()
    return picks


def snapkv_picks(session: Session, prefilled, spec: MethodSpec, lo: int, hi: int, k: int) -> dict[int, torch.Tensor]:
    """SnapKV's pooled votes of its last `window` prompt queries, restricted to C, top K (SFI's tie rule)."""
    method = create_method(copy.deepcopy(spec), session.loaded.config, session.loaded.tokenizer)
    prefix = int(prefilled.lengths[0]) - spec.config.window
    return {layer: top_k_positions(method._votes(session.cache, prefilled, layer, 0, prefix)[:, lo:hi], k, lo)
            for layer in session.loaded.config.global_layers}


def random_picks(layers: list[int], heads: int, lo: int, hi: int, k: int, seed: int) -> dict[int, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {layer: top_k_positions(torch.rand(heads, hi - lo, generator=generator), k, lo) for layer in layers}


def masses(weights: dict, picks: dict, lo: int, hi: int) -> tuple[float, float, float]:
    """Attention mass on the picks, on the candidates [lo, hi) and in all, summed over the steps, layers and
    KV heads of `weights` ({layer: [[H_kv, L_t], ...]})."""
    selected = candidates = total = 0.0
    for layer, steps in weights.items():
        chosen = picks[layer]
        for w in steps:  # [H_kv, L_t]
            selected += float(w.gather(-1, chosen).sum())
            candidates += float(w[:, lo:hi].sum())
            total += float(w.sum())
    return selected, candidates, total


def held_shares(picks: dict, positions: list[int]) -> list[float]:
    """Per position: the share of (global layer, KV head) selections that hold it."""
    return [sum(float((picks[layer] == position).any(dim=-1).float().mean()) for layer in picks) / len(picks)
            for position in positions]


def coverage(weights: dict, picks: dict, lo: int, hi: int, value: list[int]) -> dict:
    """One row's numbers on one sample (see the module docstring)."""
    selected, candidates, total = masses(weights, picks, lo, hi)
    held = held_shares(picks, value)
    return {"mass_coverage": selected / candidates if candidates else None,
            "fast_step_recall": 1 - (candidates - selected) / total if total else None,
            "candidate_mass": candidates / total if total else None, "value_token_held": held}


def value_positions(tokenizer, prompt: list[int], value: str) -> list[int]:
    """Where the needle's value tokens sit in the prompt (first occurrence; with or without a leading space,
    whose token, if it is one of its own, is not a value token)."""
    for text in (" " + value, value):
        ids = tokenizer.encode(text)
        while ids and not tokenizer.decode(ids[:1]).strip():
            ids = ids[1:]
        start = next((i for i in range(len(prompt) - len(ids) + 1) if prompt[i:i + len(ids)] == ids), None)
        if ids and start is not None:
            return list(range(start, start + min(len(ids), MOST_VALUE_TOKENS)))
    raise ValueError(f"the needle's value {value!r} is not in the prompt as tokens")


def run(model: str, tasks: list[str], context: int, retentions: list[float], names: list[str], samples: int,
        chat: bool, seed: int, log) -> dict:
    session = Session.open(model, device="cpu", dtype="float32", seed=seed)
    cfg, tokenizer = session.loaded.config, session.loaded.tokenizer
    stop = tokenizer.stop_ids()
    records = []
    for task in tasks:
        for sample in make_samples(task, PromptFormat(tokenizer, chat), context, samples, seed):
            started = time.time()
            value = value_positions(tokenizer, sample.prompt, sample.meta["needles"][0]["value"])
            prefilled = session.prefill([sample.prompt], sample.decode_budget)
            weights, answer = answer_attention(session, prefilled, sample, stop)
            length = int(prefilled.lengths[0])
            for retention, name in zip(retentions, names):
                spec = make_condition("sfi", retention, context).spec
                lo, hi = geometry.candidate_range(length, spec.config)
                k = min(spec.config.k_head, hi - lo)
                rows = {row: sfi_picks(session, prefilled, make_condition("sfi", retention, context, variant=v).spec)
                        for row, v in SFI_VARIANTS}
                rows[SNAPKV] = snapkv_picks(session, prefilled, make_condition("snapkv", retention, context).spec,
                                            lo, hi, k)
                rows[RANDOM] = random_picks(cfg.global_layers, cfg.num_kv_heads, lo, hi, k, seed + sample.index)
                for row, picks in rows.items():
                    assert all(p.shape[-1] == k for p in picks.values()), f"{row} picked other than K={k}"
                    records.append({"task": task, "index": sample.index, "budget": name, "retention": retention,
                                    "row": row, "k": k, "candidates": hi - lo, "answer_steps": len(answer) - 1,
                                    "answer": tokenizer.decode([t for t in answer if t not in stop]),
                                    "expected": sample.meta["needles"][0]["value"],
                                    **coverage(weights, picks, lo, hi, value)})
            log(f"{time.strftime('%H:%M:%S')} {task} #{sample.index}: {length} tokens, "
                f"{time.time() - started:.0f} s")
    return {"model": cfg.name, "layers": cfg.num_layers, "global_layers": len(cfg.global_layers),
            "kv_heads": cfg.num_kv_heads, "group_size": cfg.group_size, "records": records}


def summarise(records: list[dict]) -> list[dict]:
    """Per (task, budget, row): means over samples with 95% bootstrap intervals."""
    cells = []
    keys = list(dict.fromkeys((r["task"], r["budget"], r["row"]) for r in records))
    for task, budget, row in keys:
        here = [r for r in records if (r["task"], r["budget"], r["row"]) == (task, budget, row)]
        cell = {"task": task, "budget": budget, "row": row, "n": len(here), "k": here[0]["k"],
                "candidates": sum(r["candidates"] for r in here) / len(here),
                "value_token_held": [sum(r["value_token_held"][j] for r in here if j < len(r["value_token_held"]))
                                     / sum(1 for r in here if j < len(r["value_token_held"]))
                                     for j in range(max(len(r["value_token_held"]) for r in here))]}
        for metric in ("mass_coverage", "fast_step_recall", "candidate_mass"):
            cell[metric] = mean_ci([r[metric] for r in here])
        cells.append(cell)
    return cells


def markdown(document: dict, command: str) -> str:
    cfg, res, prov = document["config"], document["results"], document["provenance"]
    cells = res["cells"]
    lines = [f"# Selection coverage — {res['model']}", "",
             f"{prov.get('timestamp_utc')}, cpu ({prov.get('cpu')}, torch threads: {cfg['threads']}), float32, commit "
             f"{commit_label(prov)}, wall time {res['wall_s'] / 60:.1f} min.", "", "    " + command, "",
             "## What ran", "",
             (f"- {', '.join(cfg['tasks'])} at {cfg['context']} prompt tokens, {cfg['samples']} seeded samples each "
              f"({'chat template' if cfg['chat'] else 'plain prompts'} + answer prefix); budget(s): "
              + ", ".join(name if name.startswith("retention") else f"{name} (retention {r:g})"
                          for name, r in zip(cfg["budgets"], cfg["retentions"]))
              + " with quality's budget rule, so K = SFI's k_head at that budget."),
             (f"- {res['model']}: {res['layers']} layers, {res['global_layers']} of them global (only those hold a "
              f"selection), {res['kv_heads']} KV heads of {res['group_size']} query heads each."),
             ("- Attention: Full-KV's own greedy answer; at each decode step writing answer tokens 2..n (the first "
              "comes from the prompt's last query, part of SFI's evidence, so it is left out), every global layer and "
              "KV head, softmax attention over the whole history averaged over the head's query heads."),
             ("- Every row picks exactly K of the same candidates C = [sinks, recent_start) of the prompt: the SFI rows "
              "by running SFI's bootstrap (last w_prefill = 16 prompt queries) with the setting named; pure evidence = "
              "the pooled evidence f alone (no prior, Soft-NMS or cross-head stage); SnapKV = SnapKV's score (mean "
              "attention of the last 64 prompt queries, max-pooled over 7 positions) over C, top K; random = K "
              "uniform candidates (its expected coverage is K/|C|, the chance line). The rows without Soft-NMS, with "
              "--keep-neighbours or with --evidence-norm visible are ablations beyond the paper."),
             ("- mass coverage = attention mass on the K picks / mass on all of C (summed over answer steps, layers and "
              "heads of a sample); fast-step recall = share of all attention mass on sinks + picks + the recent "
              "window (what a fast step reads before the next refresh); C's share = attention mass on C at all. "
              "Means over samples with 95% bootstrap intervals. Value token j = share of (global layer, KV head) "
              "selections holding the needle value's j-th token (averaged over samples)."), ""]
    for task in cfg["tasks"]:
        for budget in cfg["budgets"]:
            here = [c for c in cells if (c["task"], c["budget"]) == (task, budget)]
            if not here:
                continue
            first = here[0]
            tokens = max(len(c["value_token_held"]) for c in here)
            lines += [f"## {task}, {budget}: K = {first['k']:,} of |C| = {first['candidates']:,.0f} "
                      f"(chance {first['k'] / first['candidates']:.2f}); C holds "
                      f"{first['candidate_mass']['mean']:.2f} of Full-KV's attention mass (n = {first['n']})", "",
                      "| selection | mass coverage [95% CI] | fast-step recall [95% CI] | value token j = 1.." + str(tokens)
                      + " held |", "|---|---|---|---|"]
            for c in here:
                mc, fr = c["mass_coverage"], c["fast_step_recall"]
                lines.append(f"| {c['row']} | {mc['mean']:.3f} [{mc['low']:.3f}, {mc['high']:.3f}] | "
                             f"{fr['mean']:.3f} [{fr['low']:.3f}, {fr['high']:.3f}] | "
                             + ", ".join(f"{v:.2f}" for v in c["value_token_held"]) + " |")
            lines.append("")
    answers = sorted({(r["task"], r["index"], r["expected"], r["answer"]) for r in document["records"]})
    lines += ["## Full-KV's answers (the attention measured is the one that wrote these)", "",
              "| task | sample | needle value | Full-KV's answer |", "|---|---|---|---|"]
    lines += [f"| {t} | {i} | {e} | {a.strip()!r} |" for t, i, e, a in answers]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/selection_coverage.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tasks", default="niah_single,niah_single_word")
    parser.add_argument("--ctx", default="2k")
    parser.add_argument("--retention", default=None, help="fractions of the context (default 0.15)")
    parser.add_argument("--sfi-preset", default=None, help="instead of --retention: paper-2k, paper-4k or both")
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--no-chat", dest="chat", action="store_false")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="directory for results.json and report.md (new)")
    args = parser.parse_args(argv)
    if args.out.exists():
        parser.error(f"--out {args.out} exists; choose a new directory")
    context = parse_context(args.ctx)
    if args.sfi_preset and args.retention:
        parser.error("give --retention or --sfi-preset, not both")
    if args.sfi_preset:
        names = args.sfi_preset.split(",")
        retentions = [preset_retention(name, context) for name in names]
    else:
        retentions = [float(r) for r in (args.retention or "0.15").split(",")]
        names = [f"retention {r:g}" for r in retentions]
    tasks = args.tasks.split(",")
    started = time.time()
    results = run(args.model, tasks, context, retentions, names, args.samples, args.chat, args.seed,
                  lambda line: print(line, flush=True))
    records = results.pop("records")
    document = {"command": "selection_coverage",
                "config": {"model": args.model, "tasks": tasks, "context": context, "retentions": retentions,
                           "budgets": names, "samples": args.samples, "chat": args.chat, "seed": args.seed,
                           "threads": torch.get_num_threads()},
                "results": {**results, "cells": summarise(records), "wall_s": time.time() - started},
                "records": records, "provenance": provenance()}
    args.out.mkdir(parents=True)
    (args.out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
    given = argv if argv is not None else sys.argv[1:]
    command = "python benchmarks/selection_coverage.py " + " ".join(given)
    (args.out / "report.md").write_text(markdown(document, command))
    print(f"report: {args.out / 'report.md'}")


if __name__ == "__main__":
    main()
