"""Which events are one collective call's interval on each rank (docs/METHOD.md section Wait and transfer).

- which events are the collective intervals (`level`): GPU collective kernels when the run has
  any; otherwise, on CPU-only (gloo) runs, the `gloo:<op>` ranges the gloo worker threads record
  around the actual exchange (the caller's `c10d::allreduce_` op only enqueues the work and
  returns); otherwise the outermost host collective ops (`c10d::*`, `record_param_comms`,
  `nccl:*`), nested ones dropped. One interval per rank per collective call.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from tracekit.model.ops import COLLECTIVE_OPS
from tracekit.model.strings import str_flags, str_isin

#: Name patterns -> normalised op, tried in order (the first match wins). Used when `coll_op` is empty.
_OP_PATTERNS: tuple[tuple[str, str], ...] = (
    # custom all-reduce kernels whose names do not say all-reduce (vLLM / SGLang's
    # cross_device_reduce_1stage, TensorRT-LLM's Lamport kernels rmsNormLamport)
    (r"cross_device_reduce|lamport", "all_reduce"),
    (r"reduce_?scatter", "reduce_scatter"),
    (r"all_?gather", "all_gather"),
    (r"all_?reduce", "all_reduce"),
    (r"all_?to_?all", "all_to_all"),
    (r"send_?recv", "send_recv"),
    (r"broadcast", "broadcast"),
    (r"barrier", "barrier"),
    (r"(?<![a-z])reduce", "reduce"),
    (r"gather", "gather"),
    (r"scatter", "scatter"),
    (r"(?<![a-z])send", "send"),
    (r"(?<![a-z])recv", "recv"),
)

_GPU_COLLECTIVE_NAME = re.compile(
    r"nccl|rccl|cross_device_reduce|multimem_all_reduce|allreduce", re.IGNORECASE
)
_HOST_COLLECTIVE_NAME = re.compile(r"^(?:c10d::|record_param_comms$|nccl:|gloo:)")
_GLOO_RANGE = re.compile(re.escape("gloo:"))
_GPU_KINDS = ("kernel",)
KNOWN_OPS = frozenset(COLLECTIVE_OPS)

#: What a level's collective interval is called in messages.
LEVEL_WORDS = {
    "gpu_kernel": "collective kernels",
    "gloo": "gloo collective ranges",
    "host_op": "host collective ops",
}


# --------------------------------------------------------------------------------------------
# selecting one interval per rank per collective call


def normalise_op(names: pd.Series, coll_op: pd.Series | None = None) -> np.ndarray:
    """The normalised op per row: `coll_op` where set, else parsed from the name ("" if none)."""
    names_l = names.astype(str).str.lower()
    out = np.full(len(names), "", dtype=object)
    todo = np.ones(len(names), dtype=bool)
    if coll_op is not None:
        given = coll_op.astype(str).to_numpy()
        has = given != ""
        out[has] = given[has]
        todo &= ~has
    for pattern, op in _OP_PATTERNS:
        if not todo.any():
            break
        hit = todo & names_l.str.contains(pattern, regex=True).to_numpy()
        out[hit] = op
        todo &= ~hit
    return out


def _outermost(df: pd.DataFrame) -> np.ndarray:
    """Mask of rows not contained in an earlier row of the same (rank, stream). `df` sorted by
    rank, stream, start_ns, -end_ns."""
    if df.empty:
        return np.zeros(0, dtype=bool)
    keys = df["rank"].astype(np.int64).to_numpy() * (1 << 40) + pd.factorize(df["stream"])[0]
    end = pd.Series(df["end_ns"].to_numpy(np.int64))
    # the latest end among the earlier rows of the same (rank, stream); a row ending no later is
    # inside one of them (sorted by start, so that row started no later either)
    prev_max = end.groupby(keys).cummax().groupby(keys).shift(1)
    nested = (prev_max.notna() & (end <= prev_max.fillna(-1))).to_numpy()
    return ~nested


def select_collective_events(events: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The collective intervals of a run, one per rank per collective call, and the level used.

    Returns a frame with columns rank, stream, name, op, start_ns, end_ns, coll_* and `event_index`.
    """
    name = events["name"]
    gpu = events["device"].to_numpy() >= 0
    gpu &= str_isin(events["kind"], _GPU_KINDS)
    if "cls" in events.columns:
        gpu &= str_isin(events["cls"], {"collective"})
    else:
        gpu &= str_flags(name, _GPU_COLLECTIVE_NAME, search=True)
    host = events["device"].to_numpy() < 0
    gloo = host & str_flags(name, _GLOO_RANGE)
    hostop = host & str_flags(name, _HOST_COLLECTIVE_NAME, search=True) & ~gloo

    if gpu.any():
        sel, level = events[gpu], "gpu_kernel"
    elif gloo.any():
        sel, level = events[gloo], "gloo"
    elif hostop.any():
        sel = events[hostop].sort_values(
            ["rank", "stream", "start_ns", "end_ns"], ascending=[True, True, True, False]
        )
        sel, level = sel[_outermost(sel)], "host_op"
    else:
        sel, level = events.iloc[0:0], "none"
    out = sel.copy()
    out["event_index"] = out.index.to_numpy()
    out["op"] = normalise_op(out["name"], out["coll_op"])
    return out.reset_index(drop=True), level
