"""Benchmarks run by ``captioner bench``; they time, they do not test."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def counting_device_solver(run: Callable[[], Any]) -> tuple[Any, int, int]:
    """``run()``'s result, with how many grids the TVmax device solver solved meanwhile and how
    many of them its certificate left to the CPU solver (``tvmax.DEVICE_STATS``)."""
    # The module: the package's name ``tvmax`` is the function.
    stats = importlib.import_module("captioner.attention.tvmax").DEVICE_STATS
    grids, fallback = stats["grids"], stats["fallback"]
    result = run()
    return result, stats["grids"] - grids, stats["fallback"] - fallback
