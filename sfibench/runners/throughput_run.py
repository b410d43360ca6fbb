"""What `sfibench throughput` runs with: one frozen object, built and checked by the command
(commands/throughput.py) and handed to the runner, and what results.json records of it.

No torch here: the command builds the run before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from sfibench import registry
from sfibench.core.budget import Budget, budget_record
from sfibench.core.errors import UsageError
from sfibench.engine.method import MethodConfig
from sfibench.engine.workspace import LENGTH_BUCKET


@dataclass(frozen=True)
class ThroughputRun:
    """Every setting of a throughput run. The measuring functions take it with `sfi` set at one context
    (`at`); the budget reference's settings in `sfi` set every other method's budget (SPEC 6)."""

    model: str
    contexts: tuple[int | str, ...]  # tokens; "max" (the limit minus `steps`) only until the shape is known
    batches: tuple[int | str, ...]  # counts, or "max": the largest batch that fits at the longest context
    methods: tuple[tuple[str, str], ...]  # (method, path)
    steps: int
    repeats: int = 3
    prefill: str = "auto"  # real | synthetic | auto (synthetic from 16K tokens)
    graphs: bool = True
    length_bucket: int = LENGTH_BUCKET
    sfi: MethodConfig = field(default_factory=lambda: registry.default_config(registry.BUDGET_REFERENCE))
    k_head: Budget | None = None  # SFI's k_head, a percentage resolved at each context (None: sfi's as it is)
    budget: Budget | None = None  # every method's tokens read per (layer, KV head), SFI's by its budget rule
    device: str = "auto"
    dtype: str = "auto"
    dense_kernels: bool = False  # time Full-KV's kernel against every SDPA backend (a GPU's run)
    out: Path | None = None
    overwrite: bool = False
    threads: int | None = None  # torch's CPU threads; None: idle_cores_only's choice
    # Request mode (--prompt-len, --gen-len; runners/throughput_requests.py): `contexts` are prompt lengths
    # and `steps` the tokens each request generates, the first from its prefill, so the cache grows to P + G.
    requests: bool = False
    text: str = "auto"  # request mode's inputs: own (greedy), replay (a real-text stream), auto (by weights)

    def sfi_at(self, context: int) -> MethodConfig:
        """The budget reference's settings at `context`: by its budget rule at `budget` where one is given,
        else with its k_head resolved (a percentage gives each context its own)."""
        if self.budget is not None:
            return self.sfi.with_budget(self.budget.resolve(context, "--budget"))
        if self.k_head is None:
            return self.sfi
        return replace(self.sfi, k_head=self.k_head.resolve(context, "--k-head", at_most_context=False))

    def at(self, context: int) -> ThroughputRun:
        return replace(self, sfi=self.sfi_at(context))

    def record(self, model_name: str | None, contexts=None) -> dict:
        """results.json's config: the settings a run's numbers depend on, its budgets as written (a
        percentage as given). With --budget, SFI's k_head and window are the budget rule's: recorded where
        whole tokens fix them, left out (None) where each context has its own."""
        sfi, budget = self.sfi, None
        if self.budget is not None and self.budget.tokens is not None:
            sfi, budget = self.sfi.with_budget(self.budget.tokens), self.budget.tokens
        elif self.budget is not None:
            sfi, budget = replace(self.sfi, k_head=None, n_recent=None), budget_record(self.budget)
        elif self.k_head is not None:
            sfi = replace(self.sfi, k_head=budget_record(self.k_head))
        record = {"model": model_name, "contexts": list(self.contexts if contexts is None else contexts),
                  "batches": list(self.batches), "methods": [list(pair) for pair in self.methods],
                  "steps": self.steps, "repeats": self.repeats, "prefill": self.prefill, "graphs": self.graphs,
                  "length_bucket": self.length_bucket, "budget": budget,
                  **({"requests": True, "gen_len": self.steps, "text": self.text} if self.requests else {})}
        record["sfi"] = sfi  # SFI's settings, a results key (read back as cfg["sfi"])
        return record


def check_request_limit(config, prompts: list[int], gen_len: int) -> None:
    """Request mode: each prompt plus `gen_len` generated tokens must fit the model (`config` None: a GGUF
    file, checked once it loads)."""
    if config is None:
        return
    for prompt in prompts:
        if prompt + gen_len > config.max_context:
            room = config.max_context - gen_len
            fix = (f"the longest --prompt-len that fits with this --gen-len is {room:,}" if room > 0
                   else "lower --gen-len")
            raise UsageError(f"--prompt-len {prompt:,} plus --gen-len {gen_len:,} exceeds {config.name}'s "
                             f"limit of {config.max_context:,} tokens; {fix}")


def resolve_contexts(contexts, max_context: int, steps: int) -> tuple[int, ...]:
    """`max` as the longest prompt the model holds with `steps` decode tokens; resolved once a run knows the
    model's limit (from its shape before loading, or for a GGUF file once it loads)."""
    return tuple(max_context - steps if context == "max" else context for context in contexts)
