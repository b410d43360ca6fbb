"""SFI's selection state: what each (layer, sequence, KV head) currently selects, published atomically.

A refresh must never be seen half-written: a fast step that read new positions with an old anchor, or
the new positions with the old compact K/V, would attend to the wrong tokens. So the state is
double-buffered. Buffer p of (layer, sequence) holds the selected positions, their count, the anchor
(recent-window start at the refresh) and the sink count, and, on the optimized path, the compact copy
of the sinks' and selected tokens' K/V. A refresh writes the buffer that is not live, then publishes
it by writing one number, `published[layer, row] = p`. Each decode step begins by copying `published`
into `live` on the main stream (inside the captured step), so every layer of a step reads one
consistent state, even while the refresh pipeline publishes from a side stream. `live = -1` means
nothing was published yet: the row reads its whole history (the bridge before the bootstrap refresh).

Publish policies (when a refresh becomes visible): `next_step`, the reference semantics, publishes before the
next step runs; `when_ready` lets the side stream publish whenever its work is done.
"""

from __future__ import annotations

import torch

from sfibench.sfi import geometry
from sfibench.sfi.config import SFIConfig, compact_rows
from sfibench.sfi.transfer import device_index


class SelectionState:
    def __init__(self, cfg: SFIConfig, layers: int, batch: int, kv_heads: int, device,
                 compact_dim: int | None = None, compact_dtype: torch.dtype | None = None, gather=None,
                 align: int = 1):
        self.cfg = cfg
        self.gather = gather or gather_compact  # the optimized path passes its Triton gather
        self.align = align  # compact segments end on a multiple of this many rows (see _rebuild_compact)
        buffers = (2, layers, batch)
        self.positions = torch.zeros(*buffers, kv_heads, cfg.k_head, dtype=torch.long, device=device)
        self.counts = torch.zeros(*buffers, kv_heads, dtype=torch.long, device=device)  # selected, sinks excluded
        self.anchor = torch.zeros(buffers, dtype=torch.long, device=device)
        self.sinks = torch.zeros(buffers, dtype=torch.long, device=device)
        self.published = torch.full((layers, batch), -1, dtype=torch.long, device=device)
        self.live = torch.full((layers, batch), -1, dtype=torch.long, device=device)
        # The host's view: which buffer each (layer, row) will read once its last refresh is published,
        # and that refresh's anchor and sink count (exact on the reference path, which publishes at once).
        self.published_host = torch.full((layers, batch), -1, dtype=torch.long)
        self.tail_start_host = torch.zeros(layers, batch, dtype=torch.long)
        self.compact_k = self.compact_v = self.compact_counts = self.tail_start = None
        if compact_dim is not None:
            shape = (*buffers, kv_heads, compact_rows(cfg, align), compact_dim)
            self.compact_k = torch.zeros(shape, dtype=compact_dtype, device=device)
            self.compact_v = torch.zeros(shape, dtype=compact_dtype, device=device)
            self.compact_counts = torch.zeros(*buffers, kv_heads, dtype=torch.int32, device=device)
            self.tail_start = torch.zeros(buffers, dtype=torch.int32, device=device)

    def reset(self) -> None:
        """Forget every selection (a new batch), in place: captured CUDA graphs hold these tensors."""
        for tensor in (self.published, self.live, self.published_host):
            tensor.fill_(-1)
        self.counts.zero_()
        self.tail_start_host.zero_()

    def begin_step(self) -> None:
        """Device side, first thing in a step: take every refresh published so far."""
        self.live.copy_(self.published)

    def back_buffer(self, layers: list[int], row: int) -> list[int]:
        """The buffer a new refresh of (layer, row) writes: the one its readers will not be using."""
        return [1 - max(int(self.published_host[layer, row]), 0) for layer in layers]

    def write(self, layers: list[int], row: int, picks: torch.Tensor, length: int, cache=None) -> list[int]:
        """Store a refresh of `row` at KV length `length`: `picks [len(layers), H_kv, K]`, ascending positions.

        With compact buffers, also copies the sinks' and picks' K/V rows out of `cache` into the back
        buffer. Returns the buffers written; `publish` makes them live. Layers are grouped by buffer so a
        refresh costs a handful of indexed writes, not a few per layer.
        """
        lo, hi = geometry.candidate_range(length, self.cfg)
        anchor, sinks = max(hi, 0), lo
        buffers = self.back_buffer(layers, row)
        count = picks.shape[-1]
        self.tail_start_host[layers, row] = max(anchor, sinks)
        for buffer, chosen, target in self._groups(layers, buffers, picks.device):
            part = picks  # usually every layer shares one buffer, and no index is needed
            if len(chosen) < len(layers):
                part = picks.index_select(0, device_index(chosen, picks.device))
            self.positions[buffer, target, row, :, :count] = part
            # index_fill_ takes the value as a kernel argument (no host-to-device copy of a scalar)
            self.counts[buffer, :, row].index_fill_(0, target, count)
            self.anchor[buffer, :, row].index_fill_(0, target, anchor)
            self.sinks[buffer, :, row].index_fill_(0, target, sinks)
            if self.compact_k is not None:
                self._rebuild_compact(buffer, target, row, part, sinks, anchor, length, cache)
        return buffers

    @staticmethod
    def _groups(layers: list[int], buffers: list[int], device):
        """(buffer, indices into `layers`, those layers as a device index) for each buffer written.

        The index goes through pinned memory: a Python list used as an index, or copied from pageable
        memory, would make the host wait for the stream to drain (and on a side stream, for the Selector)."""
        for buffer in sorted(set(buffers)):
            chosen = [i for i, b in enumerate(buffers) if b == buffer]
            yield buffer, chosen, device_index([layers[i] for i in chosen], device)

    def _rebuild_compact(self, buffer: int, target: torch.Tensor, row: int, picks: torch.Tensor, sinks: int,
                         anchor: int, length: int, cache) -> None:
        """Copy the K/V rows of sinks + picks `[n, H_kv, K]` of layers `target` into compact buffer `buffer`.

        The optimized fast step then reads them as one contiguous segment (coalesced loads, no index
        list), and the recent window in place from the cache. The segment is filled up to a multiple of
        `align` rows with the window's first rows, which then are read from here rather than in place:
        the same rows, but the kernel's loop over compact rows ends on a whole tile (two_segment.py), so
        no tile is spent on a few compact rows and another on the window's first few."""
        window = max(anchor, sinks)
        filled = sinks + picks.shape[-1]
        moved = min(-filled % self.align, max(length - window, 0))
        self.gather(cache.k, cache.v, self.compact_k, self.compact_v, buffer, target, row, sinks, picks,
                    window, moved)
        self.compact_counts[buffer, :, row].index_fill_(0, target, filled + moved)
        self.tail_start[buffer, :, row].index_fill_(0, target, window + moved)

    def publish(self, layers: list[int], row: int, buffers: list[int]) -> None:
        """Make the written buffers the ones the next step reads (a device write, in stream order)."""
        self.published_host[layers, row] = torch.tensor(buffers)
        for buffer, _, target in self._groups(layers, buffers, self.published.device):
            self.published[:, row].index_fill_(0, target, buffer)


def gather_compact(k_cache: torch.Tensor, v_cache: torch.Tensor, compact_k: torch.Tensor,
                   compact_v: torch.Tensor, buffer: int, layers: torch.Tensor, row: int, sinks: int,
                   picks: torch.Tensor, window_start: int = 0, window_rows: int = 0) -> None:
    """Write the K/V of positions [0, sinks) + picks[i, h] + [window_start, window_start + window_rows) of
    (layers[i], row, KV head h) from the cache `[L, B, H_kv, S, D]` to rows [0, sinks + K + window_rows) of
    `compact_* [2, L, B, H_kv, R, D]` at `buffer`.

    The reference; optimized/compact_kernels.gather_compact does it in one launch, without the copy in
    between that indexing makes here."""
    count, heads = picks.shape[0], picks.shape[1]
    sink_positions = torch.arange(sinks, device=picks.device).expand(count, heads, sinks)
    window = torch.arange(window_start, window_start + window_rows, device=picks.device)
    rows = torch.cat([sink_positions, picks, window.expand(count, heads, window_rows)], dim=-1)
    # Row numbers into the cache flattened to [layers * B * H_kv * S, D]: indexing k_cache[layers]
    # directly would first copy every listed layer's whole K.
    _, batch, _, slots, dim = k_cache.shape
    heads_index = torch.arange(heads, device=picks.device)[None, :, None]
    flat = (((layers[:, None, None] * batch + row) * heads + heads_index) * slots + rows).flatten()
    width, shape = rows.shape[-1], (*rows.shape, dim)
    compact_k[buffer, layers, row, :, :width] = k_cache.view(-1, dim).index_select(0, flat).view(shape)
    compact_v[buffer, layers, row, :, :width] = v_cache.view(-1, dim).index_select(0, flat).view(shape)
