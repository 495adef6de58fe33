"""The kernels a fused all-reduce + add + norm kernel removes (`allreduce_norm=fused`;
`tracekit.analyse.retime`): per graph edge, whether it is one."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from tracekit.analyse.path.graph import Graph
from tracekit.analyse.path.roles import K_COMPUTE, ROLE_OP
from tracekit.model.strings import str_flags, str_values

#: An all-reduce kernel by its name, where the event carries no collective metadata (a graph replay's
#: NCCL kernel): ncclDevKernel_AllReduce_Sum_bf16_RING_LL, cross_device_reduce_1stage (vLLM)
_ALL_REDUCE_NAME = re.compile(r"(?i)all_?reduce|cross_device_reduce|one_?shot|two_?shot")


def norm_after_all_reduce(g: Graph, events: pd.DataFrame | None) -> np.ndarray | None:
    """Per edge of `g`: True for the device time of a vector compute kernel that runs, on its rank
    in device start order, after an all-reduce and before the next matrix kernel or collective
    (what `allreduce_norm=fused` removes: the residual add and norm the all-reduce feeds). The
    kernels are found in the classified `events` and matched to the graph's operation edges by
    rank, start and end. None when there are none."""
    if events is None or not len(events):
        return None
    kind = str_values(events["kind"])
    dev = np.isin(kind, ("kernel", "memcpy", "memset"))
    if not dev.any():
        return None
    ev = events[dev]
    cls = str_values(ev["cls"])
    sub = str_values(ev["subclass"])
    op = str_values(ev["coll_op"])
    named = str_flags(ev["name"], _ALL_REDUCE_NAME, search=True)
    ar = (cls == "collective") & ((op == "all_reduce") | ((op == "") & named))
    stop = ((cls == "compute") & (sub == "matrix")) | ((cls == "collective") & ~ar)
    vec = (cls == "compute") & (sub != "matrix")
    df = pd.DataFrame(
        {
            "rank": ev["rank"].to_numpy(np.int64),
            "start": ev["start_ns"].to_numpy(np.int64),
            "end": ev["end_ns"].to_numpy(np.int64),
            "mark": np.where(ar, 1.0, np.where(stop, 0.0, np.nan)),
            "vec": vec,
        }
    ).sort_values(["rank", "start", "end"], kind="stable")
    armed = df.groupby("rank")["mark"].transform(lambda m: m.ffill().shift(1)).to_numpy()
    hit = df[df["vec"].to_numpy() & (armed == 1.0)]
    if not len(hit):
        return None
    ops = np.flatnonzero((g.role == ROLE_OP) & (g.kind == K_COMPUTE))
    off = np.asarray([g.offsets.get(int(r), 0) for r in g.erank[ops]], dtype=np.int64)
    edges = pd.DataFrame(
        {
            "rank": g.erank[ops].astype(np.int64),
            "start": g.t[g.src[ops]].astype(np.int64) + off,
            "end": g.t[g.dst[ops]].astype(np.int64) + off,
            "edge": ops,
        }
    )
    matched = edges.merge(hit[["rank", "start", "end"]].drop_duplicates(), on=["rank", "start", "end"])
    if not len(matched):
        return None
    mask = np.zeros(len(g.role), dtype=bool)
    mask[matched["edge"].to_numpy(np.int64)] = True
    return mask
