"""One generation's KV cache and method state, as transformers' `generate` takes a cache (`past_key_values`).

The keys and values live in the engine's own cache (engine/cache.py), one slot per token of each
sequence from its first real token: a left-padded batch is stored unpadded, as the engine stores it,
so every method reads the positions it reads in the engine. transformers' side of the cache only counts
the positions it has fed (its padding included), which is what `generate` asks of it; `update` hands
the new keys and values on unchanged to sfibench's attention (attention.py), which writes them.

Per forward, `open_forward` (called before the model runs) returns the route its layers' attention takes:

- the prompt (the first forward): each sequence's prefill as the engine runs it (engine/prefill.py),
  its padding skipped; after the forward the method is made (a percentage budget resolves against the
  longest prompt) and starts on the prefilled cache, as the engine's step driver starts it;
- every later forward is one decode step of the engine's step driver (engine/driver.py): the method
  observes the fed tokens (SFI's triggers read them), plans the step, attends in every layer, and
  after the forward runs its `after_step` (an SFI refresh); `steps` records what each step read.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.cache_utils import Cache, DynamicLayer

from sfibench.engine.cache import KVCache
from sfibench.engine.decode import StepRecord, step_record
from sfibench.engine.driver import StepDriver
from sfibench.engine.method import AttentionMethod
from sfibench.engine.prefill import Prefilled, evidence_buffers, prefill_layer
from sfibench.hf.attention import EngineRoute, UnsupportedModelError
from sfibench.hf.model import Described


class UnsupportedGenerationError(UnsupportedModelError):
    """A generation mode or input sfibench.hf's cache cannot follow."""


def _refuse(what: str):
    def method(self, *args, **kwargs):
        raise UnsupportedGenerationError(f"{what} rearranges the cache between steps, which sfibench.hf's methods do "
                                         "not follow; generate greedily or by sampling (num_beams=1, no assistant)")
    return method


class MethodCache(Cache):
    """The cache of one generation: made by `Applied.cache` (or by the block's `generate` wrapper) for
    `max_new_tokens` tokens after the longest prompt; `steps` and `summary()` say what the method did."""

    def __init__(self, described: Described, new_method: Callable[[int], AttentionMethod], max_new_tokens: int,
                 evidence_rows: int = 64):
        if max_new_tokens < 1:
            raise UnsupportedGenerationError(f"max_new_tokens is {max_new_tokens}; the cache needs room for at least "
                                             "one new token")
        super().__init__(layers=[DynamicLayer() for _ in range(described.config.num_layers)])
        self.described, self.new_method = described, new_method
        self.max_new_tokens, self.evidence_rows = max_new_tokens, evidence_rows
        self.seen = 0  # positions transformers has fed, padding included
        self.kv: KVCache | None = None
        self.method: AttentionMethod | None = None
        self.driver: StepDriver | None = None
        self.steps: list[StepRecord] = []  # one per decode step
        self._closing = None  # what close_forward finishes

    # --- transformers' side ------------------------------------------------------------------------
    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return key_states, value_states  # the route's attention writes them to the engine's cache

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    reorder_cache = _refuse("beam search")
    crop = _refuse("assisted generation")
    batch_repeat_interleave = _refuse("expanding a prefilled cache")
    batch_select_indices = _refuse("selecting rows of a prefilled cache")

    # --- sfibench's side ---------------------------------------------------------------------------
    def summary(self) -> dict:
        """The method's own facts (SFI: the realised mean interval between slow steps)."""
        return self.method.summary() if self.method is not None else {}

    def open_forward(self, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
                     fed: int, reference: torch.Tensor) -> EngineRoute:
        """The route of a forward feeding `fed` positions per sequence (`reference`: any input tensor, for the
        batch size and device)."""
        if self.kv is None:
            return self._open_prompt(attention_mask, fed, reference)
        return self._open_step(input_ids, fed)

    def close_forward(self, logits: torch.Tensor) -> None:
        self._closing(logits)
        self._closing = None

    def _open_prompt(self, attention_mask, fed: int, reference: torch.Tensor) -> EngineRoute:
        batch, device = reference.shape[0], reference.device
        mask = torch.ones(batch, fed, dtype=torch.long, device=device) if attention_mask is None else attention_mask
        lengths = mask.long().sum(dim=-1)
        left_padded = torch.arange(fed, device=device)[None, :] >= fed - lengths[:, None]
        if mask.shape[-1] != fed or not torch.equal(mask.bool(), left_padded) or int(lengths.min()) < 1:
            raise UnsupportedGenerationError("sfibench.hf needs every prompt left-padded and non-empty (set "
                                             "tokenizer.padding_side = 'left' before tokenizing the batch)")
        lengths_host = lengths.tolist()
        self.method = self.new_method(max(lengths_host))
        self.kv = KVCache(self.described.config, batch, max(lengths_host) + self.max_new_tokens, device,
                          self.described.dtype)
        queries, counts = evidence_buffers(self.kv, lengths_host, self.evidence_rows)

        def attend(layer, q, k, v):
            out = q.new_zeros(*q.shape[:3], v.shape[-1])
            for row, length in enumerate(lengths_host):
                pad = fed - length
                out[row:row + 1, :, pad:] = prefill_layer(self.kv, queries, counts, length, layer, row, 0,
                                                          q[row:row + 1, :, pad:], k[row:row + 1, :, pad:],
                                                          v[row:row + 1, :, pad:])
            return out

        def close(logits):
            self.kv.set_lengths(lengths)
            self.driver = StepDriver(None, self.kv, self.method)
            self.driver.start(Prefilled(lengths, logits[:, -1], queries, counts))
            self.seen += fed

        self._closing = close
        return EngineRoute(attend, self.described.query_scale)

    def _open_step(self, input_ids, fed: int) -> EngineRoute:
        if input_ids is None:
            raise UnsupportedGenerationError("after the prompt sfibench.hf decodes from input_ids (the method reads "
                                             "each fed token); inputs_embeds carry no token ids")
        if fed != 1:
            raise UnsupportedGenerationError(f"after the prompt sfibench.hf decodes one token per forward; this "
                                             f"forward feeds {fed} (a continued prompt is a new generation: use a "
                                             "new cache)")
        if int(self.kv.lengths_host.max()) >= self.kv.max_seq:
            raise UnsupportedGenerationError(f"this cache holds {self.max_new_tokens} new tokens and they are used; "
                                             "make it with a larger max_new_tokens")
        tokens = input_ids[:, -1]
        self.method.observe(tokens)  # the token the step feeds, emitted by the step before it
        ctx, plan = self.driver.open_step(tokens)
        self.driver.begin_layers(ctx, plan)

        def close(logits):
            self.driver.close_step(ctx, plan)
            self.steps.append(step_record(self.method, ctx))
            self.seen += 1

        self._closing = close
        return EngineRoute(lambda layer, q, k, v: self.driver.attend(ctx, plan, layer, q, k, v),
                           self.described.query_scale)
