"""Content hashes of files: what a cache or a checkpoint records to know the file it was made
from, whatever its path."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of the file's bytes, in hex (read 1 MiB at a time)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
