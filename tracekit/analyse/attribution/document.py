"""The pieces of the shortfall's JSON (docs/JSON.md#shortfall) that are not the terms: the critical
path and per-rank figures in integers, the steps, the collectives by op, the spread over steps, the
run samples of the noise bootstrap; `SCHEMA_VERSION`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from tracekit.analyse.attribution.reconcile import AppliedDilation
from tracekit.analyse.attribution.run import RunParts
from tracekit.analyse.attribution.terms import Attribution
from tracekit.analyse.compute.kernel_scaling import KERNEL_COLUMNS, Canonical, canonical
from tracekit.analyse.exact import round_half_up, round_to_sum
from tracekit.analyse.noise import RunSample
from tracekit.analyse.timeline.windows import assign_steps
from tracekit.model.documents import shortfall as sd
from tracekit.model.parts import COORDINATION, LEAF_PARTS, PATH_PARTS

T = TypeVar("T")

#: 1.2: collectives.by_op[].bytes_source; 1.3: diagnosis; 1.4: collectives.by_op[].wait_ns_median is the
#: median over instances of the per-instance max wait (was: over every (instance, rank) row); 1.5: per_rank,
#: critical_path, straggler, term_words, aggregate; dilation stated = applied (traced/unprofiled means)
SCHEMA_VERSION = "1.5"


def path_integers(path: Mapping[str, Any]) -> sd.ShortfallUncorrected:
    """A per-token critical path (by_rank Fractions, offset, step) as integers: by_rank ->
    {<part>_ns, total_ns}, offset_ns, step_ns; the components and the offset are rounded by largest
    remainder to sum to step_ns exactly."""
    total = round_half_up(path["step"])
    flat: dict[str, Fraction] = {"offset": path["offset"]}
    for r, d in path["by_rank"].items():
        for p in PATH_PARTS:
            flat[f"{r}:{p}"] = d[p]
    ints = round_to_sum(flat, total)
    by_rank = {
        str(r): sd.ShortfallByRankValue(
            **{f"{p}_ns": ints[f"{r}:{p}"] for p in PATH_PARTS},
            total_ns=sum(ints[f"{r}:{p}"] for p in PATH_PARTS),
        )
        for r in sorted(path["by_rank"])
    }
    return sd.ShortfallUncorrected(step_ns=total, offset_ns=ints["offset"], by_rank=by_rank)


def per_rank_json(per_rank: Mapping[int, Attribution], run: RunParts) -> list[sd.ShortfallPerRankItem]:
    out = []
    for r in sorted(per_rank):
        i = per_rank[r].integers()
        pr = run.per_rank[r]
        out.append(
            sd.ShortfallPerRankItem(
                rank=int(r),
                terms_ns=i["terms_ns"],
                coordination_ns=i["coordination_ns"],
                own_window_ns=round_half_up(pr["own_window"]),
                pad_ns=round_half_up(pr["pad"]),
            )
        )
    return out


def run_sample(run: RunParts, corrected: bool, correction: Any = None) -> RunSample:
    """The bootstrap's view of one run: [steady steps, ranks, parts] and the manifest's rounds;
    with a replay `correction`, its per-step parts on the corrected timeline beside the traced ones."""
    rs = run.rank_steps.sort_values(["step", "rank"])
    steps = sorted(rs["step"].unique())
    ranks = sorted(rs["rank"].unique())
    arr = (
        rs[[f"{p}_ns" for p in LEAF_PARTS]]
        .to_numpy(np.int64)
        .reshape(len(steps), len(ranks), len(LEAF_PARTS))
    )
    u, p = run.dilation.unprofiled, run.dilation.profiled
    return RunSample(
        steps=arr,
        timeline=run.timeline,
        unprofiled=u.rounds if u is not None else (),
        profiled=p.rounds if p is not None else (),
        corrected=corrected,
        pairing=run.pairing,
        replayed=correction.rows if correction is not None and correction.method == "replay" else None,
    )


def median_window(run: RunParts, ad: AppliedDilation, source: str) -> int:
    """The median step time of the trace, divided by the applied dilation when corrected."""
    med = float(np.median(run.steady["window_ns"].to_numpy()))
    if source == "unprofiled" and ad.factor:
        med /= ad.factor
    return int(round(med))


def steps_json(run: RunParts) -> sd.ShortfallStepsBaseline:
    out = sd.ShortfallStepsBaseline(
        pattern=run.step_pattern,  # type: ignore[arg-type]
        total=int(len(run.slowest)),
        steady=int(run.slowest["steady"].sum()),
        timeline=run.timeline,
        slowest_rank_counts={
            str(int(k)): int(v) for k, v in run.steady["rank"].value_counts().sort_index().items()
        },
    )
    if run.token_steps is not None:
        # only where the step names say their kind (serving engines): which steps are tokens
        used = run.token_steps.document()
        out.per_token_steps = sd.ShortfallPerTokenSteps(
            kind=used.kind, batch=used.batch, steps=used.steps, rule=used.rule, steady=out.steady
        )
        out.kinds = run.step_kinds
    return out


def _kept(run: RunParts, key: str, make: Callable[[], T]) -> T:
    """A reading of one run that the shortfall's document takes, made once and kept on the run."""
    got: dict[str, Any] = run.__dict__.setdefault("_readings", {})
    if key not in got:
        got[key] = make()
    return got[key]  # type: ignore[no-any-return]


def run_collectives(run: RunParts) -> sd.ShortfallCollectives:
    """`collectives_json` of the run, made once (`read_ahead`)."""
    return _kept(run, "collectives", lambda: collectives_json(run))


def run_canonical(run: RunParts) -> Canonical | None:
    """The run's canonical kernel sequence over its steady steps (`kernel_scaling.canonical`,
    what `compute_scaling` compares), made once (`read_ahead`)."""
    steps = list(run.steady_steps)

    def make() -> Canonical | None:
        kernels = run.kernels if run.kernels is not None else pd.DataFrame(columns=list(KERNEL_COLUMNS))
        return canonical(kernels, steps)

    return _kept(run, f"canonical {steps}", make)


def read_ahead(run: RunParts) -> None:
    """The run's readings of the shortfall's document that need neither the profiler correction
    nor the other run, made ahead: the attribution plan does it on the client while the
    correction's Reduce runs on a worker (`plans.Later`), so the command's tail does not."""
    run_collectives(run)
    run_canonical(run)


def collectives_json(run: RunParts) -> sd.ShortfallCollectives:
    coll = run.collectives
    inst = coll.instances
    pr = coll.per_rank
    steady_steps = set(run.steady["step"].tolist())
    if len(pr):
        min_rank = pr["rank"].min()
        windows = run.steps[["rank", "step", "start_ns", "end_ns"]]
        first = pr[pr["rank"] == min_rank]
        inst_step = pd.Series(assign_steps(first, windows).to_numpy(), index=first["instance"].to_numpy())
        in_steady = int(inst_step.isin(steady_steps).sum())
    else:
        in_steady = 0
    n_steady = max(len(steady_steps), 1)
    by_op = []
    if len(inst):
        src_col = inst["bytes_source"] if "bytes_source" in inst.columns else "unknown"
        inst = inst.assign(bytes_source=src_col)
        pr_i = pr.merge(
            inst[["instance", "op", "size_bytes", "bytes_source", "skew_ns", "busbw_gbps"]],
            on="instance",
            suffixes=("", "_i"),
        )
        for (op, size, src), g in pr_i.groupby(["op_i", "size_bytes", "bytes_source"], sort=True):
            ig = inst[(inst["op"] == op) & (inst["size_bytes"] == size) & (inst["bytes_source"] == src)]
            bw = ig["busbw_gbps"].dropna()
            by_op.append(
                sd.ShortfallByOpItem(
                    op=str(op),
                    bytes=int(size),
                    bytes_source=str(src),  # "trace" | "manifest" | "unknown"
                    count=int(len(ig)),
                    # per instance the wait of the ranks that waited (the last arriver waits 0 by
                    # definition), then the median over instances
                    wait_ns_median=int(round(float(ig["wait_ns_max"].median()))),
                    transfer_ns_median=int(round(float(g["transfer_ns"].median()))),
                    skew_ns_median=int(round(float(ig["skew_ns"].median()))),
                    busbw_gbps_median=float(bw.median()) if len(bw) else None,
                )
            )
    return sd.ShortfallCollectives(
        instances=int(len(inst)),
        per_token=in_steady / n_steady,
        level=coll.level,
        match_by=coll.match_by,
        by_op=by_op,
    )


def step_spread(
    base: RunParts, sharded: RunParts, factor: Fraction, shift: Mapping[str, Fraction]
) -> dict[str, sd.ShortfallCompute]:
    """p10 / median / p90 over the sharded run's steady steps of each per-step term
    (PN_step - f * mean P1), shifted by the reconciliation (`shift`: corrected - uncorrected mean)."""
    st = sharded.steady
    per_step: dict[str, np.ndarray] = {}
    for p in LEAF_PARTS:
        per_step[p] = st[f"{p}_ns"].to_numpy(np.float64) - float(factor * base.per_token[p])
    groups = {
        "compute": ("compute",),
        "memory": ("memory",),
        "transfer": ("transfer",),
        "coordination": COORDINATION,
        "wait": ("wait",),
        "sync": ("sync",),
        "idle": ("idle",),
        "unknown": ("unknown",),
    }
    out: dict[str, sd.ShortfallCompute] = {}
    for name, keys in groups.items():
        vals = sum(per_step[k] for k in keys) + float(sum(shift[k] for k in keys))
        arr = np.asarray(vals, dtype=np.float64)
        out[name] = sd.ShortfallCompute(
            p10=int(round(float(np.quantile(arr, 0.1)))),
            median=int(round(float(np.median(arr)))),
            p90=int(round(float(np.quantile(arr, 0.9)))),
        )
    shortfall = (
        st["window_ns"].to_numpy(np.float64)
        - float(factor * base.per_token["window"])
        + float(sum(shift[k] for k in LEAF_PARTS))
    )
    out["shortfall"] = sd.ShortfallCompute(
        p10=int(round(float(np.quantile(shortfall, 0.1)))),
        median=int(round(float(np.median(shortfall)))),
        p90=int(round(float(np.quantile(shortfall, 0.9)))),
    )
    return out
