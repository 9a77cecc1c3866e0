"""Benchmarks run by ``captioner bench``; they time, they do not test.

Each module holds one: ``benchmark``, the function that runs it (its parameters are the
command's options, its docstring their help; it prints its table and returns the exit status),
and ``check_options``, which takes the same options and raises ValueError naming the first
that cannot run (an unknown name, a value out of range, a device the machine lacks, an output
that cannot be written), so that no benchmark starts, or runs for minutes, before it fails on
one of its own options. What they share: those checks, and ``markdown``, which writes a
benchmark's table as markdown under one line naming the machine, the library versions and the
date (the tables of docs/benchmarks.md, which ``captioner bench page`` regenerates).
"""

from __future__ import annotations

import datetime
import importlib
import math
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


# The largest seed torch.Generator.manual_seed takes (a C long long).
TORCH_MAX_SEED = 2**63 - 1


def refuse_below(option: str, value: float | None, low: float) -> None:
    """ValueError ``argument --OPTION: must be >= LOW, got VALUE`` for a ``value`` below
    ``low`` (a float one also when it is not finite); None (not given) passes."""
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value) or value < low:
        finite = "a finite number " if isinstance(value, float) else ""
        shown = f"{value:g}" if isinstance(value, float) else value
        raise ValueError(f"argument --{option}: must be {finite}>= {low}, got {shown}")


def refuse_unknown(option: str, value: str, choices: Sequence[str]) -> None:
    """ValueError ``argument --OPTION: invalid choice: 'V' (choose from ...)`` for a
    ``value`` that is not one of ``choices``."""
    if value not in choices:
        listed = ", ".join(repr(choice) for choice in choices)
        raise ValueError(f"argument --{option}: invalid choice: {value!r} (choose from {listed})")


def refuse_bad_seed(seed: int) -> None:
    """ValueError for a seed that torch's generators do not take (0 to TORCH_MAX_SEED)."""
    if not 0 <= seed <= TORCH_MAX_SEED:
        raise ValueError(f"argument --seed: must be between 0 and {TORCH_MAX_SEED}, got {seed}")


def refuse_unwritable(option: str, path: Path | None, check: Callable[[Path], object]) -> None:
    """ValueError ``OPTION PATH: reason`` when ``check(path)`` (``check_output_file`` or
    ``check_output_dir`` of :mod:`data_prep.paths`) refuses the output ``path`` (None: not
    given): checked before the benchmark runs, so that its results are not lost to it."""
    if path is not None:
        try:
            check(path)
        except ValueError as exc:
            raise ValueError(f"{option} {exc}") from None


def refuse_more_threads_than_numba_has(threads: int | None) -> None:
    """ValueError when ``threads`` is more than numba's pool, which numba starts at the CPU
    count (or NUMBA_NUM_THREADS) and cannot grow: it would stop inside the benchmark. None
    (not given) passes."""
    refuse_below("threads", threads, 1)
    import numba

    if threads is not None and threads > numba.config.NUMBA_NUM_THREADS:
        raise ValueError(f"argument --threads: must be <= {numba.config.NUMBA_NUM_THREADS} "
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
    """The torch device ``name`` as :func:`captioner.inference.pipeline.resolve_device`
    accepts it (cpu, cuda, cuda:N, present on this machine); its refusal, a ValueError, names
    the option: ``argument --device: ...``."""
    from captioner.inference.pipeline import resolve_device

    try:
        return resolve_device(name)
    except ValueError as exc:
        raise ValueError(f"argument --device: {exc}") from None


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
