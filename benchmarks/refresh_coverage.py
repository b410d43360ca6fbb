"""Refresh coverage: does the selection an SFI slow step makes hold what the sentence after it attends to?

    python benchmarks/refresh_coverage.py --out DIR [--model smollm2-135m] [--tasks niah_list] [--ctx 2k]
        [--retention 0.15] [--samples 4] [--no-chat] [--max-answer-tokens N]
    python benchmarks/refresh_coverage.py --rerender --out DIR    # tables and plot again from results.json

SFI's premise is that the dense attention of a sentence's first token (the slow step) predicts what the rest
of the sentence attends to. Per prompt, on the reference path in float32:

1. The prompt is prefilled; the answer is written greedily with dense attention at every step (Full-KV's
   answer, capped by the task's own cap): SFI runs with bridge steps over the whole answer, so its output is
   the dense one while its own trigger scheduler fires the slow steps of SPEC section 3 (sentence starts,
   t_max, min_gap) on that answer, and each slow step runs SFI's own refresh (query row of that step over C,
   W = 1, the Selector) on Full-KV's state. A second SFI with `--no-nms --keep-neighbours 7` refreshes at
   the same steps from the same query rows (SFIMethod.refresh with the first one's evidence). At each step
   and global layer, the attention weights over the whole history are kept, averaged over each KV head's G
   query heads.
2. Segments: segment 0 = decode steps 1 .. s1 - 1 (served by the bootstrap), segment j = the fast steps s_j
   + 1 .. s_(j+1) - 1 after slow step s_j (served by its refresh; slow steps themselves read densely).
3. Per segment, each selection's attention-mass coverage = mass on its picks / mass on all of the refresh's
   candidates C_j = [n_sink, recent_start at s_j), summed over the segment's steps, global layers and KV
   heads. Selections: the refreshed one (per Selector variant), the prompt's bootstrap one (per variant,
   from the last w_prefill prompt queries; its picks lie in the prompt's C, a subset of C_j), SnapKV's fixed
   one (its score of the last 64 prompt queries max-pooled over 7, top K of the prompt's C) and K random
   positions of C_j (chance, expected K / |C_j|), K = min(k_head, |C_j|) for each. Fast-step recall (SFI
   rows) = the share of all attention mass a fast step would read: sinks + picks + its recent window (for
   the bootstrap the window anchored at the prompt's recent_start keeps growing, so it reads more tokens
   than a refreshed step).
4. List tasks: the i-th requested value's answer tokens are found by token matching in the answer (" value",
   a leading blank token dropped), and its sentence is the segment holding its first token. Its needle
   tokens are found the same way in the prompt (first occurrence: the needle sentence; the question names
   keys only). Value held = the share of (global layer, KV head, value token) triples whose selection holds
   the token (the mean over the value's tokens of the share of layer-head selections holding it); "all held"
   = the share of (global layer, KV head) selections holding every token of the value. Value-step coverage =
   the mass coverage over only the fast steps of the segment whose output is one of the value's tokens (the
   steps that copy the needle).

Per sentence index i (the segment writing value i) and averaged over the sentences served by a decode
refresh (i >= 2), means over prompts with 95% bootstrap intervals, and the paired difference refreshed -
bootstrap per Selector variant (per prompt, then over prompts). Writes DIR/results.json (per-prompt
numbers, provenance, command), DIR/report.md and DIR/coverage_by_sentence.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from selection_coverage import (
    answer_attention,
    held_shares,
    masses,
    published_picks,
    random_picks,
    snapkv_picks,
    value_positions,
)

from sfibench.commands.quality_options import parse_context
from sfibench.core.provenance import provenance
from sfibench.engine.session import Session
from sfibench.metrics.quality import mean_ci
from sfibench.registry import create_method
from sfibench.reporting.formatting import commit_label
from sfibench.runners.quality_batch import make_condition
from sfibench.sfi import geometry
from sfibench.workloads.base import PromptFormat
from sfibench.workloads.tasks import get_task, make_samples

# (label, SFI settings changed from SPEC); the first one drives the run, the others refresh beside it
VARIANTS = (("SPEC", {}), ("no-NMS keep7", {"use_nms": False, "keep_neighbours": 7}))
SNAPKV, RANDOM = "SnapKV (fixed)", "random K of C"
METRICS = ("coverage", "value_steps", "held", "all_held", "recall")
ROWS = ([f"refreshed, {name}" for name, _ in VARIANTS] + [f"bootstrap, {name}" for name, _ in VARIANTS]
        + [SNAPKV, RANDOM])
# paired over prompts: what the refresh changes, per Selector variant
DIFFS = [(f"refreshed - bootstrap, {name}", f"refreshed, {name}", f"bootstrap, {name}")
         for name, _ in VARIANTS]


def shadow_run(session: Session, prefilled, sample, stop: frozenset, retention: float, context: int,
               cap: int) -> dict:
    """The dense answer with every variant's SFI refreshing beside it (module docstring, step 1)."""
    cfg, tokenizer = session.loaded.config, session.loaded.tokenizer
    # dense for the whole answer: bridge steps past its cap
    specs = [make_condition("sfi", retention, context, variant={**v, "bridge_steps": cap + 1}).spec
             for _, v in VARIANTS]
    methods = [create_method(spec, cfg, tokenizer) for spec in specs]
    driver, followers = methods[0], methods[1:]
    bootstrap, refreshes = {}, []
    start, after_step = driver.start, driver.after_step

    def start_all(cache, prefilled):
        start(cache, prefilled)
        for method in followers:
            method.start(cache, prefilled)
        bootstrap.update({name: published_picks(m) for (name, _), m in zip(VARIANTS, methods)})

    def refresh_all(ctx, plan):
        after_step(ctx, plan)
        if driver.refresh_host[:, 0].any():
            length = int(ctx.kv_lengths_host[0])
            layers = driver.refresh_host[:, 0].nonzero().flatten().tolist()
            for method in followers:  # SFI's own refresh, fed the driver's query rows of this step
                method.refresh(driver.cache, 0, layers, length,
                               lambda lo, hi, layers: driver.decode_evidence(0, layers, lo, hi))
            refreshes.append({"step": ctx.step, "length": length,
                              "picks": {name: published_picks(m) for (name, _), m in zip(VARIANTS, methods)}})

    driver.start, driver.after_step = start_all, refresh_all
    weights, answer = answer_attention(session, prefilled, sample, stop, method=driver, cap=cap)
    return {"weights": weights, "answer": answer, "bootstrap": bootstrap, "refreshes": refreshes,
            "config": driver.cfg}


def answer_values(tokenizer, answer: list[int], values: list[str]) -> dict[int, list[int]]:
    """{i (1-based place in the asked order): answer token indices of the i-th value}, for those present."""
    found = {}
    for i, value in enumerate(values, 1):
        try:
            found[i] = value_positions(tokenizer, answer, value)
        except ValueError:
            continue
    return found


def measure(shadow: dict, snapkv: dict, prompt_values: dict[int, list[int]], answer_at: dict[int, list[int]],
            length: int, seed: int) -> list[dict]:
    """One record per segment (module docstring, steps 2-4)."""
    cfg, weights, refreshes = shadow["config"], shadow["weights"], shadow["refreshes"]
    steps = min(len(steps) for steps in weights.values())  # entry t - 1 is step t, which writes answer[t]
    layers = list(weights)
    heads = next(iter(weights.values()))[0].shape[0] if steps else 0
    starts = [0] + [r["step"] for r in refreshes]
    ends = [r["step"] for r in refreshes] + [steps + 1]
    lengths = [length] + [r["length"] for r in refreshes]
    _, prompt_hi = geometry.candidate_range(length, cfg)
    records = []
    for j, (first, end, at) in enumerate(zip(starts, ends, lengths)):
        lo, hi = geometry.candidate_range(at, cfg)
        k = min(cfg.k_head, hi - lo)
        served = refreshes[j - 1]["picks"] if j else shadow["bootstrap"]
        picks = {f"refreshed, {n}": served[n] for n, _ in VARIANTS}
        picks |= {f"bootstrap, {n}": shadow["bootstrap"][n] for n, _ in VARIANTS}
        picks |= {SNAPKV: snapkv, RANDOM: random_picks(layers, heads, lo, hi, k, seed + j)}
        window = {layer: steps_[first:end - 1] for layer, steps_ in weights.items()}  # steps first+1 .. end-1
        values = [i for i, where in answer_at.items() if first <= where[0] < end]
        record = {"segment": j, "slow_step": first, "steps": max(0, end - 1 - first), "kv_length": at,
                  "candidates": hi - lo, "k": k, "values": values, "coverage": {}, "fast_step_recall": {},
                  "value_held": {}, "value_all_held": {}, "value_step_coverage": {}}
        for row, chosen in picks.items():
            selected, candidates, total = masses(window, chosen, lo, hi)
            record["coverage"][row] = selected / candidates if candidates else None
            if row.startswith(("refreshed", "bootstrap")):
                # the bootstrap's recent window stays anchored at the prompt's recent_start
                own_hi = hi if row.startswith("refreshed") else prompt_hi
                _, own_candidates, _ = masses(window, chosen, lo, own_hi)
                record["fast_step_recall"][row] = 1 - (own_candidates - selected) / total if total else None
            for i in values:  # the steps that write the value's tokens (the slow step reads densely)
                steps_i = [t for t in answer_at[i] if first < t < end]
                if steps_i:
                    at_value = {layer: [s_[t - 1] for t in steps_i] for layer, s_ in weights.items()}
                    got, of, _ = masses(at_value, chosen, lo, hi)
                    record["value_step_coverage"].setdefault(row, {})[str(i)] = got / of if of else None
                if i in prompt_values:
                    shares = held_shares(chosen, prompt_values[i])
                    all_held = sum(float(torch.stack([(chosen[layer] == p).any(dim=-1)
                                                      for p in prompt_values[i]]).all(dim=0).float().mean())
                                   for layer in chosen) / len(chosen)
                    record["value_held"].setdefault(row, {})[str(i)] = sum(shares) / len(shares)
                    record["value_all_held"].setdefault(row, {})[str(i)] = all_held
        records.append(record)
    return records


def run(args, context: int, log) -> dict:
    session = Session.open(args.model, device="cpu", dtype="float32", seed=args.seed)
    cfg, tokenizer = session.loaded.config, session.loaded.tokenizer
    stop = tokenizer.stop_ids()
    snap_spec = make_condition("snapkv", args.retention, context).spec
    sfi_cfg = make_condition("sfi", args.retention, context).spec.config
    prompts = []
    for task in args.tasks.split(","):
        fmt = PromptFormat(tokenizer, args.chat)
        for sample in make_samples(task, fmt, context, args.samples, args.seed):
            started = time.time()
            cap = min(sample.max_answer_tokens, args.max_answer_tokens or sample.max_answer_tokens)
            list_task = sample.scorer == "ordered_list"
            asked = sample.answers[0] if list_task else [sample.meta["needles"][0]["value"]]
            prompt_values = {i: value_positions(tokenizer, sample.prompt, v) for i, v in enumerate(asked, 1)}
            prefilled = session.prefill([sample.prompt], cap)
            length = int(prefilled.lengths[0])
            lo, hi = geometry.candidate_range(length, sfi_cfg)
            snapkv = snapkv_picks(session, prefilled, snap_spec, lo, hi, min(sfi_cfg.k_head, hi - lo))
            shadow = shadow_run(session, prefilled, sample, stop, args.retention, context, cap)
            answer = shadow["answer"]
            answer_at = answer_values(tokenizer, answer, asked)
            segments = measure(shadow, snapkv, prompt_values, answer_at, length,
                               args.seed + 1000 * sample.index)
            slow = [r["step"] for r in shadow["refreshes"]]
            text = tokenizer.decode([t for t in answer if t not in stop])
            prompts.append({"task": task, "index": sample.index, "prompt_tokens": length, "cap": cap,
                            "answer_tokens": len(answer), "slow_steps": slow,
                            "values_found": sorted(answer_at), "answer": text, "expected": asked,
                            "segments": segments})
            del shadow, prefilled  # the next prefill would otherwise hold two prompts' tensors at once
            log(f"{time.strftime('%H:%M:%S')} {task} #{sample.index}: {length} tokens, {len(answer)} answer "
                f"tokens, {len(slow)} slow steps, {len(answer_at)}/{len(asked)} values found, "
                f"{time.time() - started:.0f} s")
    return {"model": cfg.name, "global_layers": len(cfg.global_layers), "kv_heads": cfg.num_kv_heads,
            "k_head": sfi_cfg.k_head, "n_recent": sfi_cfg.n_recent, "prompts": prompts}


def by_sentence(prompts: list[dict]) -> dict:
    """Per sentence index i and row: the coverage of the segment writing value i and value i held, per
    prompt, then means over prompts; "mean, i >= 2" first averages each prompt's sentences that a decode
    refresh served."""
    out: dict = {}
    for p in prompts:
        per_prompt: dict = {}
        for seg in p["segments"]:
            for i in seg["values"]:
                for row in ROWS:
                    cell = per_prompt.setdefault(i, {}).setdefault(row, {})
                    cell["coverage"] = seg["coverage"][row]
                    cell["held"] = seg["value_held"].get(row, {}).get(str(i))
                    cell["all_held"] = seg["value_all_held"].get(row, {}).get(str(i))
                    cell["value_steps"] = seg["value_step_coverage"].get(row, {}).get(str(i))
                    cell["recall"] = seg["fast_step_recall"].get(row)
                    cell["refreshed"] = seg["segment"] > 0
        later = [c for i, c in per_prompt.items() if i >= 2 and c[ROWS[0]]["refreshed"]]
        if later:
            per_prompt["mean, i >= 2"] = {row: {m: _mean([c[row][m] for c in later]) for m in METRICS}
                                           for row in ROWS}
        for cells in per_prompt.values():
            for name, a, b in DIFFS:
                if not cells[a].get("refreshed", True):  # the bootstrap served the sentence: the two are one
                    cells[name] = dict.fromkeys(METRICS)
                    continue
                cells[name] = {m: None if None in (cells[a][m], cells[b][m]) else cells[a][m] - cells[b][m]
                               for m in METRICS}
        for i, cells in per_prompt.items():
            for row, cell in cells.items():
                for metric in METRICS:
                    if cell[metric] is not None:
                        here = out.setdefault(str(i), {}).setdefault(row, {})
                        here.setdefault(metric, []).append(cell[metric])
    return {i: {row: {m: {**mean_ci(v), "n": len(v)} for m, v in metrics.items()}
                for row, metrics in rows.items()} for i, rows in out.items()}


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def plot(cells: dict, path: Path) -> None:
    """Coverage of the sentence's attention mass (left) and its needle value held (right), by sentence."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    indices = sorted(int(i) for i in cells if i.isdigit())
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharex=True)
    for ax, metric, label in ((axes[0], "coverage", "attention-mass coverage of C (sentence's fast steps)"),
                              (axes[1], "held", "needle value tokens held (share of layer-head selections)")):
        for row in ROWS:
            xs = [i for i in indices if metric in cells[str(i)].get(row, {})]
            ax.plot(xs, [cells[str(i)][row][metric]["mean"] for i in xs], marker="o", ms=3, label=row,
                    ls="--" if row in (SNAPKV, RANDOM) else "-")
        ax.set_xlabel("sentence i (the one writing the i-th requested value)")
        ax.set_ylabel(label)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(document: dict, command: str) -> str:
    cfg, res, prov = document["config"], document["results"], document["provenance"]
    cells, prompts = res["by_sentence"], document["prompts"]
    slow = [len(p["slow_steps"]) for p in prompts]
    lines = [f"# Refresh coverage — {res['model']}", "",
             f"{prov.get('timestamp_utc')}, cpu ({prov.get('cpu')}, torch threads: {cfg['threads']}), "
             "float32, "
             f"reference path, commit {commit_label(prov)}, wall time {res['wall_s'] / 60:.1f} min.", "",
             "    " + command, "",
             f"{cfg['tasks']} at {cfg['context']} prompt tokens, {len(prompts)} prompt(s), retention "
             f"{cfg['retention']:g}: k_head {res['k_head']}, recent window {res['n_recent']}; "
             f"{sum(slow) / max(len(slow), 1):.1f} slow steps per answer (SPEC's triggers on the dense "
             "answer). "
             "Coverage = attention mass on the selection / mass on the refresh's candidates C, over the fast "
             "steps of the sentence; held = share of (layer, KV head, value token) selections holding the "
             "sentence's needle value tokens (see the script's docstring). Means over prompts "
             "[95% bootstrap interval].", "",
             "![coverage by sentence](coverage_by_sentence.png)", ""]
    keys = sorted((i for i in cells if i.isdigit()), key=int) + [i for i in cells if not i.isdigit()]
    # in how many prompts a decode refresh (not the bootstrap) served sentence i
    refreshed = {str(i): sum(1 for p in prompts for seg in p["segments"]
                             if i in seg["values"] and seg["segment"])
                 for i in range(1, 1 + max((len(p["expected"]) for p in prompts), default=0))}
    for metric, title in (("coverage", "Attention-mass coverage over the sentence's fast steps"),
                          ("value_steps", "Attention-mass coverage over the steps writing the value"),
                          ("held", "Needle value held"),
                          ("recall", "Fast-step recall (share of all attention mass a fast step reads)")):
        columns = ROWS + [name for name, _, _ in DIFFS]
        lines += [f"## {title}", "", "| i | n | refreshed in | " + " | ".join(columns) + " |",
                  "|---|---|---|" + "---|" * len(columns)]
        for i in keys:
            row_cells = [cells[i].get(row, {}).get(metric) for row in columns]
            n = max((c["n"] for c in row_cells if c), default=0)
            lines.append(f"| {i} | {n} | {refreshed.get(i, '')} | " + " | ".join(
                f"{c['mean']:.2f} [{c['low']:.2f}, {c['high']:.2f}]" if c else "–" for c in row_cells) + " |")
        lines.append("")
    lines += ["## Full-KV's answers (the attention measured is the one that wrote them)", "",
              "| prompt | slow steps | values found | answer (start) |", "|---|---|---|---|"]
    lines += [f"| {p['task']} #{p['index']} | {p['slow_steps']} | "
              f"{len(p['values_found'])}/{len(p['expected'])} | {p['answer'][:80]!r} |" for p in prompts]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/refresh_coverage.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tasks", default="niah_list")
    parser.add_argument("--ctx", default="2k")
    parser.add_argument("--retention", type=float, default=0.15)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-answer-tokens", type=int, default=None, help="below the task's own cap")
    parser.add_argument("--no-chat", dest="chat", action="store_false")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="new directory for the results")
    parser.add_argument("--rerender", action="store_true",
                        help="rewrite the tables and plot of an existing --out from its results.json")
    args = parser.parse_args(argv)
    if args.rerender:
        if not (args.out / "results.json").is_file():
            parser.error(f"--rerender: {args.out / 'results.json'} does not exist")
        write(json.loads((args.out / "results.json").read_text()), args.out)
        return
    if args.out.exists():
        parser.error(f"--out {args.out} exists; choose a new directory")
    if not 0 < args.retention < 1:
        parser.error(f"--retention must lie in (0, 1), got {args.retention:g}")
    if args.samples < 1 or (args.max_answer_tokens is not None and args.max_answer_tokens < 1):
        parser.error("--samples and --max-answer-tokens must be at least 1")
    try:
        context = parse_context(args.ctx)
        for task in args.tasks.split(","):
            get_task(task)
    except Exception as error:  # the options' own one-line messages (UsageError, UnknownTaskError)
        parser.error(str(error))
    if not isinstance(context, int):
        parser.error(f"--ctx {args.ctx}: give a token count")
    started = time.time()
    results = run(args, context, lambda line: print(line, flush=True))
    prompts = results.pop("prompts")
    given = argv if argv is not None else sys.argv[1:]
    command = "python benchmarks/refresh_coverage.py " + " ".join(given)
    document = {"command": command,
                "config": {"model": args.model, "tasks": args.tasks, "context": context,
                           "retention": args.retention, "samples": args.samples, "chat": args.chat,
                           "seed": args.seed,
                           "max_answer_tokens": args.max_answer_tokens, "threads": torch.get_num_threads()},
                "results": {**results, "wall_s": time.time() - started},
                "prompts": prompts, "provenance": provenance()}
    args.out.mkdir(parents=True)
    write(document, args.out)


def write(document: dict, out: Path) -> None:
    document["results"]["by_sentence"] = by_sentence(document["prompts"])
    (out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
    plot(document["results"]["by_sentence"], out / "coverage_by_sentence.png")
    (out / "report.md").write_text(markdown(document, document["command"]))
    print(f"report: {out / 'report.md'}")


if __name__ == "__main__":
    main()
