"""The SHA-256 of a file, as a manifest records it (capture) and checks it (read_run): a module of
its own so that a capture rank computes it without importing the readers (pandas)."""

from __future__ import annotations

import hashlib
import os


def sha256_of(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes (hex), read in 1 MiB blocks: the digest a manifest records
    for each file (capture) and checks when it is read (read_run)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
