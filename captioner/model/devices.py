"""The devices captioner runs on: the CPU and CUDA GPUs (torch only, no Lightning: feature
preparation and captioning pick their device with it)."""

from __future__ import annotations

import torch


def resolve_device(name: str | None = None) -> torch.device:
    """The torch device ``name``, or CUDA when available (else the CPU) for None.

    Raises:
        ValueError: an unknown device name, a device other than the CPU and CUDA (the ones
            captioner is built and tested for), or a CUDA device on a machine without one.
    """
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {name!r}: {exc}") from exc
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name!r}: captioner runs on the CPU or on CUDA devices "
                         "(cpu, cuda, cuda:N)")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    return device
