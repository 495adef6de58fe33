"""The classifier: one class per event from the ordered rule table in `rules.py`.

`classify(events)` returns a copy of the event table with four more categorical columns:
`cls`, `subclass`, `rule` and `decided_by` (see docs/ARCHITECTURE.md). Each distinct (kind, name)
pair is classified once and the result mapped back through the categorical codes, so the regex cost
is the number of distinct names, and the per-event cost a few array lookups.

Two sources, launching op first (docs/METHOD.md section "Serving engines: custom all-reduce and
step kinds"): a kernel whose launch call lies innermost in a host op or range that is a collective
(`tracekit.model.launch.collective_launch_ops`: an engine's custom all-reduce op, `c10d` ops,
symmetric-memory ops) is a collective whatever its name (`decided_by` "launch_op"; `rule` stays the
name rule's when that rule says collective too, else "launching_op"); every other event is
classified by the name rules (`decided_by` "name"). Such a kernel also takes the collective, the
message bytes and the dtype of its launching op where it carries none itself (the reader fills an
engine op's bytes from its record_shapes).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracekit.classify.rules import CLASSES, GPU_KINDS, RULES, UNKNOWN, Rule, match, matching_rules
from tracekit.model.launch import collective_launch_ops, launch_op_collective, launch_op_subclass
from tracekit.model.strings import str_values

__all__ = [
    "CLASSES",
    "DECIDED_BY",
    "GPU_KINDS",
    "RULES",
    "Rule",
    "classify",
    "classify_name",
    "match",
    "matching_rules",
]

#: Values of the `decided_by` column: which source classified the event.
DECIDED_BY: tuple[str, ...] = ("name", "launch_op")
#: The `rule` of a kernel only its launching op made a collective.
LAUNCHING_OP_RULE = "launching_op"


def classify_name(kind: str, name: str) -> tuple[str, str, str]:
    """(cls, subclass, rule) of one event kind + name; unknown when no rule matches."""
    rule = match(kind, name)
    if rule is None:
        return UNKNOWN
    return rule.cls, rule.subclass, rule.name


def classify(events: pd.DataFrame) -> pd.DataFrame:
    """The event table plus `cls`, `subclass`, `rule` (categoricals). Does not modify `events`."""
    out = events.copy(deep=False)
    n = len(events)
    kind = events["kind"]
    name = events["name"]
    if not isinstance(kind.dtype, pd.CategoricalDtype):
        kind = kind.astype("category")
    if not isinstance(name.dtype, pd.CategoricalDtype):
        name = name.astype("category")
    kind_codes = kind.cat.codes.to_numpy().astype(np.int64)
    name_codes = name.cat.codes.to_numpy().astype(np.int64)
    kind_cats = list(kind.cat.categories)
    name_cats = list(name.cat.categories)
    # a (kind, name) grid: mark the pairs present, classify each once, then look every event up
    # (O(events), no sort). Code -1 (missing) is shifted to 0 and reads as "".
    k_idx = kind_codes + 1
    n_idx = name_codes + 1
    present = np.zeros((len(kind_cats) + 1, len(name_cats) + 1), dtype=bool)
    present[k_idx, n_idx] = True
    pairs = np.argwhere(present)
    lut = np.zeros(present.shape, dtype=np.int64)
    lut[pairs[:, 0], pairs[:, 1]] = np.arange(len(pairs))
    inverse = lut[k_idx, n_idx] if n else np.empty(0, dtype=np.int64)

    cls_labels: list[str] = []
    sub_labels: list[str] = []
    rule_labels: list[str] = []
    for k, nm in pairs.tolist():
        k_str = str(kind_cats[k - 1]) if k > 0 else ""
        n_str = str(name_cats[nm - 1]) if nm > 0 else ""
        c, s, r = classify_name(k_str, n_str)
        cls_labels.append(c)
        sub_labels.append(s)
        rule_labels.append(r)

    out["cls"] = _categorical(cls_labels, inverse, fixed=CLASSES)
    out["subclass"] = _categorical(sub_labels, inverse)
    out["rule"] = _categorical(rule_labels, inverse)
    decided = np.zeros(n, dtype=np.int32)
    launched_by = collective_launch_ops(events) if n else np.zeros(0, dtype=np.int64)
    hit = np.flatnonzero(launched_by >= 0)
    if len(hit):
        _by_launching_op(out, events, hit, launched_by[hit])
        decided[hit] = 1
    out["decided_by"] = pd.Categorical.from_codes(decided, categories=list(DECIDED_BY))
    return out


def _by_launching_op(out: pd.DataFrame, events: pd.DataFrame, rows: np.ndarray, ops: np.ndarray) -> None:
    """Kernels at positions `rows`, launched by the collective host ops at positions `ops`: class
    collective (subclass from the op, rule kept when the name rule says collective too), and the
    op's collective, bytes and dtype where the kernel has none."""
    op_names = str_values(events["name"])[ops]
    already = out["cls"].to_numpy()[rows] == "collective"
    change = rows[~already]
    if len(change):
        subs = np.array([launch_op_subclass(str(nm)) for nm in op_names[~already]], dtype=object)
        for col, values in (
            ("cls", np.full(len(change), "collective", dtype=object)),
            ("subclass", subs),
            ("rule", np.full(len(change), LAUNCHING_OP_RULE, dtype=object)),
        ):
            cat = out[col].astype("category")
            new_cats = [c for c in dict.fromkeys(values.tolist()) if c not in cat.cat.categories]
            if new_cats:
                cat = cat.cat.add_categories(new_cats)
            cat.iloc[change] = values
            out[col] = cat
    # the collective, bytes and dtype of the launching op where the kernel has none
    coll_op = _strs(out, "coll_op")
    op_coll = _strs(events, "coll_op")[ops]
    want_op = coll_op[rows] == ""
    if want_op.any():
        fill = np.array(
            [o if o else launch_op_collective(str(nm)) for o, nm in zip(op_coll, op_names, strict=True)],
            dtype=object,
        )
        coll_op[rows[want_op]] = fill[want_op]
        out["coll_op"] = pd.Categorical(coll_op)
    for col in ("coll_in_bytes", "coll_out_bytes"):
        vals = _ints(out, col).copy()
        src = _ints(events, col)[ops]
        take = (vals[rows] < 0) & (src >= 0)
        if take.any():
            vals[rows[take]] = src[take]
            out[col] = vals
    dt = _strs(out, "coll_dtype")
    src_dt = _strs(events, "coll_dtype")[ops]
    take_dt = (dt[rows] == "") & (src_dt != "")
    if take_dt.any():
        dt[rows[take_dt]] = src_dt[take_dt]
        out["coll_dtype"] = pd.Categorical(dt)


def _strs(frame: pd.DataFrame, col: str) -> np.ndarray:
    """Column `col` as strings; a column the table lacks reads as missing ("") everywhere."""
    if col in frame.columns:
        return str_values(frame[col])
    return np.full(len(frame), "", dtype=object)


def _ints(frame: pd.DataFrame, col: str) -> np.ndarray:
    """Integer column `col`; a column the table lacks reads as missing (-1) everywhere."""
    if col in frame.columns:
        return frame[col].to_numpy(np.int64)
    return np.full(len(frame), -1, dtype=np.int64)


def _categorical(
    labels: list[str], inverse: np.ndarray, fixed: tuple[str, ...] | None = None
) -> pd.Categorical:
    """Categorical whose i-th value is labels[inverse[i]], built from codes (no per-row strings)."""
    cats = list(fixed) if fixed is not None else sorted(set(labels))
    index = {c: i for i, c in enumerate(cats)}
    label_codes = np.array([index[label] for label in labels], dtype=np.int32)
    codes = label_codes[inverse] if len(inverse) else np.empty(0, dtype=np.int32)
    return pd.Categorical.from_codes(codes, categories=cats)
