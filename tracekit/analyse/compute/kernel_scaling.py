"""Which kernels did not shrink: the compute term of S split kernel by kernel (docs/METHOD.md
section Compute that did not shrink).

The shortfall's compute term is `C_N - C_1 / N` per token (the partition's compute part, mean over
ranks). Sharding splits the matrix work N ways, but a TP layout also *replicates* work on every
rank (norms, rotary, embedding lookups, sampling, residual adds) and some sharded kernels do not
get N times faster (a GEMM that no longer fills the GPU). This module says which.

Per rank and steady step, the compute kernels are taken in launch order (device start order).
Each run's **canonical sequence** is the most frequent kernel-name sequence of its steps (the
decode step repeats the same program); the per-position time is the mean over the steps (and the
ranks) that follow it exactly. The TP=1 and TP=N sequences are aligned by name (longest matching
blocks, `difflib`; every matrix kernel has one key, so a GEMM that became another kernel at the
smaller shard keeps its place), and a replaced block of equal length is paired position by position (the same
operation, another kernel chosen for the smaller shard: a GEMM tile config). Each aligned position
gets its lost time `t_N - t_1 / N` and a class from its ratio `r = t_N / t_1`:

- **replicated** (`r >= 1 - tol`): the work did not shrink at all (the layout repeats it per rank);
- **shrank** (`r <= (1 + tol) / N`): it shrank N-fold;
- **partly shrank**: sharded, but shrank less than N-fold;
- **added** / **removed**: kernels only in the sharded / the baseline run's sequence.

The kernels' lost times plus a **residual** (what kernel sums do not see: kernels overlapping on
streams, steps off the canonical sequence, the difference between the mean over all steady steps
and over the canonical ones, the reconciliation) sum exactly to the integer compute term the
shortfall prints. `tol` = 0.15 (`TOLERANCE`).
"""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd
from msgspec import UNSET

from tracekit.analyse.exact import round_to_sum
from tracekit.model.documents import shortfall as sd
from tracekit.model.strings import str_isin, str_values

#: Relative tolerance of the replicated / shrank classes.
TOLERANCE = 0.15
#: Kernels listed per class in the JSON.
TOP_KERNELS = 8
#: The classes, in report order.
CLASSES: tuple[str, ...] = ("replicated", "partly_shrank", "shrank", "added", "removed")
#: Columns of the per-rank kernel table (`kernel_table`).
KERNEL_COLUMNS: tuple[str, ...] = ("rank", "step", "pos", "name", "unit", "dur_ns")
#: `unit` of a GEMM kernel and of an attention kernel (the classifier's `attention` rule); "" for the rest.
GEMM, ATTENTION = "gemm", "attention"
#: Kernel names are shortened to this many characters in the JSON.
NAME_CHARS = 160


def short_kernel_name(name: str, chars: int = 70) -> str:
    """A kernel name without the noise every ATen kernel carries (void, namespaces), cut to `chars`."""
    for noise in ("void ", "at::native::", "(anonymous namespace)::", "at::"):
        name = name.replace(noise, "")
    return name if len(name) <= chars else name[: chars - 1] + "…"


def kernel_table(events: pd.DataFrame, rank: int, windows: pd.DataFrame) -> pd.DataFrame:
    """One rank's compute kernels per step window, in device start order: columns
    `KERNEL_COLUMNS` (`pos` = the kernel's index within its step). `events`: the rank's classified
    rows; `windows`: its step windows (`step`, `start_ns`, `end_ns`). A kernel belongs to the
    window its start lies in. Empty on a host timeline (no GPU kernels)."""
    empty = pd.DataFrame({c: pd.Series(dtype="int64") for c in KERNEL_COLUMNS})
    empty["name"] = empty["name"].astype(object)
    empty["unit"] = empty["unit"].astype(object)
    if not len(events) or not len(windows):
        return empty
    sel = str_isin(events["kind"], {"kernel"}) & str_isin(events["cls"], {"compute"})
    if not sel.any():
        return empty
    ev = events[sel]
    s = ev["start_ns"].to_numpy(np.int64)
    e = ev["end_ns"].to_numpy(np.int64)
    names = str_values(ev["name"])
    unit = np.where(
        str_isin(ev["rule"], {"attention"}),
        ATTENTION,
        np.where(str_isin(ev["subclass"], {"matrix"}), GEMM, ""),
    ).astype(object)
    order = np.argsort(s, kind="stable")
    s, e, names, unit = s[order], e[order], names[order], unit[order]
    w = windows.sort_values("start_ns")
    ws = w["start_ns"].to_numpy(np.int64)
    we = w["end_ns"].to_numpy(np.int64)
    idx = np.searchsorted(ws, s, side="right") - 1
    ok = idx >= 0
    ok[ok] &= s[ok] < we[idx[ok]]
    if not ok.any():
        return empty
    steps = w["step"].to_numpy(np.int64)[idx[ok]]
    out = pd.DataFrame(
        {"rank": np.full(int(ok.sum()), int(rank), dtype=np.int64), "step": steps, "name": names[ok]}
    )
    out["unit"] = unit[ok]
    out["dur_ns"] = (e[ok] - s[ok]).astype(np.int64)
    out["pos"] = out.groupby("step").cumcount().astype(np.int64)
    return out[list(KERNEL_COLUMNS)].reset_index(drop=True)


#: `compact_kernels`' unit column: the kernel table's units (`kernel_table`)
_UNITS = pd.CategoricalDtype(["", GEMM, ATTENTION])


def compact_kernels(table: pd.DataFrame) -> pd.DataFrame:
    """A rank's kernel table (`kernel_table`) as it travels and stays on the
    client: each kernel name and unit once (categorical), rank, step and position as int32; the
    same rows and values (~23 bytes a row instead of ~100 with a Python string per unit: at 256
    h200-tp2 ranks the client's largest holding)."""
    return table.assign(
        rank=table["rank"].to_numpy(np.int32),
        step=table["step"].to_numpy(np.int32),
        pos=table["pos"].to_numpy(np.int32),
        name=table["name"].astype("category"),
        unit=table["unit"].astype(_UNITS),
    )


def gather_kernels(tables: list[pd.DataFrame | None]) -> list[pd.DataFrame | None]:
    """The ranks' compact kernel tables (rank order) on one categorical of the run's kernel names
    (numbered in order of first appearance), so that they concatenate without a string per row
    and the names' codes number the run's kernels (`canonical`)."""
    ids: dict[str, int] = {}
    for k in tables:
        if k is not None and isinstance(k["name"].dtype, pd.CategoricalDtype):
            for c in k["name"].cat.categories:
                ids.setdefault(str(c), len(ids))
    names = pd.CategoricalDtype(list(ids))
    out: list[pd.DataFrame | None] = []
    for k in tables:
        if k is not None and isinstance(k["name"].dtype, pd.CategoricalDtype):
            col = k["name"]
            to_id = np.asarray([ids[str(c)] for c in col.cat.categories], dtype=np.int64)
            codes = to_id[col.cat.codes.to_numpy()] if len(to_id) else np.zeros(len(k), dtype=np.int64)
            k = k.assign(name=pd.Categorical.from_codes(codes, dtype=names))
        out.append(k)
    return out


@dataclass(frozen=True)
class Canonical:
    """A run's canonical kernel sequence: names (consecutive GEMM kernels joined as one unit, and
    consecutive attention kernels), each unit's kind (`GEMM`, `ATTENTION` or ""), mean time per
    unit (exact), how many (rank, step) pairs followed it of how many."""

    names: tuple[str, ...]
    units: tuple[str, ...]
    mean_ns: tuple[Fraction, ...]
    followed: int
    of: int


def canonical(kernels: pd.DataFrame, steps: list[int]) -> Canonical | None:
    """The most frequent per-step name sequence over `steps` (all ranks) and its mean per-position
    time over the (rank, step) pairs that follow it exactly. None when there are no kernels."""
    # one pass over the rows sorted by (rank, step, pos): each (rank, step) is a run of rows, its
    # sequence the names' codes (the most frequent, ties: the first in (rank, step) order); on
    # the columns' arrays, not on a filtered and a sorted copy of the table
    step_all = kernels["step"].to_numpy()
    sel = np.flatnonzero(np.isin(step_all, np.asarray(steps, dtype=np.int64)))
    if not len(sel):
        return None
    s = step_all[sel]
    r = kernels["rank"].to_numpy()[sel]
    sel = sel[np.lexsort((kernels["pos"].to_numpy()[sel], s, r))]  # stable, as sort_values'
    r, s = kernels["rank"].to_numpy()[sel], step_all[sel]
    if isinstance(kernels["name"].dtype, pd.CategoricalDtype):  # the names numbered by the gathering
        codes = kernels["name"].cat.codes.to_numpy()[sel]
    else:
        codes = pd.factorize(kernels["name"].astype(object).to_numpy()[sel])[0]
    dur = kernels["dur_ns"].to_numpy(np.int64)[sel]
    bounds = np.r_[0, np.flatnonzero((r[1:] != r[:-1]) | (s[1:] != s[:-1])) + 1, len(sel)].tolist()
    spans = list(zip(bounds[:-1], bounds[1:], strict=True))
    seqs = [tuple(codes[a:b].tolist()) for a, b in spans]
    common_codes, _ = Counter(seqs).most_common(1)[0]
    hits = [i for i, seq in enumerate(seqs) if seq == common_codes]
    a0, b0 = spans[hits[0]]
    # the names and units of that one sequence only (not a string object per row of the run)
    common = tuple(str(x) for x in kernels["name"].iloc[sel[a0:b0]])
    flags = {common: tuple(str(x) for x in kernels["unit"].iloc[sel[a0:b0]])}
    total = np.asarray(np.sum([dur[a:b] for a, b in (spans[i] for i in hits)], axis=0, dtype=np.int64))
    n = len(hits)
    # consecutive GEMM kernels are one unit (a GEMM and its split-K reduce; another shard may split
    # it differently), and so are consecutive attention kernels (a split-KV pass and its combine),
    # so the units align where single kernels would not
    names: list[str] = []
    units: list[str] = []
    sums: list[int] = []
    for name, u, t in zip(common, flags[common], [int(x) for x in total], strict=True):
        if u and units and units[-1] == u:
            names[-1] = f"{names[-1]} + {name}"
            sums[-1] += int(t)
        else:
            names.append(name)
            units.append(u)
            sums.append(int(t))
    return Canonical(tuple(names), tuple(units), tuple(Fraction(t, n) for t in sums), n, len(seqs))


#: The alignment key of a GEMM or attention unit is its kind: a GEMM of the smaller shard is often
#: another kernel (tile configuration, split-K), so matrix work aligns by its place among the other
#: kernels.
def _keys(c: Canonical) -> list[str]:
    return [f"<{u} kernel>" if u else name for name, u in zip(c.names, c.units, strict=True)]


def _align(a: list[str], b: list[str]) -> list[tuple[int | None, int | None]]:
    """Pairs of positions (i in a, j in b); None on one side for a kernel only in the other."""
    pairs: list[tuple[int | None, int | None]] = []
    sm = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            pairs.extend(zip(range(i1, i2), range(j1, j2), strict=True))
        else:
            pairs.extend((i, None) for i in range(i1, i2))
            pairs.extend((None, j) for j in range(j1, j2))
    return pairs


@dataclass(frozen=True)
class _Unit:
    """One aligned position: the sharded run's name (the baseline's where only it has one), the
    baseline's name, its class, its mean time per step at TP=1 and at TP=N."""

    name: str
    baseline_name: str | None
    cls: str
    t1: Fraction
    tn: Fraction

    def lost(self, n: int) -> Fraction:
        return self.tn - self.t1 / n


def _class_of(t1: Fraction | None, tn: Fraction | None, n: int, tol: float) -> str:
    if t1 is None:
        return "added"
    if tn is None:
        return "removed"
    if t1 == 0:
        return "replicated" if tn > 0 else "shrank"
    r = float(tn / t1)
    if r >= 1 - tol:
        return "replicated"
    if r <= (1 + tol) / n:
        return "shrank"
    return "partly_shrank"


@dataclass
class _Named:
    """One kernel name's units of one class: how many per token, their times and what they lost."""

    count: int = 0
    t1: Fraction = Fraction(0)
    tn: Fraction = Fraction(0)
    lost: Fraction = Fraction(0)
    changed: bool = False


def compute_scaling(
    base_kernels: pd.DataFrame,
    base_steps: list[int],
    shard_kernels: pd.DataFrame,
    shard_steps: list[int],
    n: int,
    compute_term_ns: int,
    *,
    tol: float = TOLERANCE,
) -> sd.ShortfallComputeScaling:
    """The compute term split by kernel class (see the module doc): the JSON block
    `compute_scaling` of `tracekit shortfall`. `n`: the sharded run's ranks over the baseline's
    (the TP factor); `compute_term_ns`: the integer compute term the shortfall prints, which the
    classes plus the residual sum to exactly."""
    return scaling_of(
        canonical(base_kernels, base_steps),
        canonical(shard_kernels, shard_steps),
        n,
        compute_term_ns,
        tol=tol,
    )


def scaling_of(
    cb: Canonical | None, cs: Canonical | None, n: int, compute_term_ns: int, *, tol: float = TOLERANCE
) -> sd.ShortfallComputeScaling:
    """`compute_scaling` from the two runs' canonical sequences (`canonical`), made where the
    caller has them (the shortfall's: each run's, made once: `attribution.document.run_canonical`)."""
    if cb is None or cs is None:
        return sd.ShortfallComputeScaling(
            available=False,
            reason="no GPU compute kernels in the "
            + ("baseline" if cb is None else "sharded run")
            + " (a host timeline, or kernels left out of the trace)",
        )
    rows: list[_Unit] = []
    for i, j in _align(_keys(cb), _keys(cs)):
        t1 = cb.mean_ns[i] if i is not None else None
        tn = cs.mean_ns[j] if j is not None else None
        name = cs.names[j] if j is not None else cb.names[i] if i is not None else ""
        rows.append(
            _Unit(
                name=name,
                baseline_name=cb.names[i] if i is not None else None,
                cls=_class_of(t1, tn, n, tol),
                t1=t1 or Fraction(0),
                tn=tn or Fraction(0),
            )
        )
    by_class = {c: sum((r.lost(n) for r in rows if r.cls == c), Fraction(0)) for c in CLASSES}
    residual = compute_term_ns - sum(by_class.values(), Fraction(0))
    ints = round_to_sum({**by_class, "residual": residual}, compute_term_ns)

    # per kernel name (a name can sit at many positions: one per layer)
    agg: dict[tuple[str, str], _Named] = {}
    for r in rows:
        a = agg.setdefault((r.cls, r.name), _Named())
        a.count += 1
        a.t1 += r.t1
        a.tn += r.tn
        a.lost += r.lost(n)
        a.changed |= r.baseline_name is not None and r.baseline_name != r.name
    classes: dict[str, sd.ShortfallScalingClass] = {}
    for c in CLASSES:
        items = sorted(((k[1], v) for k, v in agg.items() if k[0] == c), key=lambda kv: -kv[1].lost)
        classes[c] = sd.ShortfallScalingClass(
            lost_ns=ints[c],
            kernels_per_token=sum(v.count for _, v in items),
            baseline_ns=round(float(sum((v.t1 for _, v in items), Fraction(0)))),
            sharded_ns=round(float(sum((v.tn for _, v in items), Fraction(0)))),
            top=[
                sd.ShortfallScalingKernel(
                    name=name[:NAME_CHARS],
                    per_token=v.count,
                    baseline_ns=round(float(v.t1)),
                    sharded_ns=round(float(v.tn)),
                    lost_ns=round(float(v.lost)),
                    kernel_changed=True if v.changed else UNSET,
                )
                for name, v in items[:TOP_KERNELS]
            ],
        )
    assert sum(ints.values()) == compute_term_ns

    def sequence(c: Canonical) -> sd.ShortfallSequencesBaseline:
        return sd.ShortfallSequencesBaseline(
            units_per_step=len(c.names), steps_following=c.followed, steps=c.of
        )

    return sd.ShortfallComputeScaling(
        available=True,
        definition="the compute term split by kernel: each compute kernel of a step, aligned by name and "
        "launch order (matrix kernels by their place: a smaller shard may get another GEMM kernel) between the "
        "baseline's and the sharded run's most frequent step sequence, loses "
        f"t_N - t_1/N; replicated: t_N/t_1 >= {1 - tol:.2f}; shrank: t_N/t_1 <= {1 + tol:.2f}/N; partly shrank: "
        "between; added/removed: only in one run; residual: overlap on streams, steps off the sequence, "
        "reconciliation (docs/METHOD.md section Compute that did not shrink)",
        tolerance=tol,
        compute_term_ns=compute_term_ns,
        classes=sd.ShortfallClasses(**classes),
        residual_ns=ints["residual"],
        sequences=sd.ShortfallSequences(baseline=sequence(cb), sharded=sequence(cs)),
    )
