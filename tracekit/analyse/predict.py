"""TP=N per-token time predicted from one rank's shard measured alone, plus the link's cost of the
collectives the shard skipped (docs/METHOD.md section Predicting TP=N from one rank's shard).

`tracekit capture --shard-of N` runs rank 0's shard of a TP=N reference decoder on one device with
every collective a no-op: its per-token time is the per-rank compute of TP=N (kernels and, eager,
their launches). What it lacks are the collectives: per layer two all-reduces of the hidden state,
per token one all-gather of the logits (`tp_collectives`, the decoder's shapes). The prediction is

    T_N = T_shard + sum over the collectives of (per token) x t_link(op, size)

with t_link the time a `tracekit probe` / `compare-links` JSON measured for the op at its nccl-tests
size (log-log interpolation, in-place rows first: `whatif.knobs.load_probe`). In a decode step every
collective sits on the one dependency chain (each layer's output feeds the next), so nothing hides
it: added, not overlapped. What the sum leaves out is coordination: ranks that arrive at a
collective at different times (launch skew, a slow rank) wait, and the prediction has no second
rank to wait for. On a host-bound eager run the device idles between launches and part of a
collective's time can fall in that idle: there the sum is an upper end.

Probe and run at different rank counts P != N: `flat` takes the probe's P-rank time for the same
size (small collectives on NVSwitch cost a fixed launch and synchronisation, nearly independent of
P); `ring` multiplies it by (N - 1) / (P - 1), the ratio of a ring's steps, as if every step cost
what one step cost at P ranks (the upper end). Both are given; the point prediction is `flat`.
It stays a prediction until a machine with N devices measures TP=N (`--check`).

No torch here (the collectives' shapes are computed from the manifest's model shape).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tracekit.analyse.ab import ab_document
from tracekit.analyse.collectives.bandwidth import nccl_tests_size
from tracekit.analyse.whatif.knobs import ProbeTimes, load_probe
from tracekit.errors import TracekitError
from tracekit.model.documents.base import given
from tracekit.model.documents.manifest import Manifest
from tracekit.model.documents.predict import (
    Predict,
    PredictCheck,
    PredictCollective,
    Prediction,
    PredictProbe,
    PredictShard,
    PredictTotal,
    PredictTransfer,
)
from tracekit.model.dtypes import sizes_of
from tracekit.read import load_manifest

SCHEMA_VERSION = "1.0"
#: the model dtypes the prediction knows, and their sizes (`model.dtypes`)
DTYPE_BYTES: dict[str, int] = sizes_of("float32", "bfloat16", "float16")
SCALINGS: tuple[str, ...] = ("flat", "ring")


class PredictError(TracekitError):
    """A shard run or probe that cannot give a prediction."""


def tp_collectives(shape: Mapping[str, Any], tp: int, batch: int, dtype: str) -> list[dict[str, int | str]]:
    """The collectives of one decode step on each rank of the reference decoder at TP=`tp`, from its
    shapes: per layer the row-parallel o_proj and down_proj outputs [batch, hidden] in the model dtype
    all-reduced in place; per step the vocabulary-parallel logits [batch, vocab/tp], float32, all-
    gathered. Sizes per rank as the collective call sees them. Empty at tp=1."""
    if tp <= 1:
        return []
    if dtype not in DTYPE_BYTES:
        raise PredictError(f"no byte size known for dtype {dtype!r}")
    ar_bytes = batch * int(shape["hidden"]) * DTYPE_BYTES[dtype]
    gather_in = batch * (int(shape["vocab"]) // tp) * DTYPE_BYTES["float32"]
    return [
        {
            "op": "all_reduce",
            "name": name,
            "in_bytes": ar_bytes,
            "out_bytes": ar_bytes,
            "dtype": dtype,
            "per_token": int(shape["layers"]),
            "group_size": tp,
        }
        for name in ("o_proj", "down_proj")
    ] + [
        {
            "op": "all_gather",
            "name": "lm_head",
            "in_bytes": gather_in,
            "out_bytes": gather_in * tp,
            "dtype": "float32",
            "per_token": 1,
            "group_size": tp,
        }
    ]


def _manifest(run_dir: str) -> Manifest:
    p = Path(run_dir)
    path = p / "manifest.json" if p.is_dir() else p
    return load_manifest(path)


def _rounds(m: Manifest, where: str) -> list[list[int]]:
    """Per round, the per-token times (slowest rank per token) of the manifest's unprofiled pass."""
    up = given(m.unprofiled)
    rounds = given(up.rounds) if up is not None else None
    if not rounds:
        per = given(up.per_token_ns) if up is not None else None
        rounds = [per] if per else None
    if not rounds:
        raise PredictError(f"{where}: no unprofiled per-token times (manifest unprofiled.rounds)")
    out = []
    for k, r in enumerate(rounds):
        if not r:
            raise PredictError(f"{where} at unprofiled.rounds[{k}]: expected per-rank lists of ns")
        lists = [v for v in r.values() if v]
        if len(lists) != len(r) or len({len(v) for v in lists}) != 1:
            raise PredictError(
                f"{where} at unprofiled.rounds[{k}]: per-rank lists of ns of one length expected"
            )
        out.append([max(col) for col in zip(*lists, strict=True)])
    return out


def _spec_rows(spec: str) -> list[Mapping[str, Any]]:
    """The row objects of the probe file a `--probe FILE[@MODE]` spec names ([] when it cannot be
    read: what its rows would say is then unknown)."""
    try:
        doc = json.loads(Path(spec.partition("@")[0]).read_text())
    except (OSError, ValueError):
        return []
    rows = doc.get("rows") if isinstance(doc, Mapping) else doc
    return [r for r in rows if isinstance(r, Mapping)] if isinstance(rows, list) else []


def _probe_ranks(spec: str) -> int | None:
    ranks = {r.get("ranks") for r in _spec_rows(spec) if isinstance(r.get("ranks"), int)}
    return ranks.pop() if len(ranks) == 1 else None


def _graph_timed(spec: str) -> bool | None:
    flags = {bool(r.get("graph")) for r in _spec_rows(spec)}
    return flags.pop() if len(flags) == 1 else None


def predict_shard(
    shard_dir: str,
    probe_spec: str,
    *,
    probe: ProbeTimes | None = None,
    probe_ranks: int | None = None,
) -> Prediction:
    """The TP=N prediction of one `--shard-of N` capture (see the module doc)."""
    m = _manifest(shard_dir)
    wl = given(m.workload)
    n = given(wl.shard_of) if wl is not None else None
    if wl is None or n is None or n < 2:
        raise PredictError(
            f"{shard_dir}: not a shard run (manifest workload.shard_of): capture one with "
            "`tracekit capture --shard-of N`"
        )
    sh = given(wl.shape)
    dims = {k: given(getattr(sh, k)) if sh is not None else None for k in ("hidden", "vocab", "layers")}
    shape = {k: v for k, v in dims.items() if v is not None}
    if len(shape) != len(dims):
        raise PredictError(f"{shard_dir}: manifest workload.shape lacks hidden, vocab or layers")
    batch = given(wl.batch)
    batch = 1 if batch is None else batch
    dtype = given(wl.dtype)
    dtype = "bfloat16" if dtype is None else dtype
    probe = probe or load_probe(probe_spec)
    p = probe_ranks if probe_ranks is not None else _probe_ranks(probe_spec)
    rounds = _rounds(m, shard_dir)
    shard = ab_document({"shard": rounds}, baseline="shard").arms["shard"]
    colls = []
    flat_total = ring_total = 0.0
    factor = 1.0 if p is None or p == n or p < 2 else (n - 1) / (p - 1)
    for c in tp_collectives(shape, n, batch, dtype):
        op = str(c["op"])
        size = nccl_tests_size(op, int(c["in_bytes"]), int(c["out_bytes"]))
        t = probe.time_ns(op, size)
        if t is None:
            raise PredictError(f"{probe.path}: no {op} rows to time the shard's {c['name']} ({size} B)")
        per = int(c["per_token"])
        flat_total += per * t
        ring_total += per * t * factor
        colls.append(
            PredictCollective(
                op=op,
                name=str(c["name"]),
                size_bytes=size,
                per_token=per,
                time_ns_each=round(t),
                time_ns_each_ring=round(t * factor),
                per_token_ns=round(per * t),
            )
        )
    t_shard = shard.mean_ns
    lo, hi = shard.interval_ns
    flat, ring = round(flat_total), round(ring_total)
    return Prediction(
        tp=n,
        shard=PredictShard(
            run=str(shard_dir),
            per_token_ns=t_shard,
            interval_ns=[lo, hi],
            rounds=len(rounds),
            source="unprofiled per-token time (manifest), mean over rounds; interval: the rounds' bootstrap",
            cuda_graphs=bool(given(wl.cuda_graphs)) or bool(given(wl.compile)),
            decoder_impl=wl.decoder_impl if isinstance(wl.decoder_impl, str) else "legacy",
        ),
        collectives=colls,
        transfer_ns=PredictTransfer(flat=flat, ring=ring),
        predicted_ns=PredictTotal(
            flat=t_shard + flat, ring=t_shard + ring, flat_interval=[lo + flat, hi + flat]
        ),
        probe_ranks=p,
        ring_factor=factor,
    )


def predict(
    shards: Sequence[str], probe_spec: str, *, checks: Sequence[str] = (), probe_ranks: int | None = None
) -> Predict:
    """`tracekit predict`: one prediction per shard run; `checks`: real TP=N runs, each compared with
    the prediction of its TP degree."""
    if not shards:
        raise PredictError("no shard run given (--shard RUN, a `tracekit capture --shard-of N` run)")
    probe = load_probe(probe_spec)
    p = probe_ranks if probe_ranks is not None else _probe_ranks(probe_spec)
    rows = [predict_shard(s, probe_spec, probe=probe, probe_ranks=p) for s in shards]
    by_tp = {r.tp: r for r in rows}
    for c in checks:
        m = _manifest(c)
        check_wl = given(m.workload)
        tp = given(check_wl.tp) if check_wl is not None else None
        shard_of = given(check_wl.shard_of) if check_wl is not None else None
        if shard_of is not None or tp is None or tp not in by_tp:
            raise PredictError(
                f"{c}: --check wants a real TP=N run of a degree a --shard predicts "
                f"({', '.join(str(t) for t in sorted(by_tp))}); its workload says tp={tp!r}"
            )
        rounds = _rounds(m, c)
        flat = [t for r in rounds for t in r]
        measured = round(sum(flat) / len(flat))
        row = by_tp[tp]
        row.check = PredictCheck(
            run=str(c),
            measured_ns=measured,
            error=row.predicted_ns.flat / measured - 1.0,
            error_ring=row.predicted_ns.ring / measured - 1.0,
            residual_ns=measured - row.predicted_ns.flat,
        )
    return Predict(
        schema_version=SCHEMA_VERSION,
        kind="tracekit.predict",
        definition="T_N = T_shard (one rank's shard alone, unprofiled) + sum over the collectives it skipped "
        "of per_token x probe time at their size; flat: the probe's rank count's time, ring: times (N-1)/(P-1); "
        "docs/METHOD.md section Predicting TP=N from one rank's shard",
        probe=PredictProbe(path=probe.path, mode=probe.mode, ranks=p, graph_timed=_graph_timed(probe_spec)),
        predictions=sorted(rows, key=lambda r: r.tp),
        caveat="a prediction, not a measurement, until a machine with N devices runs TP=N; it leaves out "
        "coordination (ranks waiting for each other at the collectives)",
    )


__all__ = ["PredictError", "predict", "predict_shard", "tp_collectives"]
