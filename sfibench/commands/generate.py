"""`sfibench generate`: text from one method, slow (refresh) steps highlighted, or per-step stats as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sfibench import registry
from sfibench.commands.common import (
    DEVICE_HELP,
    DTYPE_HELP,
    METHOD_NAMES,
    PATH_HELP,
    TIMED_THREADS_HELP,
    console,
    err_console,
    user_errors,
)
from sfibench.commands.ranks import TP_HELP, run_as_ranks
from sfibench.commands.sfi_options import ALL, SFISettings, sfi_options
from sfibench.core.budget import Budget
from sfibench.core.errors import UsageError
from sfibench.workloads.text_file import read_text_file
from sfibench.commands.options import (
    check_device_needs,
    check_memory_before_loading,
    check_path,
    check_session_options,
    check_top_p,
)


@sfi_options(*ALL)
def generate(
    model: str = typer.Option("smollm2-135m", help="preset name, HF checkpoint directory or .gguf file"),
    method: str = typer.Option("sfi", help=METHOD_NAMES),
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
    tp: int = typer.Option(1, min=1, help=TP_HELP),
    threads: int = typer.Option(None, min=1, help=TIMED_THREADS_HELP),
    sfi: SFISettings = SFISettings(),
):
    """Generate text with one method; slow (refresh) steps are highlighted, --json gives per-step stats."""
    with user_errors():
        # the checks that need no model and no torch first, so a bad command fails at once
        registry.check_name(method)
        check_path(path, "--path")
        check_top_p(top_p)
        sfi.check(path if method == registry.BUDGET_REFERENCE else None)
        if prompt is not None and prompt_file is not None:
            raise UsageError("give --prompt TEXT or --prompt-file FILE, not both")
        text = read_text_file(prompt_file, "--prompt-file") if prompt_file is not None else prompt
        if text is not None and not text.strip():
            raise UsageError("--prompt is empty; give some text, or leave it out to continue the shipped essays")
        k_head_budget, budget_tokens = sfi.k_head(), None if budget is None else Budget.parse(budget)
        check_session_options(model, device, dtype)
        check_device_needs(device, "--path", [path])
        # the weights and the decode's cache against the memory (one rank's under --tp), before any weight loads
        check_memory_before_loading(model, [1], [1], max_new_tokens, device, dtype, tp=tp)
        run_as_ranks(tp)
        from sfibench.engine.sampling import SamplingConfig  # loads torch
        from sfibench.runners.generate import GenerateRun, run_generate

        registry.check_method(method, path)
        run = GenerateRun(model=model, method=method, path=path, device=device, dtype=dtype, prompt=text,
                          max_new_tokens=max_new_tokens, chat=chat,
                          sampling=SamplingConfig(temperature=temperature, top_p=top_p, seed=seed),
                          k_head=k_head_budget, budget=budget_tokens, sfi=sfi.config(seed=seed),
                          stream=not json_out, threads=threads)
        result = run_generate(run, console, err_console)
        if json_out:
            print(json.dumps(result))
            return
        from sfibench.reporting.generate_summary import summary_lines

        console.print()
        for line in summary_lines(result):
            console.print(f"[dim]{line}[/]", highlight=False)
        if console.is_terminal and result["summary"]["steps_by_kind"].get("slow"):
            console.print("[dim][black on yellow]highlighted[/] = emitted by a slow step[/]")
