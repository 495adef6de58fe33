"""A GPU rank's host chain (tracekit/analyse/path/gpu_host.py): `host_chain` on arrays is the
chain's definition item by item (`_reference` below), on the committed GPU runs' ranks and on
random threads of calls and markers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tracekit.analyse.path.gpu_rank as gpu_rank
from tracekit.analyse.path import roles as r
from tracekit.analyse.path.gpu_host import HostChain, ThreadItems, host_chain

TRACES = Path(__file__).resolve().parents[1] / "traces"


def _reference(threads: list[tuple[int, ThreadItems]], **kw: Any) -> HostChain:
    """The chain item by item: the state (latest end, its node; the previous item's begin) carried
    through each thread's items in turn, a marker resetting it, a call moving it where it ends no
    earlier; per step a running count of the matched-collective launches."""
    main, lo, off, n_ev, n_steps = kw["main"], kw["lo"], kw["off"], kw["n_ev"], kw["n_steps"]
    end, sync_like, launches_coll = kw["end"], kw["sync_like"], kw["launches_coll"]
    tl: list[int] = []
    el: list[tuple[int, ...]] = []
    call_begin = np.full(n_ev, -1, dtype=np.int64)
    call_end = np.full(n_ev, -1, dtype=np.int64)
    call_edge = np.full(n_ev, -1, dtype=np.int64)
    ws_node = np.zeros(n_steps, dtype=np.int64)
    ae_node = np.zeros(n_steps, dtype=np.int64)
    coll_launches = [0] * n_steps
    for ti, (th, it) in enumerate(threads):
        prev_node, prev_t, prev_begin_node, prev_begin_t = 0, lo, 0, lo
        for j in range(len(it.s)):
            s_i, typ, idx = int(it.s[j]), int(it.typ[j]), int(it.idx[j])
            nf, k, in_w = int(kw["n_fold"][ti][j]), int(kw["step_of"][ti][j]), bool(kw["in_window"][ti][j])
            role = r.ROLE_GAP if typ != 1 and in_w else r.ROLE_GAP_OUT
            seg = k * 100_000 + coll_launches[k]
            if s_i >= prev_t:
                src, gap = prev_node, s_i - prev_t
            else:
                src, gap = prev_begin_node, max(s_i - prev_begin_t, 0)
            tl.append(s_i - off)
            nb = len(tl)  # node 0 is the origin
            if j == 0 and th != main:
                el.append((0, nb, s_i - lo, r.ROLE_ORIGIN, r.K_HOST, -1, nf, 0, -1))
            else:
                el.append((src, nb, gap, role, r.K_HOST, seg, nf, 0, -1))
            if typ == 0:
                ce, lc = int(end[idx]), bool(launches_coll[idx])
                tl.append(ce - off)
                ne = len(tl)
                call_begin[idx], call_end[idx], call_edge[idx] = nb, ne, len(el)
                if sync_like[idx]:
                    el.append((nb, ne, ce - s_i, r.ROLE_SYNC, r.K_SYNC, seg, 1, 0, -1))
                else:
                    el.append((nb, ne, ce - s_i, r.ROLE_CALL, r.K_HOST, seg, 1, int(lc), -1))
                if lc:
                    coll_launches[k] += 1
                prev_begin_node, prev_begin_t = nb, s_i
                if ce >= prev_t:
                    prev_node, prev_t = ne, ce
            else:
                (ws_node if typ == 1 else ae_node)[idx] = nb
                prev_begin_node, prev_begin_t = nb, s_i
                prev_node, prev_t = nb, s_i
    return HostChain(
        np.asarray(tl, dtype=np.int64),
        np.asarray(el, dtype=np.int64).reshape(-1, 9),
        call_begin,
        call_end,
        call_edge,
        ws_node,
        ae_node,
    )


def _same(got: HostChain, want: HostChain) -> None:
    for f in ("t", "e", "call_begin", "call_end", "call_edge", "ws_node", "ae_node"):
        assert np.array_equal(getattr(got, f), getattr(want, f)), f


@pytest.mark.parametrize(
    "run", ["h200-tp2", "h200x2-tp2-b1-graphs", "h200-tp2-nsys", "h200-tp1-graphs-compile"]
)
def test_the_chain_of_the_committed_ranks_is_the_item_by_item_one(
    run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rank of four committed GPU runs (eager and CUDA graphs, Kineto and Nsight)."""
    from tracekit.analyse.attribution.plan import attribution_plan
    from tracekit.analyse.plans import run_in_process
    from tracekit.read import read_run

    seen: list[int] = []
    own = gpu_rank.host_chain

    def both(threads: Any, **kw: Any) -> HostChain:
        got = own(threads, **kw)
        _same(got, _reference(threads, **kw))
        seen.append(len(got.t))
        return got

    monkeypatch.setattr(gpu_rank, "host_chain", both)
    run_in_process(attribution_plan(), read_run([str(TRACES / run)]))
    assert seen and min(seen) > 100


@pytest.mark.parametrize("seed", range(40))
def test_the_chain_of_random_threads_is_the_item_by_item_one(seed: int) -> None:
    """Random threads: calls that nest in the one before, end before it or at its end, markers
    between them, threads without markers first and last, collective launches in several steps."""
    rng = np.random.default_rng(seed)
    n_ev, n_steps = 300, int(rng.integers(1, 5))
    start = np.sort(rng.integers(0, 10_000, size=n_ev))
    end = start + rng.integers(0, 300, size=n_ev) * (rng.random(n_ev) < 0.9)
    threads = []
    for th in range(int(rng.integers(1, 4))):
        pick = np.sort(rng.choice(n_ev, size=int(rng.integers(1, 40)), replace=False))
        s, typ, idx = start[pick], np.zeros(len(pick), dtype=np.int64), pick.astype(np.int64)
        if th == 1 or rng.random() < 0.3:  # the main thread: markers among its calls
            ms = np.sort(rng.integers(0, 10_000, size=2 * n_steps))
            s = np.concatenate((s, ms))
            typ = np.concatenate((typ, np.tile([1, 2], n_steps)))
            idx = np.concatenate((idx, np.repeat(np.arange(n_steps), 2)))
            o = np.argsort(s, kind="stable")
            s, typ, idx = s[o], typ[o], idx[o]
        threads.append((th, ThreadItems(s, typ, idx)))
    kw = {
        "main": 1,
        "lo": int(rng.integers(-100, 100)),
        "off": 7,
        "n_ev": n_ev,
        "n_steps": n_steps,
        "end": end,
        "sync_like": rng.random(n_ev) < 0.2,
        "launches_coll": rng.random(n_ev) < 0.3,
        "n_fold": [rng.integers(0, 3, size=len(it.s)) for _, it in threads],
        "step_of": [rng.integers(0, n_steps, size=len(it.s)) for _, it in threads],
        "in_window": [rng.random(len(it.s)) < 0.7 for _, it in threads],
    }
    _same(host_chain(threads, **kw), _reference(threads, **kw))
