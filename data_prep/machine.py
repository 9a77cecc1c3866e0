"""What this process may use of the machine it runs on."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity, where the system tells it (Linux), else
    the machine's CPU count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes of memory this machine can still give: on Linux, MemAvailable of /proc/meminfo
    (free pages and reclaimable caches); None where it is not known."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
