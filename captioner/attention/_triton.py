"""Whether Triton, which the GPU kernels of sparsemax and TVmax are written in, is installed."""

from __future__ import annotations

from functools import cache


@cache
def triton_installed() -> bool:
    try:
        import triton  # noqa: F401  (ships with torch's CUDA wheels)
    except ImportError:
        return False
    return True
