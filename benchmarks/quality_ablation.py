"""SFI ablation runs of `sfibench quality` against one baseline run on the same prompts: a markdown table.

    python benchmarks/quality_ablation.py BASE_RUN RUN [RUN ...] [--out FILE]

prints the table, or writes it to FILE (then each run is linked relative to FILE's folder).

Every run must be a quality run of the same model, tasks, contexts, seed and prompt format, so sample i of a
task is the same prompt in every run and each ablation can be compared with the baseline prompt by prompt.
Per task, one row per run and one column per budget: SFI's accuracy with its 95% interval (Wilson), and the
paired difference from the baseline (mean over prompts of the per-prompt difference, with a 95% interval:
Newcombe's for paired 0/1 scores, t for the rest; metrics.paired.paired_difference_ci). A second table
gives the KL to Full-KV the same way, and the tokens read.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sfibench.core.errors import UsageError
from sfibench.metrics.paired import paired_difference_ci
from sfibench.metrics.quality import mean_ci
from sfibench.reporting.run_files import load_run

SAME = ("model", "contexts", "seed", "chat", "samples", "retentions")  # and tasks: a subset of the baseline's


def paired_difference(base: list[float], other: list[float],
                      binary: bool | None = None) -> tuple[float, float, float]:
    ci = paired_difference_ci(base, other, binary)
    return ci["mean"], ci["low"], ci["high"]


def variant_name(config: dict) -> str:
    variant = config.get("sfi_variant")
    return "SPEC" if not variant else ", ".join(f"{k}={v}" for k, v in variant.items())


def _sfi(document: dict) -> dict:
    return {(r["task"], r["context"], r["retention"], r["index"]): r for r in document["samples"] if r["method"] == "sfi"}


def ablation_markdown(base_dir: Path, run_dirs: list[Path], link_from: Path = Path(".")) -> str:
    """The tables; each run links to its report.md relative to the folder `link_from`."""
    base = load_run(base_dir, f"run {base_dir}")
    others = [(d, load_run(d, f"run {d}")) for d in run_dirs]
    for directory, document in others:
        differ = [key for key in SAME if document["config"].get(key) != base["config"].get(key)]
        differ += ["tasks"] if set(document["config"]["tasks"]) - set(base["config"]["tasks"]) else []
        if differ:
            raise UsageError(f"{directory} differs from {base_dir} in {', '.join(differ)}: its prompts or budgets are "
                             "not the baseline's, so they cannot be paired")
    cfg = base["config"]
    presets = dict(zip(cfg["retentions"], cfg["sfi_preset"].split(","))) if cfg.get("sfi_preset") else {}
    budgets = [presets.get(r, f"{r:g}") for r in cfg["retentions"]]
    base_records = _sfi(base)
    lines = [f"{cfg['model']}; baseline run {base_dir.name} (SFI as {variant_name(cfg)}); samples per cell "
             f"{'/'.join(map(str, cfg['samples']))}; paired differences against the baseline on the same prompts.", ""]
    for task in [t for t in cfg["tasks"] if all(t in d["config"]["tasks"] for _, d in others)]:
        for context in cfg["contexts"]:
            full = next((c for c in base["results"]["cells"] if (c["task"], c["context"], c["method"]) ==
                         (task, context, "full_kv")), None)
            if full is None:
                continue
            lines += [f"**{task} @ {context} tokens** (Full-KV {full['accuracy']:.2f} [{full['ci_low']:.2f}, "
                      f"{full['ci_high']:.2f}]): SFI accuracy [95% CI] (paired difference from the baseline [95% CI])", "",
                      "| SFI | " + " | ".join(budgets) + " |", "|---|" + "---|" * len(budgets)]
            kl_lines = ["", f"KL to Full-KV per answer step (nats; paired difference) and tokens read / KV length "
                        f"({task} @ {context}):", "", "| SFI | " + " | ".join(budgets) + " |", "|---|" + "---|" * len(budgets)]
            for directory, document in [(base_dir, base), *others]:
                records = _sfi(document)
                accuracy, fidelity = [], []
                for retention in cfg["retentions"]:
                    keys = sorted(k for k in records if k[:3] == (task, context, retention))
                    if not keys or any(k not in base_records for k in keys):
                        accuracy.append("–")
                        fidelity.append("–")
                        continue
                    mine = [records[k] for k in keys]
                    theirs = [base_records[k] for k in keys]
                    ci = mean_ci([r["score"] for r in mine])
                    cell = f"{ci['mean']:.2f} [{ci['low']:.2f}, {ci['high']:.2f}]"
                    kl = sum(r["kl"] for r in mine) / len(mine)
                    read = sum(r.get("measured_retention_global", r["measured_retention"]) for r in mine) / len(mine)
                    kl_cell = f"{kl:.3f}"
                    if document is not base:
                        d, low, high = paired_difference([r["score"] for r in theirs], [r["score"] for r in mine])
                        cell += f" ({d:+.2f} [{low:+.2f}, {high:+.2f}])"
                        d, low, high = paired_difference([r["kl"] for r in theirs], [r["kl"] for r in mine],
                                                         binary=False)  # KL is continuous even when all 0
                        kl_cell += f" ({d:+.3f} [{low:+.3f}, {high:+.3f}])"
                    accuracy.append(cell)
                    fidelity.append(f"{kl_cell}; read {read:.3f}")
                link = Path(os.path.relpath(directory / "report.md", link_from)).as_posix()
                name = f"[{variant_name(document['config'])}]({link})"
                lines.append(f"| {name} | " + " | ".join(accuracy) + " |")
                kl_lines.append(f"| {name} | " + " | ".join(fidelity) + " |")
            lines += kl_lines + [""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    out = None
    if "--out" in args:
        at = args.index("--out")
        if at + 1 == len(args):
            print("error: --out needs a file name", file=sys.stderr)
            return 2
        out = Path(args.pop(at + 1))
        args.pop(at)
    if len(args) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        text = ablation_markdown(Path(args[0]), [Path(a) for a in args[1:]], out.parent if out else Path("."))
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if out:
        out.write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
