"""Choosing the device and the threads a profile runs with (``schedc profile``), and naming a
device exactly (``indexed``)."""

from __future__ import annotations

import os

import torch

from schedc.errors import SchedcError


def choose_device(device: str | None, ranks: int, threads: int | None) -> tuple[str, int]:
    """``device`` checked (default: cuda where torch sees one, else cpu); on cpu, torch's threads
    set to ``threads`` (default: the cores shared out among ``ranks``). Returns the device and
    torch's thread count. SchedcError for a device that is not one or that this machine lacks."""
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        where = torch.device(dev)
    except (RuntimeError, ValueError):
        raise SchedcError(f"--device {dev!r}: not a device; use cpu, cuda or cuda:N") from None
    if where.type not in ("cpu", "cuda"):
        raise SchedcError(f"--device {dev!r}: schedc profiles on cpu or cuda only")
    if where.type == "cuda" and (not torch.cuda.is_available() or (where.index or 0) >= torch.cuda.device_count()):
        raise SchedcError(f"--device {dev!r}: torch sees {torch.cuda.device_count()} CUDA devices here")
    if where.type == "cpu":
        torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // ranks))
    return dev, torch.get_num_threads()


def indexed(device: torch.device | str) -> torch.device:
    """``device`` with its index: ``cuda`` is the current CUDA device, ``cuda:0`` say, as a tensor
    on it reports its device (``torch.device("cuda") != torch.device("cuda:0")``: a comparison
    with an unindexed device would find no tensor on it)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
