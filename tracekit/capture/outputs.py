"""A capture's output folder: what a capture writes there (`existing_outputs`), refusing to mix runs
(`check_out_dir`), clearing the previous outputs (`prepare_out_dir`, `clear_outputs`), and the
command line and free port a capture records and uses.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import sys
from pathlib import Path

from tracekit.capture import environment as env
from tracekit.capture.config import CaptureConfig
from tracekit.errors import CaptureError


def rank_command(config: CaptureConfig) -> str:
    return config.command or "tracekit " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: what a capture writes in its folder (and clears there first): `--force` is needed to replace them
_OUTPUT_GLOBS = ("manifest.json", "rank-*.pt.trace.json.gz", "nsys.nsys-rep", "nsys.sqlite", "nsys.qdstrm")


def existing_outputs(out_dir: Path) -> list[str]:
    """Names in `out_dir` that a capture would replace (an earlier capture's manifest and traces)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    return sorted({p.name for g in _OUTPUT_GLOBS for p in out_dir.glob(g)})


def check_out_dir(out_dir: Path, force: bool) -> None:
    """CaptureError (one line) when `out_dir` is a file, or holds an earlier capture's files and
    `force` is false: nothing already there is replaced without `--force`."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise CaptureError(f"-o/--output {out_dir}: exists and is not a folder")
    found = existing_outputs(out_dir)
    if found and not force:
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        raise CaptureError(
            f"-o/--output {out_dir} already holds {shown} from an earlier capture: pass --force to replace "
            "them, or choose another folder"
        )


def prepare_out_dir(out_dir: Path) -> None:
    """Create `out_dir` and make sure it can be written; CaptureError (one line) when not."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".tracekit-write-test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CaptureError(f"-o/--output {out_dir}: cannot write there ({exc.strerror or exc})") from None


def clear_outputs(out_dir: Path) -> None:
    for p in list(out_dir.glob(".rank-*.result.json")) + list(out_dir.glob("rank-*.pt.trace.json.gz")):
        p.unlink()
    with contextlib.suppress(FileNotFoundError):
        (out_dir / env.MANIFEST_NAME).unlink()
