"""A write that the disk, a quota or the file size limit (``ulimit -f``) stops: refused before it
starts where its size is known, else reported in one line naming the folder and what was kept."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

# The errors of a write that the disk, a quota or the file size limit (ulimit -f) stopped.
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def disk_full(number: int, path: Path, written: int | None) -> OSError:
    """The error of a write of ``path`` that ``number`` (one of :data:`DISK_FULL`) stopped
    after ``written`` bytes, naming the folder and saying what was kept: one line."""
    reason = {errno.EFBIG: "the file size limit (ulimit -f) was reached",
              errno.EDQUOT: "the disk quota is used up"}.get(number, "no space left on device")
    so_far = "" if written is None else f" after {megabytes(written)} of {path.name}"
    kept = (f"the previous {path.name} is kept" if path.exists()
            else f"{path.name} was not written")
    advice = ("raise the limit and run again" if number == errno.EFBIG
              else "free space there and run again")
    return OSError(number, f"{reason}{so_far}; {kept}; {advice}", str(path.parent))


def check_room(folder: Path, needed: int, largest_file: int, what: str) -> None:
    """Refuse, before a long write into ``folder``, one that cannot fit: ``needed`` more bytes
    than the file system has free there, or a file of ``largest_file`` bytes past the file size
    limit (``ulimit -f``). HDF5 does not survive a write that fails midway (h5py ends in a
    segmentation fault), so a cache must not start one. ``what`` names it in the message.

    Raises:
        OSError: ENOSPC or EFBIG, one line naming ``folder``, the size needed and the room.
    """
    import resource

    free = shutil.disk_usage(folder).free
    if needed > free:
        raise OSError(errno.ENOSPC, f"{what} needs about {megabytes(needed)} more, and "
                      f"{megabytes(free)} are free; free space there and run again",
                      str(folder))
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit != resource.RLIM_INFINITY and largest_file > limit:
        raise OSError(errno.EFBIG, f"{what} grows to about {megabytes(largest_file)}, past "
                      f"the file size limit (ulimit -f) of {megabytes(limit)}; raise the "
                      "limit and run again", str(folder))


def megabytes(count: int) -> str:
    return f"{count / 1e6:,.1f} MB"
