"""Host-to-device copies that never stall the host.

A copy from pageable host memory (a fresh CPU tensor, or a Python list used as a device index) makes
CUDA drain the stream it is issued on first, so the host cannot queue work ahead of the GPU: each
decode step would wait for the last, and a refresh on the side stream would wait for the Selector.
Going through page-locked memory keeps the copy asynchronous; PyTorch's pinned-memory cache keeps the
staging block alive until the copy has run.
"""

from __future__ import annotations

import torch


def pinned(tensor: torch.Tensor) -> torch.Tensor:
    """A page-locked copy when CUDA exists, so a non_blocking copy to the GPU is truly asynchronous."""
    return tensor.pin_memory() if torch.cuda.is_available() else tensor


def device_index(values: list[int], device) -> torch.Tensor:
    """A list of indices as a device tensor, copied asynchronously (see `pinned`)."""
    return pinned(torch.tensor(values)).to(device, non_blocking=True)


def layer_index(layers: list[int], device) -> slice | torch.Tensor:
    """Index of `layers` along a layer axis: a slice when they are evenly spaced (all layers, or every
    other one under layer groups), so indexing is a view and copies nothing; else a device index."""
    step = layers[1] - layers[0] if len(layers) > 1 else 1
    if step > 0 and list(range(layers[0], layers[-1] + 1, step)) == layers:
        return slice(layers[0], layers[-1] + 1, step)
    return device_index(layers, device)
