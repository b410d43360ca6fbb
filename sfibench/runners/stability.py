"""`sfibench stability` run: dense attention over real text and reduce it to support stability (SPEC 8).

Each segment (runners/stability_prompts.py) prefills its prompt and decodes `steps` tokens after it,
teacher-forced on natural text (so sentence boundaries are the text's own) or the model's own sampled
continuation. Attention is exactly Full-KV's; a probe method additionally hands every layer's query
logits over the whole cache to the on-the-fly reducer (metrics/stability_reducer.py), which reads the
global layers. The run writes results.json, plots and report.md into one run directory.
"""

from __future__ import annotations

import importlib.resources
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from sfibench import registry
from sfibench.core.budget import budget_record
from sfibench.core.device import torch_threads
from sfibench.core.errors import RunInterrupted
from sfibench.core.progress import starting
from sfibench.engine.cache import KVCache
from sfibench.engine.context import StepContext
from sfibench.engine.driver import StepDriver
from sfibench.engine.method import AttentionMethod, StepPlan
from sfibench.engine.prefill import Prefilled
from sfibench.engine.sampling import Sampler, SamplingConfig
from sfibench.engine.session import Session
from sfibench.metrics.stability import (
    StabilityConfig,
    StabilityInputError,
    analysed_layers,
    check_config,
    check_context,
)
from sfibench.metrics.stability_reducer import StabilityReducer
from sfibench.metrics.stability_where import NeedleWatch
from sfibench.models.presets import PRESETS
from sfibench.reference.attention import dense_attention
from sfibench.reporting.report_run import render
from sfibench.reporting.results import write_results
from sfibench.reporting.run_dir import claimed_run_dir
from sfibench.runners.stability_prompts import Segment, build_segments, check_prompt_sources, matched_interval
from sfibench.sfi.config import TriggerConfig
from sfibench.sfi.triggers import SlowStepScheduler, token_classes
from sfibench.workloads.text_file import read_text_file

SHIPPED_TEXT = "essays_en.txt"


@dataclass(frozen=True)
class ProbePlan(StepPlan):
    capacity: int = 0  # the sequence's length: the probe runs eagerly, so every step reads exactly it


@dataclass(frozen=True)
class StabilityRun:
    """Everything `sfibench stability` runs with: the analysis (recorded in results.json) and where it goes."""

    analysis: StabilityConfig
    out: Path | None = None
    overwrite: bool = False
    threads: int | None = None  # torch's CPU threads; None: torch's own count


class DenseProbe(AttentionMethod):
    """Full-KV attention that also keeps this step's query logits `[layers, H_kv, G, L]` and its post-RoPE
    queries `[layers, H_q, D]` for the analysis (the keys are the cache's own).

    Not registered as a method: it measures, it is not something to benchmark. Batch size 1.
    """

    name = "dense_probe"
    step_kind = "dense"

    def start(self, cache: KVCache, prefilled: Prefilled) -> None:
        mc = self.model_config
        self.logits = torch.zeros(mc.num_layers, mc.num_kv_heads, mc.group_size, cache.max_seq,
                                  device=cache.k.device, dtype=torch.float32)
        self.queries = torch.zeros(mc.num_layers, mc.num_heads, mc.head_dim, device=cache.k.device,
                                   dtype=torch.float32)

    def plan(self, ctx: StepContext) -> ProbePlan:
        return ProbePlan(capacity=int(ctx.kv_lengths_host[0]), graphable=False)

    def attend(self, q: torch.Tensor, cache: KVCache, ctx: StepContext, plan: ProbePlan) -> torch.Tensor:
        layer, length = ctx.layer, plan.capacity
        ctx.tokens_read[layer] = ctx.kv_lengths[:, None]
        keys = cache.k[layer, 0, :, :length].float()  # [H_kv, L, D]
        self.queries[layer] = q[0, :, 0]
        grouped = self.queries[layer].view(keys.shape[0], -1, keys.shape[-1])  # [H_kv, G, D]
        # q.k / sqrt(d), as SFI's slow step computes its evidence (a batched matmul: einsum is slower here)
        self.logits[layer, :, :, :length] = torch.matmul(grouped, keys.transpose(1, 2)) * keys.shape[-1] ** -0.5
        return dense_attention(q, cache.k[layer], cache.v[layer], ctx.kv_lengths, capacity=length, masked=False)


def load_text(text_file: str | None) -> tuple[str, str]:
    """(text, where it came from); the shipped English essays when no file is given."""
    if text_file is None:
        resource = importlib.resources.files("sfibench.workloads") / "data" / SHIPPED_TEXT
        return resource.read_text(encoding="utf-8"), f"sfibench/workloads/data/{SHIPPED_TEXT}"
    return read_text_file(text_file, "--text-file"), str(text_file)


def check_text_length(cfg: StabilityConfig, tokens: int, exact: bool = True) -> None:
    """Without contexts the text must cover the prefix (and, teacher-forced, every step)."""
    needed = cfg.prefix + (0 if cfg.generate else cfg.steps)
    if not cfg.contexts and tokens < needed:
        what = f"a {cfg.prefix}-token prefix" + ("" if cfg.generate else f" + {cfg.steps} teacher-forced steps")
        has = f"{tokens}" if exact else f"at most {tokens}"
        raise StabilityInputError(f"the text has {has} tokens but {what} need {needed}; give a longer "
                                  "--text-file, fewer --steps or a shorter --prefix")


def run_stability(run: StabilityRun, show_progress: bool = True) -> Path:
    """Run the analysis and return the run directory (results.json, plots, report.md).

    Every setting, the text and the run directory are checked before the model loads (a checkpoint's
    context and layers once its config is read). The analysis is one pass saved at its end, so Ctrl-C
    keeps nothing and says so (RunInterrupted).
    """
    cfg = run.analysis
    check_config(cfg)
    check_prompt_sources(cfg)
    registry.check_method(registry.dense().name, cfg.path)
    text, source = load_text(cfg.text_file)
    # No tokenizer spends fewer than one byte per token (beyond a start token), so a text this short
    # is refused before the model loads; the exact count is checked once the tokenizer is there.
    check_text_length(cfg, len(text.encode("utf-8")) + 1, exact=False)
    if cfg.model in PRESETS:
        check_context(cfg, PRESETS[cfg.model].max_context, cfg.model)
        analysed_layers(PRESETS[cfg.model])
    with claimed_run_dir(run.out, "stability", overwrite=run.overwrite) as run_dir:
        try:
            with torch_threads(run.threads):
                document = _analyse(cfg, text, source, show_progress)
        except KeyboardInterrupt:
            raise RunInterrupted("a stability run is reduced in one pass and saved at its end, so nothing was "
                                 "kept; a smaller --steps finishes sooner") from None
        # a stop from here on finds results.json whole, and the command says so
        write_results(run_dir, "stability", {**asdict(cfg), "k_head": budget_record(cfg.k_head)}, document)
        render(run_dir)  # plots and report come from the saved file, as `sfibench report` draws them
    return run_dir


def _analyse(cfg: StabilityConfig, text: str, source: str, show_progress: bool) -> dict:
    began = time.perf_counter()
    session = Session.open(cfg.model, cfg.device, cfg.dtype, cfg.seed)
    loaded, mc = session.loaded, session.loaded.config
    check_context(cfg, mc.max_context, mc.name)
    layers = analysed_layers(mc)
    ids = loaded.tokenizer.encode(text)
    check_text_length(cfg, len(ids))
    segments = build_segments(cfg, loaded.tokenizer, ids)
    load_s = time.perf_counter() - began
    classes = token_classes(loaded.tokenizer.backend, mc.vocab_size)
    results = [_segment(session, cfg, segment, layers, classes, show_progress) for segment in segments]
    document = {
        "model": mc.name, "text": source, "layers": layers, "num_layers": mc.num_layers,
        "sfi_geometry": {"n_sink": cfg.sfi.n_sink, "n_recent": cfg.sfi.n_recent, "page": cfg.sfi.page,
                         "k_head": budget_record(cfg.k_head)},
        "timing": {"load_s": load_s, "device": str(session.device), "dtype": str(session.dtype),
                   "threads": torch.get_num_threads()},
        "segments": results,
    }
    return document


def _segment(session: Session, cfg: StabilityConfig, segment: Segment, layers: list[int], classes,
             show_progress: bool) -> dict:
    """Prefill one segment's prompt, decode its steps through the probe and reduce them."""
    loaded, mc = session.loaded, session.loaded.config
    if show_progress:
        starting(f"stability {segment.label}: prefill of {len(segment.prompt):,} tokens")
    began = time.perf_counter()
    prefilled = session.prefill([segment.prompt], cfg.steps)
    prefill_s = time.perf_counter() - began
    rows = torch.tensor(layers, device=session.device)
    count = int(prefilled.query_counts[0])
    prompt = (prefilled.queries[rows, 0, :, :count].float(), len(segment.prompt))
    needle = segment.needle
    watch = NeedleWatch(needle["positions"], needle["answer_steps"], {"value": needle["value"], "depth": needle["depth"]}
                        ) if needle else None
    interval = (cfg.interval or matched_interval(segment, *classes)) if cfg.trigger == "fixed" else None
    reducer = StabilityReducer(cfg, layers, mc.num_kv_heads, mc, prompt=prompt, fixed_interval=interval, needle=watch)
    probe = DenseProbe(None, mc, loaded.tokenizer)
    stream, nll, decode_s = _decode(session, probe, reducer, cfg, segment, prefilled, rows, classes, show_progress)
    emitted = stream[len(segment.prompt):]
    summary = reducer.summary()
    if watch is not None:
        answer = loaded.tokenizer.decode(emitted[:needle["answer_steps"]])
        summary["needle"] = watch.summary(answer, all(value in answer for value in needle["answers"]))
    return {
        "label": segment.label, "prompt_source": segment.prompt_source, "sample": segment.sample,
        "context_asked": segment.context, "mode": segment.mode, "prefix_tokens": len(segment.prompt),
        "context": {"first": len(segment.prompt) + 1, "last": len(segment.prompt) + reducer.step},
        "perplexity": float(torch.tensor(nll).mean().exp()) if nll else None,
        "timing": {"prefill_s": prefill_s, "decode_s": decode_s,
                   "steps_per_s": reducer.step / decode_s if decode_s > 0 else None},
        "decoded_text_head": loaded.tokenizer.decode(emitted[:200]),
        **summary,
    }


def _decode(session: Session, probe: DenseProbe, reducer: StabilityReducer, cfg: StabilityConfig, segment: Segment,
            prefilled: Prefilled, rows: torch.Tensor, classes, show_progress: bool) -> tuple[list[int], list[float], float]:
    """Decode and feed the reducer; returns the token stream, per-step NLL (teacher-forced) and seconds."""
    loaded, cache = session.loaded, session.cache
    boundaries = SlowStepScheduler(TriggerConfig(), *classes, 1)  # only its sentence rule is used
    stream = list(segment.prompt)
    for token in stream:  # so a prompt that ends a sentence makes the first step a sentence start
        boundaries.observe(torch.tensor([token]))
    sampler = Sampler(SamplingConfig(temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed), session.device)
    greedy = Sampler(SamplingConfig(), session.device)
    stop = loaded.tokenizer.stop_ids()
    logits, nll = prefilled.last_logits, []
    driver = StepDriver(loaded.model, cache, probe)
    driver.start(prefilled)
    columns = (TextColumn(f"stability {segment.label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    began = time.perf_counter()
    with Progress(*columns, disable=not show_progress) as progress:
        task = progress.add_task("decode", total=cfg.steps)
        for index in range(cfg.steps):
            if segment.forced is not None:
                token = segment.forced[index]
            else:
                token = int((greedy if index < segment.greedy_steps else sampler)(logits)[0])
            if segment.forced is None and token in stop:
                break  # the model ended its text: what follows would not be natural text
            if segment.forced is not None:
                nll.append(float(-logits[0].float().log_softmax(-1)[token]))
            stream.append(token)
            boundaries.observe(torch.tensor([token]))  # this step's input token
            logits = driver.step(torch.tensor([token], device=session.device)).logits
            length = len(stream)
            reducer.update(probe.logits[rows, ..., :length], cache.key_norms[rows, 0, :, :length],
                           bool(boundaries.sentence_start[0]), probe.queries[rows], cache.k[rows, 0, :, :length])
            progress.advance(task)
    return stream, nll, time.perf_counter() - began
