"""What a decoding method is to the engine: its step protocol, its settings and its budget rule.

A method never owns the KV cache. After the prompt is prefilled it may look at the cache and at the
last prompt queries (its bootstrap); then, at each decode step, it decides whether each sequence takes
a slow step and returns the step's frozen plan (`plan`), which cached positions each query reads
(`attend`, which also records the tokens read), what happens after the step (`after_step`, SFI's
refresh), and it sees every emitted token (`observe`), which is how SFI's triggers work. The step
driver in engine/driver.py calls these in that order, eagerly or as a CUDA-graph replay.

Each method lives in one module that exports a `MethodDef`: its name, its settings dataclass (a
`MethodConfig`, whose methods are the method's budget rule and bytes model) and a class per path.
sfibench/registry.py lists them; everything else asks the registry, never a method by name.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch loads where a tensor is made: the command line reads the settings classes without it
    import torch


@dataclass(frozen=True)
class StepPlan:
    """The host-side facts one decode step's attention depends on: static sizes, and which kernels run.

    Frozen and hashable because it *is* the CUDA-graph key: a captured step is replayed only for an
    equal plan. Everything that changes from step to step without changing a size (lengths, which rows
    are slow, the current selection) is device data the method keeps in its own tensors, so a batch
    mixing slow and fast rows replays one graph. `graphable=False` asks the driver to run eagerly.
    """

    graphable: bool = True


@dataclass(frozen=True)
class MethodConfig:
    """A method's settings (SPEC's defaults), with its one budget rule and its bytes model.

    The defaults here are a dense method's: it reads the whole context and keeps no state of its own.
    """

    def with_budget(self, budget: int) -> MethodConfig:
        """These settings at `budget` tokens read per (layer, KV head); BudgetError where it cannot fit."""
        return self

    def tokens_read(self, context: int) -> int:
        """Tokens a step reads per (layer, KV head) at `context` tokens (right after a refresh, if any)."""
        return context

    def state_bytes(self, model_config, path: str, dtype_bytes: int, tile_rows: int) -> tuple[int, int]:
        """Device bytes of the method's own state: (per sequence and cached token, per sequence)."""
        return 0, 0

    def workspace_bytes(self, model_config, path: str, dtype_bytes: int, batch: int, max_seq: int,
                        prompt: int) -> int:
        """Device bytes of the method's largest transient (a bootstrap's or a refresh's scores, a reference
        step's gathers), beside its state, at `batch` sequences of `max_seq` cache slots whose first `prompt`
        were prefilled: the memory estimate plans for it."""
        return 0

    def compact_slots(self, path: str) -> int | None:
        """Slots per sequence the method reads of a prompt of any length once it is prefilled, on `path`; the
        engine then keeps only those and the generated tokens (engine/compact.py; the method's `keep` says
        which). None: the method may read any cached position, so the whole cache stays."""
        return None

    def step_bytes(self, model_config, context: int, dtype_bytes: int) -> float:
        """Bytes every step reads beside the K/V tokens it attends to (Quest: its page metadata)."""
        return 0.0

    def refresh_bytes(self, model_config, context: int, path: str, dtype_bytes: int) -> float:
        """Traffic of one sequence's refresh beyond its dense read (0 for methods that never refresh)."""
        return 0.0

    def variants(self, path: str) -> list[MethodConfig]:
        """The settings `sfibench throughput` times as separate rows on `path` (SFI: both publish modes)."""
        return [self]

    def row_facts(self) -> dict:
        """Settings that tell a results row apart from another row of the same method and path."""
        return {}

    def with_variant(self, variant: dict | None) -> MethodConfig:
        """These settings with an ablation's changes applied (settings of other methods are ignored)."""
        return self

    def budget_facts(self) -> dict:
        """How the method spends its budget (sinks, picks, window, ...), for quality reports."""
        return {}

    def settings(self) -> dict:
        """Every setting, as results.json records it."""
        return dataclasses.asdict(self)

    def recall_memory(self, selection_budget) -> RecallMemory | None:
        """What this method's steps read, for `sfibench stability`'s recall comparison; None: nothing to
        compare (a dense method reads everything; a method whose choice needs more than the analysis sees).
        `selection_budget` is the analysis's `--k-head` (a core.budget.Budget) for methods that select."""
        return None


@dataclass
class AttentionView:
    """One decode step of one sequence as `sfibench stability` sees it.

    `logits [layers, H_kv, G, L]` are the dense attention logits of every query head, `key_norms
    [layers, H_kv, L]` the cached key norms, `sentence_start` whether the step opens a sentence, and
    `budget [layers, H_kv, 1]` the tokens the budget reference's memory reads at this step, which every
    other method is matched to (None while the reference has nothing to compare). A method that ranks
    by something other than the logits finds the step's post-RoPE `queries [layers, H_q, D]` and the
    cached `keys [layers, H_kv, L, D]`, and one that treats layers differently the `model_config` and
    `layers`, the model layer each row is (None: row i is layer i; a model with sliding-window layers
    is analysed on its global layers only). A method that chooses once from the prompt finds the last
    prompt queries `prompt_queries [layers, H_q, W, D]` (post-RoPE, W of them) and the prompt's length
    `prompt_length`. Each is None where the caller has none to give (a memory that needs it then has
    nothing to compare).
    """

    logits: torch.Tensor
    key_norms: torch.Tensor
    sentence_start: bool
    budget: torch.Tensor | None = None
    queries: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    model_config: Any = None
    layers: tuple[int, ...] | None = None
    prompt_queries: torch.Tensor | None = None
    prompt_length: int | None = None

    def layer_ids(self) -> list[int]:
        """The model layer of each row."""
        return list(self.layers) if self.layers is not None else list(range(self.logits.shape[0]))


class RecallMemory:
    """The positions a method's step would read, as bool masks `[layers, H_kv, L]` named for reports."""

    names: tuple[str, ...] = ()
    labels: dict[str, str] = {}  # name -> what reports call the memory (results.json records it)
    wanted: frozenset[str] | None = None  # the names the caller uses (None: all); a memory may skip the others

    def masks(self, view: AttentionView) -> dict[str, torch.Tensor] | None:
        """This step's memories by name, or None when the step has nothing to compare."""
        raise NotImplementedError


@dataclass(frozen=True)
class MethodSpec:
    """Which method runs, on which path, with which settings (None: the method's defaults)."""

    name: str
    path: str = "reference"
    config: Any = None


@dataclass(frozen=True)
class MethodDef:
    """One method as the registry lists it."""

    name: str
    summary: str  # one line for --help, `sfibench models` and reports
    config: type  # its MethodConfig subclass; instances with no arguments are SPEC's defaults
    paths: dict  # path -> AttentionMethod subclass, or "module:Class" imported when first used
    dense: bool = False  # reads every cached token each step: the reference every speedup is measured against

    def path_class(self, path: str) -> type:
        target = self.paths[path]
        if isinstance(target, str):
            module, _, name = target.partition(":")
            target = getattr(importlib.import_module(module), name)
        return target


class AttentionMethod:
    name = "abstract"
    has_slow_steps = False  # True: each step is reported as "slow", "bridge" or "fast" per sequence
    step_kind = "sparse"  # how steps are reported otherwise ("dense" for Full-KV)

    def __init__(self, config: MethodConfig, model_config, tokenizer):
        self.cfg = config
        self.model_config = model_config
        self.tokenizer = tokenizer

    def start(self, cache, prefilled) -> None:
        """A new batch was prefilled (or restored from a snapshot): reset per-sequence state."""

    def keep(self, cache, prefilled, row: int) -> tuple[torch.Tensor, int]:
        """What a method whose settings declare `compact_slots` keeps of prefilled sequence `row`: fixed
        positions `[layers, H_kv, F]` (long, on the cache's device), and the first position of the prompt's
        tail it keeps whole (engine/compact.py copies them into a compact cache; `start` then sees that cache,
        its `fixed_rows` set)."""
        raise NotImplementedError(f"{self.name} reads the whole cache; it keeps no compact part of it")

    def plan(self, ctx) -> StepPlan:
        """Host side, before the step: decide each row's kind (`ctx.slow`), fill the method's device
        inputs for this step in place, and return the step's plan."""
        return StepPlan()

    def begin_step(self, ctx, plan: StepPlan) -> None:
        """Device side, once per step before the first layer (captured with the step): derive the
        step's device tensors from `ctx.kv_lengths` and the method's state."""

    def attend(self, q: torch.Tensor, cache, ctx, plan: StepPlan) -> torch.Tensor:
        """Decode attention for layer `ctx.layer`; `ctx.tokens_read[ctx.layer]` must hold the tokens read
        once the step is done (here or in `begin_step`). Reads no host state outside `plan`."""
        raise NotImplementedError

    def after_step(self, ctx, plan: StepPlan) -> None:
        """Host side, after the step was launched: where a slow step hands its evidence to the refresh."""

    def observe(self, tokens: torch.Tensor) -> None:
        """The tokens `[B]` emitted by the step just run."""

    def state(self, name: str, shape: tuple, dtype: torch.dtype, device, fill=0) -> torch.Tensor:
        """A per-batch state tensor set to `fill`, reused in place when the shape allows.

        A captured CUDA graph keeps reading the tensors it saw at capture, so state must be reset in
        place between runs rather than replaced by a new allocation.
        """
        import torch

        tensor = getattr(self, name, None)
        if tensor is None or tensor.shape != torch.Size(shape) or tensor.dtype != dtype or tensor.device != device:
            tensor = torch.empty(shape, dtype=dtype, device=device)
            setattr(self, name, tensor)
        return tensor.fill_(fill)

    def summary(self) -> dict:
        """Method-specific facts for reports (e.g. SFI's realised mean interval between slow steps)."""
        return {}
