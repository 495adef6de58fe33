"""Analysis outputs shaped exactly like docs/JSON.md (breakdown, shortfall, compare-links, manifest),
built in code with known numbers, for the report tests. Not a test module itself.

The numbers are chosen so the answers are known independently: the per-token times are
T1 = 10 ms, T2 = 7 ms, ideal T1/2 = 5 ms, so S = 2 ms = 0.4 + 0.1 + 0.3 + (0.8 + 0.2 + 0.2) ms.
Per rank (shortfall 1.5 `per_rank`), each summing to S, their mean the aggregate:
rank 0 = 0.2 + 0.1 + 0.1 + (1.4 + 0.2 + 0.0) ms, rank 1 = 0.6 + 0.1 + 0.5 + (0.2 + 0.2 + 0.4) ms.
The critical path of a 7 ms token: rank 0 2.1 ms + rank 1 4.8 ms (2.2 of it host) + offset 0.1 ms.
The dilation applied (`dilation.baseline` / `.sharded`) is 1.02 / `dilation_sharded`; the capture's
host-clock figures (`dilation.runs`, a cross-check) are deliberately different: 1.04 / +0.02.

The designed numbers are only the fields the report tests reason about. Every other field a typed
document requires (its `msgspec.Struct`, tracekit/model/documents/) is taken at call time from a real
document of the same kind (`real`: the shortfall and breakdown JSON of the committed pair
traces/cpu-tp1 / traces/cpu-tp2, analysed once per test session), so a sample always decodes into
its Struct and cannot drift from what the analysis writes: `complete`.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import msgspec

from tracekit.model import documents

REPO = Path(__file__).resolve().parents[1]
REAL_PAIR = (REPO / "traces/cpu-tp1", REPO / "traces/cpu-tp2")  # a committed pair (its manifests)

HOSTILE = "<script>alert(1)</script>"
MS = 1_000_000
PARTS = ("compute", "memory", "collective", "unknown", "sync", "idle")


@functools.cache
def real_analyses() -> Any:  # -> tracekit.report.build.AnalysedRuns
    """The report's analyses of `REAL_PAIR` (`analyse_dirs`: the TP=2 run's breakdown, the pair's
    shortfall, ...), made once per test process; read, never changed. Their documents are those
    `tracekit breakdown / shortfall --format json` print (tests/test_analysed_once.py,
    test_sharing_changes_no_figure)."""
    from tracekit.report.build import analyse_dirs

    tp1, tp2 = REAL_PAIR
    return analyse_dirs(tp2, tp1)


@functools.cache
def _real(kind: str) -> str:
    a = real_analyses()
    return json.dumps(documents.to_builtins(a.shortfall if kind == "shortfall" else a.breakdown))


def real(kind: str) -> dict[str, Any]:
    """The real `kind` document ("shortfall" or "breakdown") of the committed pair `REAL_PAIR`;
    "links": the committed two-H200 compare-links result (reports/h200/links.json, with the
    decode trace's sizes)."""
    if kind == "links":
        return json.loads((REPO / "reports/h200/links.json").read_text())  # type: ignore[no-any-return]
    return json.loads(_real(kind))


def _fill(sample: Any, real: Any, t: msgspec.inspect.Type) -> Any:
    """`sample` with every field that type `t` requires and `sample` lacks copied from `real` (the
    same place in a real document); the sample's own values are kept as they are."""
    if isinstance(t, msgspec.inspect.UnionType):
        for u in t.types:
            if isinstance(
                u, msgspec.inspect.StructType | msgspec.inspect.DictType | msgspec.inspect.ListType
            ):
                t = u
                break
        else:
            return sample
    if isinstance(t, msgspec.inspect.StructType) and isinstance(sample, dict) and isinstance(real, dict):
        out = {}
        for f in t.fields:
            if f.name in sample:
                out[f.name] = _fill(sample[f.name], real.get(f.name), f.type)
            elif f.required and f.name in real:
                out[f.name] = copy.deepcopy(real[f.name])
        return out | {k: v for k, v in sample.items() if k not in out}
    if (
        isinstance(t, msgspec.inspect.DictType)
        and isinstance(sample, dict)
        and isinstance(real, dict)
        and real
    ):
        first = next(iter(real.values()))
        return {k: _fill(v, real.get(k, first), t.value_type) for k, v in sample.items()}
    if (
        isinstance(t, msgspec.inspect.ListType)
        and isinstance(sample, list)
        and isinstance(real, list)
        and real
    ):
        return [_fill(v, real[min(i, len(real) - 1)], t.item_type) for i, v in enumerate(sample)]
    return sample


def complete(sample: dict[str, Any], kind: str) -> dict[str, Any]:
    """A designed sample of document `kind` made whole from the real document `REAL[kind]`."""
    struct = {"shortfall": documents.Shortfall, "breakdown": documents.Breakdown, "links": documents.Links}[
        kind
    ]
    return _fill(sample, real(kind), msgspec.inspect.type_info(struct))


def manifest(tp: int, dilation: float = 1.05) -> dict[str, Any]:
    return {
        "schema_version": "1.0",
        "kind": "tracekit.capture",
        "complete": True,
        "errors": [],
        "created": "2026-11-29T16:00:00Z",
        "versions": {"tracekit": "0.1.0", "python": "3.11.9", "torch": "2.13.0", "cuda": None, "nccl": None},
        "host": {"hostname": "ci-host", "cpu": "Test CPU", "cpu_count": 2},
        "devices": [],
        "topology": {"nvidia_smi_topo": None, "nvml_links": None},
        "nccl_env": {},
        "workload": {
            "preset": "tiny",
            "tp": tp,
            "tokens": 4,
            "prompt": 16,
            "batch": 1,
            "backend": "gloo",
            "device": "cpu",
            "dtype": "float32",
            "seed": 0,
            "layers": 2,
            "inject_delay": None,
            "inject_sync": False,
            "mode": "full",
            "step_pattern": "decode_step",
        },
        "unprofiled": {"per_token_ns": {str(r): [7 * MS] * 4 for r in range(tp)}},
        "profiled": {"per_token_ns": {str(r): [int(7 * MS * dilation)] * 4 for r in range(tp)}},
        "dilation": dilation,
        "tokens_generated": [[1, 2, 3, 4]],
        "files": {},
        "command": f"tracekit capture --tp {tp}",
    }


def breakdown(n_ranks: int, step_ms: float, *, kernel_name: str = "my_kernel") -> dict[str, Any]:
    steps = []
    for r in range(n_ranks):
        for s in range(4):
            parts = {
                "compute": int(step_ms * 0.5 * MS),
                "memory": int(step_ms * 0.1 * MS),
                "collective": int(step_ms * 0.2 * MS) if n_ranks > 1 else 0,
                "unknown": 1000,
                "sync": int(step_ms * 0.05 * MS),
            }
            window = int(step_ms * MS) + s * 1000
            parts["idle"] = window - sum(parts.values())
            steps.append(
                {
                    "rank": r,
                    "step": s,
                    "name": f"decode_step#{s}",
                    "start_ns": s * 20 * MS,
                    "window_ns": window,
                    "parts_ns": {p: parts[p] for p in PARTS},
                    "overlapped_collective_ns": 0,
                }
            )
    med = {p: steps[1]["parts_ns"][p] for p in PARTS}
    return complete(_breakdown(n_ranks, step_ms, steps, med, kernel_name), "breakdown")


def _breakdown(
    n_ranks: int, step_ms: float, steps: list[dict[str, Any]], med: dict[str, int], kernel_name: str
) -> dict[str, Any]:
    return {
        "schema_version": "1.0",
        "kind": "tracekit.breakdown",
        "source": {
            "paths": ["x"],
            "ranks": list(range(n_ranks)),
            "step_pattern": "decode_step",
            "timeline": "host",
        },
        "steps": steps,
        "per_token": {
            "step_ns": {
                "median": int(step_ms * MS),
                "p10": int(step_ms * MS),
                "p90": int(step_ms * MS) + 3000,
                "n": 4,
            },
            "parts_ns": {p: {"median": med[p], "p10": med[p], "p90": med[p], "mean": med[p]} for p in PARTS},
        },
        "per_rank": [
            {"rank": r, "steps": 4, "step_ns_median": int(step_ms * MS), "parts_ns_median": med}
            for r in range(n_ranks)
        ],
        "kernels_by_class": {
            "compute": {"count": 40, "total_ns": 20 * MS},
            "unknown": {"count": 4, "total_ns": 4000},
        },
        "kernels_by_subclass": {"matrix": {"count": 40, "total_ns": 20 * MS}},
        "unknown_kernels": [{"name": kernel_name, "count": 4, "total_ns": 4000}],
        "data_quality": {"counts": {}, "notes": []},
        "dilation": 1.05,
    }


def _path_rank(compute: int, memory: int, transfer: int, host: int, sync: int) -> dict[str, int]:
    row = {
        "compute_ns": compute,
        "memory_ns": memory,
        "transfer_ns": transfer,
        "host_ns": host,
        "sync_ns": sync,
    }
    row["unknown_ns"] = 0
    row["total_ns"] = sum(row.values())
    return row


def _host_clock(d: float, unprofiled_ns: int) -> dict[str, Any]:
    return {
        "dilation": d,
        "definition": "mean profiled / mean unprofiled per-token time",
        "interval": [d - 0.01, d + 0.01],
        "inflated": d > 1.10,
        "unprofiled": {"n": 4, "skipped": 1, "median_ns": unprofiled_ns, "mean_ns": unprofiled_ns},
        "profiled": {
            "n": 4,
            "skipped": 1,
            "median_ns": int(unprofiled_ns * d),
            "mean_ns": int(unprofiled_ns * d),
        },
    }


def shortfall(dilation_sharded: float = 1.05) -> dict[str, Any]:
    return complete(_shortfall(dilation_sharded), "shortfall")


def _shortfall(dilation_sharded: float) -> dict[str, Any]:
    terms = {"compute": 400_000, "memory": 100_000, "transfer": 300_000, "coordination": 1_200_000}
    coord = {"wait": 800_000, "sync": 200_000, "idle": 200_000}
    S = 2 * MS
    per_rank = [
        {
            "rank": 0,
            "terms_ns": {
                "compute": 200_000,
                "memory": 100_000,
                "transfer": 100_000,
                "coordination": 1_600_000,
            },
            "coordination_ns": {"wait": 1_400_000, "sync": 200_000, "idle": 0},
            "own_window_ns": 7_300_000,
            "pad_ns": 50_000,
        },
        {
            "rank": 1,
            "terms_ns": {"compute": 600_000, "memory": 100_000, "transfer": 500_000, "coordination": 800_000},
            "coordination_ns": {"wait": 200_000, "sync": 200_000, "idle": 400_000},
            "own_window_ns": 7_350_000,
            "pad_ns": 0,
        },
    ]
    return {
        "schema_version": "1.5",
        "kind": "tracekit.shortfall",
        "n_ranks": 2,
        "per_token_ns": {"baseline": 10 * MS, "sharded": 7 * MS, "ideal": 5 * MS},
        "per_token_source": "unprofiled",
        "shortfall_ns": S,
        "terms_ns": terms,
        "coordination_ns": coord,
        "shares": {k: v / S for k, v in terms.items()},
        "spread_ns": {k: {"p10": v - 1000, "p90": v + 1000} for k, v in {**terms, **coord}.items()},
        "verdict": "Coordination dominates the shortfall: 60.0% of S = 2.000 ms per token at TP=2.",
        "aggregate": "mean over ranks of each rank's parts",
        "term_words": {
            "compute": "compute that did not shrink N-fold",
            "memory": "memory copies and sets that did not shrink N-fold",
            "transfer": "gloo's exchange after the last rank arrives (host scheduler delay included, not a GPU link)",
            "coordination": "ranks waiting for each other and host gaps",
        },
        "per_rank": per_rank,
        "critical_path": {
            "step_ns": 7 * MS,
            "offset_ns": 100_000,
            "by_rank": {
                "0": _path_rank(1_000_000, 200_000, 300_000, 500_000, 100_000),
                "1": _path_rank(2_000_000, 200_000, 300_000, 2_200_000, 100_000),
            },
            "cause": "On the critical path, rank 1's host time is 2.20 ms of the 7.00 ms per token; "
            "the consequence: rank 0 waits 1.40 ms per token at the collectives.",
            "hops_per_step_median": 2.0,
            "baseline": {"step_ns": 10 * MS, "by_rank": {"0": _path_rank(6 * MS, 1 * MS, 0, 3 * MS, 0)}},
            "uncorrected": {"step_ns": 7_350_000},
        },
        "straggler": {
            "rank": 1,
            "is_straggler": True,
            "last_share": 26 / 32,
            "lateness_ns_median": 150_000,
            "threshold_ns": 100_000,
        },
        "dilation": {
            "definition": "traced per-token time / unprofiled per-token time; the correction removes exactly this factor",
            "baseline": 1.02,
            "sharded": dilation_sharded,
            "interval": {
                "baseline": [0.98, 1.06],
                "sharded": [dilation_sharded - 0.03, dilation_sharded + 0.03],
            },
            "applied": {
                "baseline": {
                    "factor": 1.02,
                    "interval": [0.98, 1.06],
                    "traced_mean_ns": 10_200_000,
                    "corrected_mean_ns": 10 * MS,
                    "unprofiled_mean_ns": 10 * MS,
                    "unprofiled_rounds": 1,
                },
                "sharded": {
                    "factor": dilation_sharded,
                    "interval": [dilation_sharded - 0.03, dilation_sharded + 0.03],
                    "traced_mean_ns": int(7 * MS * dilation_sharded),
                    "corrected_mean_ns": 7 * MS,
                    "unprofiled_mean_ns": int(7.14 * MS),  # the host drifted: the rounds ran 2% slower
                    "unprofiled_rounds": 1,
                },
            },
            "threshold": 0.10,
            "inflated": dilation_sharded > 1.10,
            "reconciliation": "traced parts scaled to the unprofiled per-token times",
            "runs": {
                "baseline": _host_clock(1.04, 10 * MS),
                "sharded": _host_clock(dilation_sharded + 0.02, 7 * MS),
            },
        },
        "uncorrected": {
            "per_token_ns": {"baseline": 10_200_000, "sharded": 7_350_000, "ideal": 5_100_000},
            "shortfall_ns": 2_250_000,
            "terms_ns": terms,
            "coordination_ns": coord,
        },
        "stragglers": [
            {"rank": 0, "last_count": 6, "instances": 32, "share": 6 / 32},
            {"rank": 1, "last_count": 26, "instances": 32, "share": 26 / 32},
        ],
        "collectives": {
            "instances": 32,
            "per_token": 8,
            "by_op": [
                {
                    "op": "all_reduce",
                    "bytes": 8192,
                    "count": 32,
                    "wait_ns_median": 100_000,
                    "transfer_ns_median": 37_500,
                    "skew_ns_median": 110_000,
                    "busbw_gbps_median": 8192 / 37_500,
                }
            ],
        },
        "clock": {"aligned": False, "offsets_ns": {"0": 0, "1": 0}},
        "data_quality": {"counts": {}, "notes": []},
    }


def links() -> dict[str, Any]:
    rows = []
    for mode, scale in (("nvlink", 100.0), ("pcie", 20.0)):
        for k in range(3, 24, 2):
            b = 1 << k
            bus = scale * b / (b + 65536)
            rows.append(
                {
                    "op": "all_reduce",
                    "ranks": 2,
                    "backend": "nccl",
                    "dtype": "float32",
                    "bytes": b,
                    "count": b // 4,
                    "in_place": False,
                    "time_us": b / bus / 1e3,
                    "time_us_min": 1.0,
                    "time_us_max": 2.0,
                    "host_time_us": 2.0,
                    "algbw_gbps": bus,
                    "busbw_gbps": bus,
                    "correct": True,
                    "mode": mode,
                    "transport": "P2P/CUMEM" if mode == "nvlink" else "SHM",
                }
            )
    transports = {
        "nvlink": {
            "transport": "P2P/CUMEM",
            "wire": "nvlink",
            "nvls_used": False,
            "uses_nvlink": True,
            "notes": [],
        },
        "pcie": {
            "transport": "SHM",
            "wire": "host_memory",
            "nvls_used": False,
            "uses_nvlink": False,
            "notes": ["pcie: NCCL_P2P_DISABLE=1: SHM through host memory"],
        },
    }
    trace_sizes = [
        {"op": "allreduce", "coll_op": "all_reduce", "bytes": 8192, "count": 32, "busbw_gbps": 0.5},
        {"op": "allgather", "coll_op": "all_gather", "bytes": 4096, "count": 8, "busbw_gbps": 0.25},
    ]
    doc = {  # the shape of tracekit.probe.compare.compare_links()
        "schema_version": "1.0",
        "kind": "tracekit.compare_links",
        "rows": rows,
        "modes": [{"mode": "nvlink", "env": {}}, {"mode": "pcie", "env": {"NCCL_P2P_DISABLE": "1"}}],
        "transports": transports,
        "trace": {"sizes": trace_sizes},
        "notes": ["pcie: NCCL_P2P_DISABLE=1: SHM through host memory"],
        "verdict": "At the decode's 8 KiB all-reduces both links realise under 15% of their peak: the link does not explain the transfer time.",
    }
    return complete(doc, "links")  # the fields not designed here: the real one's


def full_inputs(**kw: Any) -> dict[str, Any]:
    """Keyword arguments for build_report_data: TP=1 vs TP=2 with links."""
    base = dict(
        breakdown=breakdown(2, 7.0, kernel_name=kw.pop("kernel_name", "my_kernel")),
        baseline_breakdown=breakdown(1, 10.0),
        shortfall=shortfall(kw.pop("dilation_sharded", 1.05)),
        links=links(),
        manifest=manifest(2),
        baseline_manifest=manifest(1, 1.02),
        run_path="traces/tp2",
        baseline_path="traces/tp1",
        created="2026-11-29T16:00:00Z",
    )
    base.update(kw)
    return copy.deepcopy(base)


_TYPED = {
    "breakdown": documents.Breakdown,
    "baseline_breakdown": documents.Breakdown,
    "shortfall": documents.Shortfall,
    "manifest": documents.Manifest,
    "baseline_manifest": documents.Manifest,
    "top_kernels": documents.TopKernels,
    "baseline_top_kernels": documents.TopKernels,
}


def typed_inputs(**kw: Any) -> dict[str, Any]:
    """`full_inputs`-style keyword arguments with their documents decoded into the Structs that
    `build_report_data` takes (a sample that does not fit its Struct fails here)."""
    out = dict(kw)
    for key, struct in _TYPED.items():
        if isinstance(out.get(key), dict):
            out[key] = documents.convert(out[key], struct)
    links_in = out.get("links")
    if isinstance(links_in, dict):
        out["links"] = documents.convert(links_in, documents.Links)
    elif isinstance(links_in, list) and links_in and isinstance(links_in[0], dict):
        out["links"] = documents.convert(links_in, list[documents.ProbeRow])
    return out


def build(**kw: Any) -> Any:
    """`build_report_data` of the sample inputs (dicts here, so tests can edit them), typed."""
    from tracekit.report.data import build_report_data

    return build_report_data(**typed_inputs(**kw))
