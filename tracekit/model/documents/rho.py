"""The `Rho` document: tracekit rho --format json (docs/JSON.md#rho)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc


class RhoDevice(Doc, kw_only=True):
    type: str
    name: str
    capability: str | UnsetType = UNSET
    multiprocessors: int | UnsetType = UNSET
    threads: int | UnsetType = UNSET
    torch: str
    cuda: str | UnsetType = UNSET


class RhoMatrixItem(Doc, kw_only=True):
    kind: str
    dtype: str
    method: str
    shape: str
    operations: int
    tops: float
    tops_max: float
    iterations: int
    repeats: int
    datasheet_tops: float | None
    anchor_tops: float | None
    skipped: str | None


class RhoRhoItem(Doc, kw_only=True):
    dtype: str
    rho: float
    datasheet_rho: float | None
    anchor_rho: float | None


class Rho(Doc, kw_only=True):
    schema_version: str
    kind: str
    device: RhoDevice
    matrix: list[RhoMatrixItem]
    vector: list[RhoMatrixItem]
    rho: list[RhoRhoItem]
    notes: list[str]
