"""The what-if's knobs (`tracekit.analyse.whatif`; the package doc says what each does): their
names and definitions, a knob parsed from its spec, the probe's measured transfer times
(`ProbeTimes`, `load_probe`), and the replay setting a combination asks for (`setting_for`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from tracekit.analyse.collectives.bandwidth import bus_factor
from tracekit.analyse.retime.model import RunModel
from tracekit.analyse.retime.setting import Setting
from tracekit.errors import TracekitError, load_json_file

#: The knob names, in report order.
KNOB_NAMES: tuple[str, ...] = (
    "transfer",
    "launch",
    "sync",
    "straggler",
    "compute",
    "collective_latency",
    "allreduce_norm",
)
#: The knobs whose Shapley values split S when none are given.
DEFAULT_KNOBS: tuple[str, ...] = ("transfer=0", "launch=0", "sync=0", "straggler=off", "compute=/N")
#: One line per knob: the transformation it applies (JSON `knobs[].definition`).
KNOB_DEFINITIONS: dict[str, str] = {
    "transfer=0": "every collective ends when its last rank arrives (infinitely fast link)",
    "transfer=probe": "every collective's transfer takes the probe's measured time for its op and size",
    "launch=0": "no host launch overhead (CUDA graphs): host gaps and launch calls take no time; the device "
    "runs back to back with its typical queued gap",
    "sync=0": "synchronisation calls return at once",
    "straggler=off": "per segment between collectives, every rank's host gaps scaled to the fastest rank's",
    "compute=/N": "every compute operation scaled so each rank's compute per token is the baseline's / N",
    "collective_latency=US": "every collective's transfer is the lesser of its own and US us + size x bus "
    "factor / bus bandwidth (a one-shot custom all-reduce where it is faster)",
    "allreduce_norm=fused": "the vector kernels between each all-reduce and the next matrix kernel (the "
    "residual add and norm) take no device time (a fused all-reduce + norm kernel); launches and gaps stay",
}
#: Replays at most 2^MAX_SHAPLEY_KNOBS combinations.
MAX_SHAPLEY_KNOBS = 6


class ReplayError(TracekitError):
    """A knob or probe file that cannot be applied."""


@dataclass(frozen=True)
class ProbeTimes:
    """Per op, the probe's (bytes, time ns) rows, sorted by bytes."""

    path: str
    mode: str | None
    rows: Mapping[str, tuple[tuple[int, float], ...]]

    def best_algbw(self, op: str) -> float:
        """The highest algorithm bandwidth (bytes/ns = GB/s) among `op`'s rows, else among all rows."""
        pts = self.rows.get(op) or tuple(p for rows in self.rows.values() for p in rows)
        return max(b / t for b, t in pts if t > 0)

    def time_ns(self, op: str, size: int) -> float | None:
        """The probe's time (ns) for `op` at `size` bytes, log-log interpolated; None: no rows for `op`."""
        pts = self.rows.get(op)
        if not pts or size <= 0:
            return None
        xs = np.log([max(b, 1) for b, _ in pts])
        ys = np.log([max(t, 1e-3) for _, t in pts])
        return float(np.exp(np.interp(math.log(size), xs, ys)))


def load_probe(text: str) -> ProbeTimes:
    """`FILE[@MODE]`: the rows of a `tracekit probe` JSON (a list of rows) or a `compare-links` JSON
    (`rows[]`); each row: op, bytes, time_us, mode, in_place."""
    path, _, mode = text.partition("@")
    doc = load_json_file(path, "probe JSON", ReplayError)
    # `compare-links` JSON: an object with rows[]; `tracekit probe --format json`: the bare list of rows
    rows = doc.get("rows") if isinstance(doc, Mapping) else doc if isinstance(doc, list) else None
    if not isinstance(rows, list) or not rows:
        raise ReplayError(f"{path}: no probe rows (expected the JSON of `tracekit probe` or `compare-links`)")
    modes = [r.get("mode") for r in rows if isinstance(r, Mapping)]
    chosen = mode or next((m for m in modes if m), None)
    if mode and mode not in modes:
        raise ReplayError(
            f"{path}: no rows of mode {mode!r} (modes: {', '.join(sorted({str(m) for m in modes}))})"
        )
    table: dict[str, dict[int, list[tuple[bool, float]]]] = {}
    for r in rows:
        if not isinstance(r, Mapping) or (chosen and r.get("mode") not in (chosen, None)):
            continue
        op, b, t = r.get("op"), r.get("bytes"), r.get("time_us")
        if not isinstance(op, str) or not isinstance(b, int) or not isinstance(t, int | float):
            continue
        table.setdefault(op, {}).setdefault(b, []).append((bool(r.get("in_place")), float(t) * 1000.0))
    out: dict[str, tuple[tuple[int, float], ...]] = {}
    for op, by_size in table.items():
        pts = []
        for b, vals in sorted(by_size.items()):
            inplace = [t for ip, t in vals if ip]
            pts.append((b, min(inplace or [t for _, t in vals])))
        out[op] = tuple(pts)
    if not out:
        raise ReplayError(f"{path}: no usable rows (op, bytes, time_us)")
    return ProbeTimes(path, chosen, out)


@dataclass(frozen=True)
class Knob:
    """One knob: `name` in KNOB_NAMES, `value` as written (`0`, `probe:FILE`, `off`, `/N`)."""

    name: str
    value: str
    probe: ProbeTimes | None = None
    latency_ns: float | None = None  # collective_latency: the fixed part of every transfer
    busbw_gbps: float | None = None  # collective_latency: the bus bandwidth (else the probe's)

    @property
    def spec(self) -> str:
        return f"{self.name}={self.value}"

    @property
    def definition(self) -> str:
        if self.name == "collective_latency":
            bw = (
                f"{self.busbw_gbps:g} GB/s"
                if self.busbw_gbps is not None
                else f"the best algorithm bandwidth of the op in {self.probe.path if self.probe else '?'}"
            )
            return (
                f"every collective's transfer is the lesser of its own and "
                f"{self.latency_ns / 1e3 if self.latency_ns else 0:g} us + size x bus factor / bus bandwidth "
                f"({bw}): a one-shot custom all-reduce where it is faster"
            )
        key = "transfer=probe" if self.probe is not None else self.spec
        return KNOB_DEFINITIONS[key]

    def transfer_ns(self, op: str, size: int, n_ranks: int) -> float:
        """collective_latency: one collective's transfer (ns) for its op, nccl-tests size and ranks."""
        lat = float(self.latency_ns or 0.0)
        if size <= 0:
            return lat
        if self.busbw_gbps is not None:
            try:
                factor = bus_factor(op, max(n_ranks, 1))
            except ValueError:
                factor = 1.0
            return lat + size * factor / self.busbw_gbps  # bytes / (GB/s) = ns
        assert self.probe is not None
        return lat + size / self.probe.best_algbw(op)


def parse_knob(text: str, probe: str | None = None) -> Knob:
    """One knob from its spec (see the module doc); `probe` is --probe's FILE for `transfer=probe`."""
    name, eq, value = text.strip().partition("=")
    name, value = name.strip(), value.strip()
    if not eq or name not in KNOB_NAMES:
        raise ReplayError(
            f"unknown knob {text!r}; knobs: transfer=0, transfer=probe:FILE, launch=0, sync=0, straggler=off, "
            "compute=/N, collective_latency=US[@GBPS], allreduce_norm=fused"
        )
    if name == "transfer" and value.startswith("probe"):
        src = value[len("probe") :].lstrip(":") or (probe or "")
        if not src:
            raise ReplayError("transfer=probe needs a file: transfer=probe:FILE or --probe FILE")
        return Knob("transfer", f"probe:{src}", load_probe(src))
    if name == "collective_latency":
        return collective_latency_knob(text, value, probe)
    allowed = {
        "transfer": "0",
        "launch": "0",
        "sync": "0",
        "straggler": "off",
        "compute": "/N",
        "allreduce_norm": "fused",
    }
    if value != allowed[name]:
        raise ReplayError(f"knob {name} takes {name}={allowed[name]}, got {text!r}")
    return Knob(name, value)


def collective_latency_knob(text: str, value: str, probe: str | None) -> Knob:
    """`collective_latency=US[@GBPS]`: US microseconds per collective + its bytes at GBPS bus
    bandwidth (without @GBPS: the --probe JSON's best algorithm bandwidth for the op)."""
    us_text, at, bw_text = value.partition("@")
    try:
        us = float(us_text)
        bw = float(bw_text) if at else None
    except ValueError:
        raise ReplayError(
            f"knob {text!r}: collective_latency=US or US@GBPS (microseconds, bus GB/s), e.g. "
            "collective_latency=5@400"
        ) from None
    if not math.isfinite(us) or us < 0 or (bw is not None and (not math.isfinite(bw) or bw <= 0)):
        raise ReplayError(f"knob {text!r}: the latency must be >= 0 us and the bandwidth > 0 GB/s")
    if bw is None and not probe:
        raise ReplayError(
            f"knob {text!r} needs a bandwidth for the bytes: collective_latency={us_text}@GBPS (bus GB/s) "
            "or --probe FILE (a `tracekit probe` / `compare-links` JSON)"
        )
    return Knob(
        "collective_latency",
        value,
        probe=load_probe(probe) if bw is None and probe else None,
        latency_ns=us * 1000.0,
        busbw_gbps=bw,
    )


def parse_combination(text: str, probe: str | None = None) -> tuple[Knob, ...]:
    """A combination `k1,k2,...` (each knob once)."""
    knobs = tuple(parse_knob(t, probe) for t in text.split(",") if t.strip())
    names = [k.name for k in knobs]
    if len(set(names)) != len(names):
        raise ReplayError(f"a combination names a knob twice: {text!r}")
    return tuple(sorted(knobs, key=lambda k: KNOB_NAMES.index(k.name)))


def combination_spec(knobs: Iterable[Knob]) -> str:
    """The combination's spec, its knobs in KNOB_NAMES order ("none": no knob)."""
    ks = sorted(knobs, key=lambda k: KNOB_NAMES.index(k.name))
    return ",".join(k.spec for k in ks) or "none"


def setting_for(
    model: RunModel, knobs: Iterable[Knob], baseline_compute: float | None, n_ranks: int
) -> Setting:
    """The re-timing `knobs` ask for on `model` (those that apply to it), at its profiler correction;
    `compute=/N` scales to `baseline_compute` / `n_ranks`."""
    base = model.corrected()
    transfer: str | ProbeTimes | None = None
    launch0, sync0, straggler_off, fuse_norm = base.launch0, base.sync0, base.straggler_off, base.fuse_norm
    coll_latency, compute_scale = base.coll_latency, base.compute_scale
    for k in knobs:
        if not model.applicable(k):
            continue
        if k.name == "transfer":
            transfer = k.probe if k.probe is not None else "zero"
        elif k.name == "launch":
            launch0 = True
        elif k.name == "sync":
            sync0 = True
        elif k.name == "straggler":
            straggler_off = True
        elif k.name == "collective_latency":
            coll_latency = k
        elif k.name == "allreduce_norm":
            fuse_norm = True
        elif k.name == "compute" and baseline_compute is not None:
            mean_c = (
                float(np.mean(list(model.compute_per_token.values()))) if model.compute_per_token else 0.0
            )
            compute_scale = (baseline_compute / n_ranks) / mean_c if mean_c > 0 else 1.0
    return dataclasses.replace(
        base,
        transfer=transfer,
        launch0=launch0,
        sync0=sync0,
        straggler_off=straggler_off,
        coll_latency=coll_latency,
        fuse_norm=fuse_norm,
        compute_scale=compute_scale,
    )
