"""The event table's string columns read once per distinct value.

`col.astype(str)` on a categorical column builds one Python string per row (pandas' Arrow-backed
`str` dtype: tens of milliseconds for a rank's 80k events, paid again at every call); these read the
categories (or the factorized values) once and index them by the codes. Each gives what pandas' own
per-row conversion gives (tests/test_graph.py checks them against it on committed runs)."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

import numpy as np
import pandas as pd


def _codes(col: pd.Series) -> tuple[np.ndarray, Sequence[object]]:
    """Per row the code of its value (-1: missing) and the distinct values: a categorical's codes
    and categories, else the column factorized."""
    arr = col.array
    if isinstance(arr, pd.Categorical):
        return np.asarray(arr.codes, dtype=np.int64), arr.categories
    codes, uniq = pd.factorize(col)
    return codes, uniq


def str_values(col: pd.Series) -> np.ndarray:
    """`col.astype(str).to_numpy()` with each distinct value converted once: the same object array,
    missing values NaN as there (the event table has none)."""
    codes, uniq = _codes(col)
    return np.asarray([str(u) for u in uniq] + [np.nan], dtype=object)[codes]


def str_isin(col: pd.Series, values: Collection[str]) -> np.ndarray:
    """`col.astype(str).isin(values).to_numpy()`, each distinct value looked up once."""
    codes, uniq = _codes(col)
    return np.asarray([str(u) in values for u in uniq] + [False], dtype=bool)[codes]


def str_flags(col: pd.Series, pattern: re.Pattern[str], search: bool = False) -> np.ndarray:
    """Per row: whether `pattern` matches (`search`: anywhere in) the value as a string, one regex
    call per distinct value; a missing value does not match."""
    codes, uniq = _codes(col)
    f = pattern.search if search else pattern.match
    return np.asarray([bool(f(str(u))) for u in uniq] + [False], dtype=bool)[codes]
