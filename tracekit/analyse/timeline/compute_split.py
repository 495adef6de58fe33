"""Matrix vs vector compute per step (docs/METHOD.md sections "Classes" and "Intra-SM balance").

The classifier's compute subclasses (`tracekit/classify/rules.py`: `matrix` = GEMM, attention,
convolution, tensor-core work; `vector` = elementwise, norms, activations, dequantisation, CUDA-core
work) split the partition's compute part of each step window exactly: `matrix_ns` is the time under
at least one matrix kernel inside the window, `vector_ns` the rest of the compute part. On a CPU-only
run (host timeline) the matrix ops are the aten matrix products and attention (`HOST_MATRIX_OPS`).
Used by `tracekit breakdown` (per step) and `tracekit decompose` (per class).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from tracekit.analyse import intervals
from tracekit.analyse.timeline.partition import cat_mask, rank_selectors
from tracekit.classify.rules import GPU_KINDS

#: Host-timeline (CPU-only run) ops that are matrix products.
HOST_MATRIX_OPS = re.compile(
    r"^aten::(?:mm|addmm|bmm|baddbmm|addbmm|matmul|linear|mv|addmv|einsum|_?scaled_dot_product\w*"
    r"|_scaled_mm|_int_mm|_weight_int\w*mm\w*)$"
)


def _matches(names: pd.Series, pattern: re.Pattern[str]) -> np.ndarray:
    """`pattern` matches each name; once per category for a categorical column."""
    if isinstance(names.dtype, pd.CategoricalDtype):
        cats = names.cat.categories
        hit = np.zeros(len(cats) + 1, dtype=bool)  # last entry: code -1 (missing)
        hit[: len(cats)] = [bool(pattern.match(str(c))) for c in cats]
        return hit[names.cat.codes.to_numpy()]
    return np.array([bool(pattern.match(str(n))) for n in names], dtype=bool)


def compute_split(classified: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step) window of `steps` (columns rank, step, start_ns, end_ns, compute_ns): the
    compute part split into `matrix_ns` (time under a matrix kernel, or a matrix op on a host
    timeline, inside the window) and `vector_ns` = compute_ns - matrix_ns. Exact integers; matrix
    intervals are a subset of the partition's compute layer, so 0 <= matrix_ns <= compute_ns."""
    ev_rank = classified["rank"].to_numpy(np.int64)
    selectors = rank_selectors(ev_rank)
    out = []
    for r in sorted(int(x) for x in pd.unique(steps["rank"])):
        st = steps[steps["rank"] == r]
        ev = classified.iloc[selectors.get(r, np.zeros(0, dtype=np.int64))]
        gpu = cat_mask(ev["kind"], GPU_KINDS)
        if gpu.any():
            sel = gpu & cat_mask(ev["cls"], {"compute"}) & cat_mask(ev["subclass"], {"matrix"})
        else:
            sel = cat_mask(ev["kind"], {"cpu_op"}) & _matches(ev["name"], HOST_MATRIX_OPS)
        s = ev["start_ns"].to_numpy(np.int64)[sel]
        e = ev["end_ns"].to_numpy(np.int64)[sel]
        ms, me = intervals.union(s, e, drop_empty=False)
        a = st["start_ns"].to_numpy(np.int64)
        b = st["end_ns"].to_numpy(np.int64)
        matrix = intervals.covered(ms, me, a, b) if len(ms) else np.zeros(len(st), dtype=np.int64)
        compute = st["compute_ns"].to_numpy(np.int64)
        matrix = np.minimum(matrix, compute)
        out.append(
            pd.DataFrame(
                {
                    "rank": r,
                    "step": st["step"].to_numpy(np.int64),
                    "matrix_ns": matrix,
                    "vector_ns": compute - matrix,
                }
            )
        )
    if not out:
        return pd.DataFrame(columns=["rank", "step", "matrix_ns", "vector_ns"])
    return pd.concat(out, ignore_index=True)
