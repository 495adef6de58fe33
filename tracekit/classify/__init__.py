"""The classifier: one class per event from the ordered rule table in `rules.py`.

`classify(events)` returns a copy of the event table with three more categorical columns:
`cls`, `subclass` and `rule` (see docs/ARCHITECTURE.md). Each distinct (kind, name) pair is
classified once and the result mapped back through the categorical codes, so the regex cost is the
number of distinct names, and the per-event cost a few array lookups.
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
