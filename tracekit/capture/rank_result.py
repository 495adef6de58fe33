"""A rank's result file (`.rank-<r>.result.json`): what one rank of a capture (or one
`tracekit.profile()` block of a user's script) measured, written by the rank as it goes
(`write_result`: merged into the file, atomically) and decoded once by the runner (`read_results`)
into `RankResult`, the one Struct the manifest is assembled from (`tracekit.capture.manifest`).

Its calibration, trace file and devices are the manifest's own Structs, copied into the manifest
as they are. A result file that is not JSON or not of this shape is refused naming its path and
field: its rank gets that error in the manifest.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import msgspec
from msgspec import UNSET, UnsetType

from tracekit.capture.environment import atomic_write_bytes, result_name
from tracekit.model.documents.manifest import ManifestCalibration, ManifestDevice, ManifestFilesValue


class RankError(msgspec.Struct, kw_only=True):
    """Why the rank failed: the message the manifest gives, and the traceback (the file's only)."""

    message: str
    traceback: str | UnsetType = UNSET


class RankResult(msgspec.Struct, kw_only=True):
    """One rank's result file; a field the rank has not written (yet) is UNSET and absent."""

    rank: int
    error: RankError | UnsetType = UNSET
    device: str | UnsetType = UNSET
    nvtx: str | None | UnsetType = UNSET
    pid: int | UnsetType = UNSET
    inject_sync_count: int | UnsetType = UNSET
    nccl_env: dict[str, str] | UnsetType = UNSET
    profiler_calibration: ManifestCalibration | None | UnsetType = UNSET
    unprofiled_ns: list[int] | UnsetType = UNSET
    unprofiled_rounds_ns: list[list[int]] | UnsetType = UNSET
    pass_order: str | UnsetType = UNSET
    profiled_ns: list[int] | UnsetType = UNSET
    profiled_rounds_ns: list[list[int]] | UnsetType = UNSET
    traced_round: int | UnsetType = UNSET
    mode: str | UnsetType = UNSET
    trace: str | None | UnsetType = UNSET
    file: ManifestFilesValue | None | UnsetType = UNSET
    marker_steps: int | UnsetType = UNSET
    profiler_env: dict[str, str] | UnsetType = UNSET
    tokens_generated: list[list[int]] | None | UnsetType = UNSET
    versions: dict[str, str | None] | UnsetType = UNSET
    devices: list[ManifestDevice] | UnsetType = UNSET
    #: all the rank's files written: the parent may end a rank stuck in teardown
    finished: bool | UnsetType = UNSET

    def update(self, other: RankResult) -> None:
        """Every field `other` sets (not UNSET), set here too (in place)."""
        for name in self.__struct_fields__:
            value = getattr(other, name)
            if value is not UNSET:
                setattr(self, name, value)


class DamagedResult(ValueError):
    """A result file that is not JSON or not a `RankResult`: its path and where it does not fit."""


def decode_result(path: Path) -> RankResult:
    """The result file at `path`; DamagedResult naming the path (and the field) when it is not one."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=RankResult)
    except msgspec.ValidationError as exc:
        raise DamagedResult(f"{path}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise DamagedResult(f"{path}: not valid JSON ({exc})") from None


def write_result(out_dir: Path, result: RankResult) -> None:
    """Merge `result`'s set fields into out_dir/.rank-<r>.result.json (atomically); a file there
    that cannot be read back is replaced."""
    path = Path(out_dir) / result_name(result.rank)
    doc = RankResult(rank=result.rank)
    if path.exists():
        with contextlib.suppress(DamagedResult, OSError):
            doc = decode_result(path)
    doc.update(result)
    atomic_write_bytes(path, msgspec.json.format(msgspec.json.encode(doc), indent=1) + b"\n")


def read_results(out_dir: Path) -> dict[int, RankResult]:
    """Every rank's result file in out_dir, by rank. A damaged one (not JSON, a field of the wrong
    type) is its rank's error, naming the file and the field, so the manifest says why the rank
    has no result."""
    out: dict[int, RankResult] = {}
    for p in sorted(Path(out_dir).glob(".rank-*.result.json")):
        try:
            rank = int(p.name.removeprefix(".rank-").removesuffix(".result.json"))
        except ValueError:
            continue  # not a rank's file
        try:
            res = decode_result(p)
        except OSError:
            continue
        except DamagedResult as exc:
            res = RankResult(rank=rank, error=RankError(message=f"its result file is damaged ({exc})"))
        out[res.rank] = res
    return out
