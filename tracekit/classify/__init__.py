"""The classifier: one class per event from the ordered rule table in `rules.py`.

`classify(events)` returns a copy of the event table with three more categorical columns:
`cls`, `subclass` and `rule` (see docs/ARCHITECTURE.md). Each distinct (kind, name) pair is
classified once and the result mapped back through the categorical codes, so the cost is the
number of distinct names, not the number of events.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracekit.classify.rules import CLASSES, GPU_KINDS, RULES, UNKNOWN, Rule, match, matching_rules

__all__ = ["CLASSES", "GPU_KINDS", "RULES", "Rule", "classify", "classify_name", "match", "matching_rules"]


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
    n_names = max(len(name_cats), 1) + 1
    # -1 codes (NaN) shift to 0 and read as ""
    pair = (kind_codes + 1) * n_names + (name_codes + 1)
    uniq, inverse = (
        np.unique(pair, return_inverse=True) if n else (np.empty(0, np.int64), np.empty(0, np.int64))
    )

    cls_labels: list[str] = []
    sub_labels: list[str] = []
    rule_labels: list[str] = []
    for key in uniq.tolist():
        k, nm = divmod(int(key), n_names)
        k_str = str(kind_cats[k - 1]) if k > 0 else ""
        n_str = str(name_cats[nm - 1]) if nm > 0 else ""
        c, s, r = classify_name(k_str, n_str)
        cls_labels.append(c)
        sub_labels.append(s)
        rule_labels.append(r)

    out["cls"] = _categorical(cls_labels, inverse, fixed=CLASSES)
    out["subclass"] = _categorical(sub_labels, inverse)
    out["rule"] = _categorical(rule_labels, inverse)
    return out


def _categorical(
    labels: list[str], inverse: np.ndarray, fixed: tuple[str, ...] | None = None
) -> pd.Categorical:
    """Categorical whose i-th value is labels[inverse[i]], built from codes (no per-row strings)."""
    cats = list(fixed) if fixed is not None else sorted(set(labels))
    index = {c: i for i, c in enumerate(cats)}
    label_codes = np.array([index[label] for label in labels], dtype=np.int32)
    codes = label_codes[inverse] if len(inverse) else np.empty(0, dtype=np.int32)
    return pd.Categorical.from_codes(codes, categories=cats)
