"""Tensor parallelism's plumbing: the process group of one run's ranks and the three collectives decode needs.

One process per rank, started by `torchrun` (which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT); NCCL between GPUs, gloo between CPU processes. The group is made with a timeout, so a rank that
dies or raises leaves the others failing at their next collective instead of waiting forever. Nothing here
knows about models: models/sharding.py decides what is split and calls these.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from sfibench.core.errors import UsageError

# How long a rank waits at a collective for the others: long enough for a slow rank's weights to load,
# short enough that a crashed rank ends the run within minutes rather than never.
DEFAULT_TIMEOUT_S = 600.0


class RankLostError(RuntimeError):
    """A collective failed: another rank stopped (crashed, raised, was killed) or did not arrive in time."""


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in the run: `rank` of `world_size`, the collectives over `group`."""
    rank: int
    world_size: int
    group: object = None

    @property
    def is_main(self) -> bool:
        """Rank 0 alone prints and writes the run directory."""
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum the ranks' partial products of a row-parallel layer, in place."""
        with self.collective("the all-reduce of a layer's partial sums"):
            dist.all_reduce(x, group=self.group)
        return x

    def gather_last(self, local: torch.Tensor, total: int) -> torch.Tensor:
        """The ranks' slices of the last dimension side by side, rank order, cut to `total` (the slices are
        equal but the last, which shard_bounds may leave shorter: it is padded for the collective)."""
        width = -(-total // self.world_size)
        padded = torch.nn.functional.pad(local, (0, width - local.shape[-1]))
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        with self.collective("the gather of the logits"):
            dist.all_gather(parts, padded.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)[..., :total]

    def same_everywhere(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` on every rank: a value every rank must act on identically (the sampled token)."""
        with self.collective("the broadcast of the sampled token"):
            dist.broadcast(x, src=0, group=self.group)
        return x

    @contextlib.contextmanager
    def collective(self, what: str) -> Iterator[None]:
        """The backend's error (gloo: "Connection closed by peer", NCCL: a watchdog timeout) as one line that
        says which rank saw what; the other rank's own error is in its output."""
        try:
            yield
        except RuntimeError as error:
            raise RankLostError(f"rank {self.rank} of {self.world_size}: {what} failed, another rank stopped or "
                                f"did not arrive within the process group's timeout ({error})") from error


SINGLE = TensorParallel(rank=0, world_size=1)


def interconnect(tp: TensorParallel, device: torch.device) -> str | None:
    """How the ranks exchange their partial sums (None for one process): the process group's backend, and
    between GPUs whether each reaches the others' memory directly (NVLink or PCIe peer-to-peer)."""
    if tp.world_size == 1:
        return None
    backend = dist.get_backend(tp.group)
    if device.type != "cuda":
        return f"{backend} between CPU processes"
    peers = all(torch.cuda.can_device_access_peer(a, b) for a in range(tp.world_size)
                for b in range(tp.world_size) if a != b)
    return f"{backend} between GPUs, {'peer-to-peer' if peers else 'through host memory (no peer access)'}"


def shard_bounds(total: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, stop) of `rank`'s slice of `total` rows: ceil(total / world_size) each, the last the rest."""
    width = -(-total // world_size)
    return min(rank * width, total), min((rank + 1) * width, total)


def check_divisible(model: str, num_kv_heads: int, num_heads: int, intermediate_size: int, world_size: int) -> None:
    """The shapes tensor parallelism splits evenly: KV heads (and so query heads, the cache and every method's
    state) and the MLP's hidden rows. Checked from the config, before any weight loads."""
    for what, count in (("KV heads", num_kv_heads), ("attention heads", num_heads),
                        ("MLP rows", intermediate_size)):
        if count % world_size:
            raise UsageError(f"--tp {world_size}: {model} has {count} {what}, which do not split over "
                             f"{world_size} ranks; use a --tp that divides {num_kv_heads}")


def launched_ranks() -> int:
    """WORLD_SIZE as torchrun set it: 1 outside a torchrun launch."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank_device(device: torch.device) -> torch.device:
    """The GPU this rank drives under torchrun (its LOCAL_RANK); a CPU stays the CPU."""
    if device.type == "cuda" and launched_ranks() > 1:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def join(device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S) -> TensorParallel:
    """Join the process group torchrun's environment describes (gloo on a CPU, NCCL on a GPU)."""
    if launched_ranks() == 1:
        return SINGLE
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(rank_device(device))
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return TensorParallel(dist.get_rank(), dist.get_world_size(), dist.group.WORLD)


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def ranks(device: torch.device) -> Iterator[TensorParallel]:
    """This process's rank for the length of a run (SINGLE outside torchrun), the group left at the end."""
    tp = join(device)
    try:
        yield tp
    finally:
        if tp.world_size > 1:
            leave()
