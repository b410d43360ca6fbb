"""SFI's sparse-memory geometry (SPEC section 2), written once for every user.

Per (layer, sequence, KV head), at KV length L, a fast step reads

    sinks      [0, min(L, n_sink))
    selected   the Selector's picks among the candidates C = [lo, hi) = [min(L, n_sink), recent_start(L))
    recent     [tail_start, L), tail_start = max(anchor, sink count), anchor = recent_start at the last refresh

The recent window is page-aligned (it holds n_recent .. n_recent + page - 1 tokens right after a refresh)
and anchored: between refreshes it keeps its start and grows by one token per step, so a token that
leaves the window unselected stays visible until the next refresh. The reference path, the optimized
path, the stability analysis and the bytes model all take these numbers from here. Every function
accepts a Python int or an integer tensor (elementwise) for the lengths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # sfi/config.py imports this module for its budget rule
    from sfibench.sfi.config import SFIConfig


def _is_tensor(length) -> bool:
    # told apart without importing torch: SFI's budget rule (sfi/config.py) checks a command line first
    return hasattr(length, "clamp")


def recent_start(length, n_recent: int, page: int):
    """First slot of the page-aligned recent window at KV length `length`."""
    if _is_tensor(length):
        return (length - length.clamp(max=n_recent)).div(page, rounding_mode="floor") * page
    return (length - min(length, n_recent)) // page * page


def sink_count(length, cfg: SFIConfig):
    """How many sink positions exist at KV length `length`."""
    return length.clamp(max=cfg.n_sink) if _is_tensor(length) else min(length, cfg.n_sink)


def candidate_range(length: int, cfg: SFIConfig) -> tuple[int, int]:
    """C = [lo, hi): the positions the Selector may pick at a refresh at KV length `length` (may be empty)."""
    return sink_count(length, cfg), recent_start(length, cfg.n_recent, cfg.page)


def candidates(length: int, cfg: SFIConfig) -> int:
    """|C| at a refresh at KV length `length`."""
    lo, hi = candidate_range(length, cfg)
    return max(0, hi - lo)


def tokens_read_after_refresh(length: int, cfg: SFIConfig) -> int:
    """Tokens a fast step reads per (layer, KV head) right after a refresh at `length`.

    Sinks + min(k_head, |C|) + the recent window; the whole context while it is too short to be sparse.
    Between refreshes the anchored window grows by one token per step beyond this.
    """
    if length < cfg.n_sink + cfg.k_head + cfg.n_recent:
        return length
    return sink_count(length, cfg) + min(cfg.k_head, candidates(length, cfg)) + length - recent_start(
        length, cfg.n_recent, cfg.page)
