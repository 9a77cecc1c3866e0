"""Benchmarks run by ``captioner bench``; they time, they do not test.

What they share: the option types that refuse a bad value (an unknown name, a device the
machine lacks) while the options are parsed, so that no benchmark starts, or runs for minutes,
before it fails on one of its own options.
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable
from typing import Any


class PhaseClock:
    """Sums the host time of named phases of a repeated step, by ``time.perf_counter`` with
    no device sync: :meth:`start` starts the clock, each :meth:`ends` charges the time since
    the last mark to the phase it names, :meth:`stop` stops the clock (marks then count
    nothing until the next start)."""

    def __init__(self, phases: tuple[str, ...]) -> None:
        self.seconds = dict.fromkeys(phases, 0.0)
        self._last: float | None = None

    def start(self) -> None:
        self._last = time.perf_counter()

    def stop(self) -> None:
        self._last = None

    def ends(self, phase: str) -> None:
        if self._last is not None:
            now = time.perf_counter()
            self.seconds[phase] += now - self._last
            self._last = now

    def milliseconds_per_step(self, steps: int) -> dict[str, float]:
        return {phase: 1000.0 * seconds / steps for phase, seconds in self.seconds.items()}


def counting_device_solver(run: Callable[[], Any]) -> tuple[Any, int, int]:
    """``run()``'s result, with how many grids the TVmax device solver solved meanwhile and how
    many of them its certificate left to the CPU solver (``tvmax.DEVICE_STATS``)."""
    # The module: the package's name ``tvmax`` is the function.
    stats = importlib.import_module("captioner.attention.tvmax").DEVICE_STATS
    grids, fallback = stats["grids"], stats["fallback"]
    result = run()
    return result, stats["grids"] - grids, stats["fallback"] - fallback


def refuse_unwritable(parser: argparse.ArgumentParser, option: str, path, check) -> None:
    """A usage error ``OPTION PATH: reason`` when ``check(path)`` (``check_output_file`` or
    ``check_output_dir`` of :mod:`data_prep.files`) refuses the output ``path`` (None: not
    given): checked before the benchmark runs, so that its results are not lost to it."""
    if path is None:
        return
    try:
        check(path)
    except ValueError as exc:
        parser.error(f"{option} {exc}")


def refuse_more_threads_than_numba_has(parser: argparse.ArgumentParser, threads) -> None:
    """A usage error when ``--threads`` asks for more threads than numba's pool, which numba
    starts at the CPU count (or NUMBA_NUM_THREADS) and cannot grow: it would stop inside the
    benchmark. None (not given) passes."""
    import numba

    if threads is not None and threads > numba.config.NUMBA_NUM_THREADS:
        parser.error(f"argument --threads: must be <= {numba.config.NUMBA_NUM_THREADS} "
                     f"(numba's threads on this machine), got {threads}")


def use_threads(threads: int | None) -> str:
    """Run torch and numba (the CPU solvers of TVmax, fusedmax and oscarmax) on ``threads``
    threads each (None: as they are); returns ``threads torch=N numba=M`` for the header."""
    import numba
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
        numba.set_num_threads(threads)
    return f"threads torch={torch.get_num_threads()} numba={numba.get_num_threads()}"


def torch_device(name: str):
    """An argparse ``type``: the torch device ``name`` as
    :func:`captioner.inference.resolve_device` accepts it (cpu, cuda, cuda:N, present on this
    machine); its refusal becomes the usage error, which names the value."""
    from captioner.inference import resolve_device

    try:
        return resolve_device(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
