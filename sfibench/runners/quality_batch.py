"""One batch of quality samples through every method: prefill once, decode each method from the snapshot.

Per batch: Full-KV decodes freely and its logits at answer positions are kept. Every other
(method, retention) condition is first teacher-forced on Full-KV's stream (KL, top-1 agreement,
perplexity on identical inputs), then decodes freely for its own answers, unless its argmax already
matched Full-KV at every answer position, in which case its free run is Full-KV's (see engine/turns).

Budget rule (one rule for every method and context): budget = round(retention x context target)
tokens read per (layer, KV head). SFI's recent window is a quarter of the budget rounded down to
whole pages, between one page and the default 256 (`recent_for_budget`); its k_head is the rest
after the sinks. StreamingLLM reads sinks + a window of the whole budget; SnapKV keeps the budget
(its 64-token observation window included). SFI reads more than the budget on slow steps (dense)
and while its recent window grows between refreshes, so every result also reports the retention
actually measured (tokens read / KV length per step), which is what plots put on the x axis.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from sfibench.config import BudgetError, MethodSpec, SFIConfig, apply_budget
from sfibench.core.errors import UsageError
from sfibench.engine.session import Session
from sfibench.engine.turns import Script, Stream, run_scripts
from sfibench.methods import create_method
from sfibench.metrics import quality
from sfibench.workloads.base import Sample

DEFAULT_N_RECENT = 256


@dataclass
class Condition:
    method: str
    retention: float | None  # None: Full-KV, dense at every step
    spec: MethodSpec

    @property
    def label(self) -> str:
        return condition_label(self.method, self.retention)


def condition_label(method: str, retention: float | None) -> str:
    """'full_kv', 'sfi@0.15': how reports, progress lines and a resumed run's records name a condition."""
    return method if retention is None else f"{method}@{retention:g}"


def recent_for_budget(budget: int, page: int = 16) -> int:
    """SFI's recent window at a given budget: a quarter of it in whole pages, within [page, 256]."""
    return max(page, min(DEFAULT_N_RECENT, (budget // 4) // page * page))


# The authors' operating point (SPEC 4): a fixed k_head beside a 256-token recent window, with SPEC's
# triggers (sentence ends, t_max 96, min_gap 16: TriggerConfig's defaults). Every method then reads
# n_sink + k_head + n_recent tokens per (layer, KV head); at a given context that is one retention, at
# which the budget rule above gives SFI exactly this k_head and window (preset_retention).
SFI_PRESETS = {"paper-2k": 2048, "paper-4k": 4096}  # name -> k_head; 2K for throughput, 4K for quality


def preset_budget(preset: str) -> int:
    """Tokens read per (layer, KV head) at a preset's operating point: sinks + k_head + recent window."""
    if preset not in SFI_PRESETS:
        raise UsageError(f"unknown --sfi-preset {preset!r}; valid: {', '.join(SFI_PRESETS)}")
    return SFIConfig.n_sink + SFI_PRESETS[preset] + DEFAULT_N_RECENT


def preset_retention(preset: str, context: int) -> float:
    """The retention that gives every method the preset's budget at `context` tokens."""
    budget = preset_budget(preset)
    if budget >= context:
        raise BudgetError(f"--sfi-preset {preset} reads {budget:,} tokens per layer and KV head, all of a "
                          f"{context:,}-token context: SFI would run fully dense (SPEC 4); give a --ctx above "
                          f"{budget:,}")
    return budget / context


SFI_VARIANT_FIELDS = {"use_prior": "selector", "use_nms": "selector", "use_cross_head": "selector",
                      "nms_radius": "selector", "nms_alpha": "selector", "w_prefill": "sfi", "bridge_steps": "sfi",
                      "publish": "sfi",
                      # ablations beyond the paper (SPEC 5): never on unless asked for
                      "evidence_norm": "selector", "keep_neighbours": "selector"}


def apply_sfi_variant(spec: MethodSpec, variant: dict | None) -> None:
    """Change SFI settings for an ablation run, e.g. {"use_nms": False} (SPEC 5: every stage switchable).

    The run's config records the variant as given, so a report says which settings differed from SPEC."""
    for name, value in (variant or {}).items():
        if name not in SFI_VARIANT_FIELDS:
            raise ValueError(f"unknown SFI setting {name!r}; valid: {', '.join(SFI_VARIANT_FIELDS)}")
        setattr(spec.sfi.selector if SFI_VARIANT_FIELDS[name] == "selector" else spec.sfi, name, value)


def make_condition(method: str, retention: float | None, context: int, path: str = "reference",
                   sfi_variant: dict | None = None) -> Condition:
    spec = MethodSpec(name=method, path=path)
    apply_sfi_variant(spec, sfi_variant)
    if retention is None:
        return Condition(method, None, spec)
    budget = round(retention * context)
    spec.sfi.n_recent = recent_for_budget(budget, spec.sfi.page)
    if method == "snapkv" and budget <= spec.snapkv.window:
        raise BudgetError(f"retention {retention:g} of a {context}-token context is {budget} tokens, not more "
                          f"than SnapKV's {spec.snapkv.window}-token window; use a larger --retention or --ctx")
    if budget <= spec.sfi.n_sink + spec.sfi.n_recent:
        raise BudgetError(f"retention {retention:g} of a {context}-token context is {budget} tokens, too few "
                          f"for {spec.sfi.n_sink} sinks and a recent window; use a larger --retention or --ctx")
    apply_budget(spec, budget)
    return Condition(method, retention, spec)


def conditions(methods: list[str], retentions: list[float], context: int,
               sfi_variant: dict | None = None, path: str = "reference") -> list[Condition]:
    """Full-KV first (every other method is compared with it), then each sparse method x retention,
    every one on `path`."""
    out = [make_condition("full_kv", None, context, path)]
    out += [make_condition(m, r, context, path, sfi_variant) for m in methods if m != "full_kv"
            for r in retentions]
    return out


def _teacher_streams(samples: list[Sample]) -> list[Stream] | None:
    if samples[0].teacher is None:
        return None
    return [Stream(tokens=list(s.teacher), is_answer=[True] * len(s.teacher)) for s in samples]


def sfi_settings(spec: MethodSpec) -> dict:
    """What SFI ran with in one condition: its memory geometry, triggers and bridge steps (for the report)."""
    sfi = spec.sfi
    return {"n_sink": sfi.n_sink, "k_head": sfi.k_head, "n_recent": sfi.n_recent,
            "budget": sfi.n_sink + sfi.k_head + sfi.n_recent, "trigger": sfi.trigger.policy,
            "t_max": sfi.trigger.t_max, "min_gap": sfi.trigger.min_gap, "bridge_steps": sfi.bridge_steps}


def _decode(session: Session, condition: Condition, prefilled, scripts, teacher, keep_logits, on_step):
    method = create_method(copy.deepcopy(condition.spec), session.loaded.config, session.loaded.tokenizer)
    return run_scripts(session.loaded.model, session.cache, method, prefilled, scripts, teacher=teacher,
                       keep_logits=keep_logits, pad_id=session.loaded.tokenizer.eos_token_id or 0, on_step=on_step)


def evaluate_batch(session: Session, samples: list[Sample], conds: list[Condition], on_decode=None,
                   on_step=None, on_records=None, done: frozenset[str] = frozenset()) -> list[dict]:
    """One record per (sample, condition) not in `done` (labels of conditions a resumed run already has).

    `on_decode(label)` is called before each decode pass, `on_records(records)` with each condition's
    records as soon as they exist (so they can be saved). Full-KV is decoded even when done: every
    other condition is compared with its logits.
    """
    tokenizer = session.loaded.tokenizer
    stop = frozenset({tokenizer.eos_token_id} - {None})
    scripts = [Script(s.max_answer_tokens, s.follow_ups, stop) for s in samples]
    prefilled = session.prefill([s.prompt for s in samples], max(s.decode_budget for s in samples))
    forced = _teacher_streams(samples)
    records = []
    full = None
    for condition in conds:
        if full is not None and condition.label in done:
            continue
        if on_decode:
            on_decode(condition.label)
        if full is None:  # Full-KV: free run (or the given continuation), logits kept as the reference
            full = _decode(session, condition, prefilled, scripts, forced, True, on_step)
            runs = (full, full)
        else:
            taught = _decode(session, condition, prefilled, scripts, full, True, on_step)
            free = taught
            if forced is None and any(_diverges(t, f) for t, f in zip(taught, full)):
                if on_decode:
                    on_decode(condition.label + " (free)")
                free = _decode(session, condition, prefilled, scripts, None, False, on_step)
            runs = (taught, free)
        if condition.label in done:
            continue
        new = [_record(tokenizer, sample, condition, full[row], runs[0][row], runs[1][row], stop)
               for row, sample in enumerate(samples)]
        if on_records:
            on_records(new)
        records += new
    return records


def _diverges(taught: Stream, full: Stream) -> bool:
    return any(int(logits.argmax()) != token for logits, token in zip(taught.answer_logits, full.answer_tokens))


def _record(tokenizer, sample: Sample, condition: Condition, full: Stream, taught: Stream, free: Stream,
            stop: frozenset) -> dict:
    # Fidelity over decode-step positions only: the first answer token comes from the shared prefill.
    full_logits = torch.stack(full.answer_logits[1:]) if len(full.answer_logits) > 1 else torch.zeros(0, 1)
    method_logits = torch.stack(taught.answer_logits[1:]) if len(taught.answer_logits) > 1 else full_logits
    kl = quality.kl_per_step(full_logits, method_logits) if len(full_logits) else torch.zeros(0)
    record = {
        "task": sample.task, "index": sample.index, "prompt_tokens": len(sample.prompt),
        "method": condition.method, "retention": condition.retention, "depth": sample.meta.get("depth"),
        "kl": float(kl.mean()) if len(kl) else 0.0,
        "top1_agreement": quality.top1_agreement(full_logits, method_logits),
        # tokens read / KV length per decode step, averaged: over all layers, and over the global layers only
        "measured_retention": sum(free.retention) / max(len(free.retention), 1) if free.retention else 1.0,
        "measured_retention_global": (sum(free.retention_global) / len(free.retention_global)
                                      if free.retention_global else 1.0),
        "steps_by_kind": free.kinds,
    }
    if sample.teacher is not None:
        targets = torch.tensor(sample.teacher[1:])
        nll = quality.negative_log_likelihood(method_logits, targets) if len(targets) else torch.zeros(0)
        record["nll"] = float(nll.mean()) if len(nll) else 0.0
        return record
    matches = sum(a == b for f, m in zip(full.answers, free.answers) for a, b in zip(f, m))
    total = sum(len(f) for f in full.answers)
    texts = [tokenizer.decode([t for t in ids if t not in stop]) for ids in free.answers]
    turn_scores = [quality.score_answer(sample.scorer, text, refs, sample.meta)
                   for text, refs in zip(texts, sample.answers)]
    record.update({
        "prediction": texts, "answers": sample.answers, "turn_scores": turn_scores,
        "score": sum(turn_scores) / len(turn_scores), "token_agreement": matches / total if total else 1.0,
    })
    return record
