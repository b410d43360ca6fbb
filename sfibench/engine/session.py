"""A loaded model on a device with a cache sized for the job: what every command starts from."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sfibench.core.device import available_device_memory, resolve_device
from sfibench.core.device_facts import default_dtype
from sfibench.core.parallel import SINGLE, TensorParallel, rank_device
from sfibench.core.progress import starting
from sfibench.engine.cache import KVCache
from sfibench.engine.decode import Trace, generate
from sfibench.engine.memory_phases import loading
from sfibench.engine.method import AttentionMethod
from sfibench.engine.prefill import Prefilled, check_prompts, prefill
from sfibench.engine.sampling import Sampler, SamplingConfig
from sfibench.models.loading import LoadedModel, load_for_decode

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return DTYPES[default_dtype(device.type)]
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; valid: auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def _is_gguf(model: str) -> bool:
    """A GGUF file or a preset whose weights ship as one: the loads that take tens of seconds on a CPU."""
    from sfibench.models.presets import PRESETS

    return model.endswith(".gguf") or (model in PRESETS and PRESETS[model].source == "gguf")


@dataclass
class Session:
    loaded: LoadedModel
    device: torch.device
    dtype: torch.dtype
    cache: KVCache | None = field(default=None, repr=False)
    parallel: TensorParallel = SINGLE

    @classmethod
    def open(cls, model: str, device: str = "auto", dtype: str = "auto", seed: int = 0,
             fuse: bool | None = None, parallel: TensorParallel = SINGLE) -> Session:
        """`fuse`: decode's fused kernels on or off (default: on a GPU); models/loading.load_for_decode
        chooses them. `parallel`: this process's rank of a tensor-parallel run (its share of the model)."""
        resolved = rank_device(resolve_device(device))
        torch_dtype = parse_dtype(dtype, resolved)
        gguf = " (a GGUF file: dequantised on its first load, then read from its kept conversion)"
        starting(f"loading {model} on {resolved}" + (gguf if _is_gguf(model) else ""))
        with loading(model, resolved, torch_dtype):
            loaded = load_for_decode(model, resolved, torch_dtype, seed, fuse, parallel)
        return cls(loaded, resolved, torch_dtype, parallel=parallel)

    @property
    def cache_dtype_bytes(self) -> int:
        return torch.finfo(self.dtype).bits // 8

    @property
    def max_tokens(self) -> int:
        return self.loaded.config.max_context

    def memory_for_estimate(self) -> int:
        """Bytes this process may fill, the weights it already holds included (a memory estimate counts
        them): on a GPU the free memory plus what torch's allocator holds (its cached blocks are reusable),
        on a CPU this process's share of the available host memory (CPU ranks divide it) plus the weights."""
        if self.device.type == "cuda":
            return available_device_memory(self.device) + torch.cuda.memory_reserved(self.device)
        weights = sum(p.numel() * p.element_size() for p in self.loaded.model.parameters())
        return available_device_memory(self.device) // self.parallel.world_size + weights

    def holds(self, batch: int, tokens: int) -> bool:
        """Whether the cache has room for `batch` sequences of `tokens` slots, so that prefill keeps it."""
        return self.cache is not None and self.cache.batch == batch and self.cache.max_seq >= tokens

    def prefill(self, prompts: list[list[int]], max_new_tokens: int, evidence_rows: int = 64) -> Prefilled:
        """Check the prompts fit, size the cache for them, and prefill (dense, shared by all methods)."""
        check_prompts(prompts, self.max_tokens, max_new_tokens)
        needed = max(len(p) for p in prompts) + max_new_tokens
        if not self.holds(len(prompts), needed):
            self.cache = None  # free the old cache before allocating the new one
            self.cache = KVCache(self.loaded.config, len(prompts), needed, self.device, self.dtype)
        return prefill(self.loaded.model, self.cache, prompts, evidence_rows=evidence_rows)

    def decode(self, method: AttentionMethod, prefilled: Prefilled, max_new_tokens: int,
               sampling: SamplingConfig | None = None, forced: torch.Tensor | None = None,
               keep_logits: bool = False, on_step=None) -> tuple[Trace, dict]:
        sampler = Sampler(sampling or SamplingConfig(), self.device, self.parallel)
        trace = generate(self.loaded.model, self.cache, method, prefilled, max_new_tokens, sampler,
                         stop_ids=self.loaded.tokenizer.stop_ids(), forced=forced,
                         keep_logits=keep_logits, on_step=on_step)
        return trace, method.summary()
