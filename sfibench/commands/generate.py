"""`sfibench generate`: text from one method, slow (refresh) steps highlighted, or per-step stats as JSON."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import typer

from sfibench.commands.common import (
    BRIDGE_STEPS_HELP,
    DEVICE_HELP,
    DTYPE_HELP,
    EVIDENCE_NORM_HELP,
    KEEP_NEIGHBOURS_HELP,
    NMS_ALPHA_HELP,
    NMS_RADIUS_HELP,
    PATH_HELP,
    PUBLISH_HELP,
    console,
    err_console,
    user_errors,
)
from sfibench import registry
from sfibench.core.budget import Budget
from sfibench.engine.method import MethodSpec
from sfibench.engine.sampling import SamplingConfig
from sfibench.sfi.config import SelectorConfig, SFIConfig, TriggerConfig
from sfibench.core.errors import UsageError
from sfibench.options import (
    check_session_options,
    check_sfi_settings,
    check_top_p,
    check_trigger,
    read_text_file,
)


def method_spec(method: str, path: str, n_sink: int, n_recent: int, k_head: int, page: int, w_prefill: int,
                t_max: int, min_gap: int, trigger: str, interval: int, layer_groups: int, bridge_steps: int,
                publish: str, selector: SelectorConfig, seed: int) -> MethodSpec:
    triggers = TriggerConfig(policy=trigger, t_max=t_max, min_gap=min_gap, interval=interval, seed=seed)
    sfi = SFIConfig(n_sink=n_sink, n_recent=n_recent, k_head=k_head, page=page, w_prefill=w_prefill,
                    layer_groups=layer_groups, bridge_steps=bridge_steps, publish=publish, trigger=triggers,
                    selector=selector)
    return MethodSpec(method, path, sfi if method == registry.BUDGET_REFERENCE else registry.default_config(method))



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
    device: str = typer.Option("auto", help=DEVICE_HELP),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
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
    from sfibench.registry import check_method
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
        config = spec.config
        if isinstance(config, SFIConfig):
            config = replace(config, k_head=k_head_budget.resolve(len(ids), "--k-head", at_most_context=False))
        if shared_budget is not None:
            config = config.with_budget(shared_budget.resolve(len(ids)))
        prefilled = session.prefill([ids], max_new_tokens)
        streamer = TextStreamer(tokenizer, enabled=not json_out)
        method_object = registry.create_method(replace(spec, config=config), session.loaded.config, tokenizer)
        trace, summary = session.decode(method_object, prefilled, max_new_tokens,
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
