"""Every knob in sfibench, as dataclasses.

Defaults follow SPEC.md; the CLI exposes each field as a flag, so no default lives anywhere else.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from sfibench.core.errors import UsageError


@dataclass
class SelectorConfig:
    """The SFI Selector (SPEC section 5); each stage can be switched off for ablations."""

    alpha: float = 0.5  # power-mean exponent pooling the evidence rows
    use_prior: bool = True
    gamma: float = 0.5  # key-norm exponent of the prior
    w_norm: float = 1.0
    w_pos: float = 0.7
    pos_p: float = 1.8
    eta: float = 0.4
    beta: float = -math.log(0.6) / 0.9
    lambda_fixed: float | None = None  # --lambda: use this fusion weight instead of the closed form
    lambda_clip_multi: float = 0.25  # clip when the evidence has R > 1 rows
    lambda_clip_single: float = 0.35  # clip when R == 1
    use_nms: bool = True
    nms_radius: int = 16  # window of 32 positions: +-16
    nms_alpha: float = 1.0
    use_cross_head: bool = True
    cross_temperature: float = 2.0
    cross_alpha: float = 0.85
    eps: float = 1e-12
    # Ablations beyond SPEC's Selector; the defaults leave it exactly as specified.
    evidence_norm: str = "candidates"  # candidates: each evidence row softmaxed over C (SPEC; the authors'
    #                                    Triton path) | visible: over every key the row sees, then restricted
    #                                    to C (the authors' CUDA path)
    keep_neighbours: int = 1  # odd max-pool kernel over the final score before top-K, so a kept peak keeps
    #                           its neighbours (SnapKV's pooling); 1 = off. An extension beyond the paper.


@dataclass
class TriggerConfig:
    """When a sequence takes a slow (dense + refresh) step (SPEC section 3)."""

    policy: str = "punctuation_tmax"  # punctuation_tmax | fixed | random | bootstrap
    t_max: int = 96
    min_gap: int = 16
    interval: int = 32  # N for the `fixed` (every N) and `random` (Bernoulli 1/N) ablations
    seed: int = 0


@dataclass
class SFIConfig:
    """Sparse-memory geometry and refresh behaviour of Slow-Fast Inference (SPEC sections 2-4)."""

    n_sink: int = 4
    n_recent: int = 256
    k_head: int = 2048
    page: int = 16
    w_prefill: int = 16  # prompt query rows used as evidence by the bootstrap (prefill) refresh
    layer_groups: int = 1  # 2: even and odd layers refresh on alternate slow steps
    bridge_steps: int = 0  # decode steps after prefill that run densely before the bootstrap selection is used
    publish: str = "next_step"  # next_step: a refresh is used from the next step | when_ready: optimized path,
    #                             the Selector runs on a side stream and its result is used once it is done
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    selector: SelectorConfig = field(default_factory=SelectorConfig)


@dataclass
class StreamingLLMConfig:
    """Sinks plus a recent window; budget = n_sink + window, matched to SFI's tokens read."""

    n_sink: int = 4
    budget: int = 2308  # tokens read per (layer, KV head): SFI's default 4 + 2048 + 256


@dataclass
class SnapKVConfig:
    """One-shot prompt compression after prefill (SPEC section 6)."""

    window: int = 64  # last prompt queries that vote, and are always kept
    kernel: int = 7
    pooling: str = "max"  # max | avg
    budget: int = 2308  # prompt tokens kept per KV head, window included


@dataclass
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0


@dataclass
class MethodSpec:
    """Which attention method runs, on which path, with its settings."""

    name: str = "full_kv"
    path: str = "reference"  # reference | optimized
    sfi: SFIConfig = field(default_factory=SFIConfig)
    streaming: StreamingLLMConfig = field(default_factory=StreamingLLMConfig)
    snapkv: SnapKVConfig = field(default_factory=SnapKVConfig)


class BudgetError(UsageError):
    """A budget written in a way that has no single meaning, or one that does not fit the context."""


_WHOLE_TOKENS = re.compile(r"[0-9]+")
_PERCENTAGE = re.compile(r"([0-9]+(?:\.[0-9]+)?)%")
BUDGET_SYNTAX = "a whole number of tokens (300) or a percentage of the context (15%)"


@dataclass(frozen=True)
class Budget:
    """A tokens-read budget as the user wrote it: whole tokens, or a percentage of the context.

    One spelling per meaning, so `1` and `1.0` cannot mean different things: a fraction such as
    0.15 or 300.9 is refused with the spelling to use instead (fractions belong to --retention).
    """

    tokens: int | None = None
    percent: float | None = None

    @classmethod
    def parse(cls, text: str, what: str = "--budget") -> Budget:
        spelled = str(text).strip()
        if _WHOLE_TOKENS.fullmatch(spelled):
            if int(spelled) == 0:
                raise BudgetError(f"{what} must be at least 1 token, got {spelled}")
            return cls(tokens=int(spelled))
        match = _PERCENTAGE.fullmatch(spelled)
        if match:
            percent = float(match[1])
            if not 0 < percent <= 100:
                raise BudgetError(f"{what} {spelled} is not a percentage in (0%, 100%]")
            return cls(percent=percent)
        raise BudgetError(f"{what} {spelled!r} is not {BUDGET_SYNTAX}" + _spelling_hint(spelled))

    def resolve(self, context_len: int, what: str = "--budget", at_most_context: bool = True) -> int:
        """Tokens for a context of `context_len` tokens.

        A budget above the context is an error (it would silently mean Full-KV); SFI's k_head is a cap
        (K = min(k_head, |C|)), so it passes `at_most_context=False`.
        """
        if self.tokens is not None:
            tokens = self.tokens
        else:
            tokens = round(self.percent / 100 * context_len)
            if tokens < 1:
                raise BudgetError(f"{what} {self.percent:g}% of a {context_len}-token context is less than one "
                                  "token; give a larger percentage or a token count")
        if at_most_context and tokens > context_len:
            raise BudgetError(f"{what} of {tokens} tokens is larger than the {context_len}-token context; "
                              "give a smaller budget or a percentage such as 15%")
        return tokens


def _spelling_hint(spelled: str) -> str:
    """Why a number was refused, in the user's own terms: the spelling that says what they meant."""
    try:
        value = float(spelled)
    except ValueError:
        return ""
    if value <= 0:
        return "; a budget must be positive"
    if value <= 1:
        return f"; as a share of the context, {spelled} is written {value * 100:g}%"
    return f"; tokens are whole numbers, e.g. {int(value)}"


def parse_budget(text: str, context_len: int, what: str = "--budget", at_most_context: bool = True) -> int:
    """'300' -> 300 tokens; '15%' -> 15% of `context_len` (tokens read per layer and KV head)."""
    return Budget.parse(text, what).resolve(context_len, what, at_most_context)


def apply_budget(spec: MethodSpec, budget: int) -> None:
    """Give every sparse method the same tokens-read budget per (layer, KV head)."""
    sfi = spec.sfi
    k_head = budget - sfi.n_sink - sfi.n_recent
    if spec.name == "sfi" and k_head <= 0:
        raise BudgetError(f"a budget of {budget} tokens leaves no room for selected tokens beside "
                          f"{sfi.n_sink} sinks and {sfi.n_recent} recent ones; raise it or lower --n-recent")
    if spec.name == "streaming_llm" and budget <= spec.streaming.n_sink:
        raise BudgetError(f"a budget of {budget} tokens leaves StreamingLLM no window beside its "
                          f"{spec.streaming.n_sink} sinks; raise it")
    if spec.name == "snapkv" and budget <= spec.snapkv.window:
        raise BudgetError(f"a budget of {budget} tokens is not more than SnapKV's {spec.snapkv.window}-token "
                          "observation window, which it always keeps; raise it")
    sfi.k_head = max(k_head, 1)
    spec.streaming.budget = budget
    spec.snapkv.budget = budget
