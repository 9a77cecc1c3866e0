"""Benchmarks run by ``captioner bench``; they time, they do not test.

What they share: the option types that refuse a bad value (an unknown name, a device the
machine lacks) while the options are parsed, so that no benchmark starts, or runs for minutes,
before it fails on one of its own options; and ``--markdown FILE``, which writes a benchmark's
table as markdown under one line naming the machine, the library versions and the date (the
tables of docs/benchmarks.md, which ``captioner bench page`` regenerates).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
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
    ``check_output_dir`` of :mod:`data_prep.paths`) refuses the output ``path`` (None: not
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
    :func:`captioner.inference.pipeline.resolve_device` accepts it (cpu, cuda, cuda:N, present on
    this
    machine); its refusal becomes the usage error, which names the value."""
    from captioner.inference.pipeline import resolve_device

    try:
        return resolve_device(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_markdown_argument(parser: argparse.ArgumentParser) -> None:
    """``--markdown FILE``: the table also as markdown (see :func:`write_markdown`)."""
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the table as markdown to FILE, under a line naming "
                        "the machine, the library versions and the date (checked before "
                        "anything is timed)")


def cpu_name() -> str:
    """The CPU's model name as Linux gives it (``/proc/cpuinfo``), else as Python's platform
    module does."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _versions() -> str:
    """Python and the libraries whose code a benchmark times, with their versions."""
    from importlib.metadata import PackageNotFoundError, version

    found = [f"Python {platform.python_version()}"]
    for package in ("torch", "numba", "lightning", "triton"):
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            continue
    return ", ".join(found)


def machine_line(device) -> str:
    """One line naming the machine (the CPU model and the CPUs this process may use, the GPU
    where ``device``, a torch device, is one), the library versions and today's date (UTC)."""
    import torch

    from data_prep.machine import usable_cpus

    gpu = (f"GPU {torch.cuda.get_device_name(device)}" if device.type == "cuda"
           else "no GPU used")
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    return (f"Machine: {cpu_name()}, {usable_cpus()} CPUs, {gpu}. {_versions()}. "
            f"Date: {today}.")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]],
                   text_columns: int = 1) -> str:
    """A markdown table of string cells; the first ``text_columns`` columns are left-aligned,
    the others (figures) right-aligned."""
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    rule = ["---" if i < text_columns else "---:" for i in range(len(header))]
    return "\n".join([line(header), line(rule), *map(line, rows)])


def write_markdown(path: Path | None, device, settings: str, table: str,
                   notes: Sequence[str] = ()) -> None:
    """Write (atomically) a benchmark's ``table`` (markdown) to ``path`` (None: nothing), under
    the :func:`machine_line` of ``device`` and the line ``settings``, with ``notes`` below,
    one paragraph each."""
    if path is None:
        return
    from data_prep.atomic import atomic_write

    parts = [machine_line(device), settings, table, *notes]
    with atomic_write(path) as file:
        file.write("\n\n".join(parts) + "\n")
