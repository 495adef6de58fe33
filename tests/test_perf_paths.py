"""The fast paths of issue 7 give the same answers as slow, obviously-correct oracles.

- `parse_us_to_ns` (vectorised, with a fixed-layout matrix-product fast path) against Python's
  `Decimal` on random texts, as bytes and as the `msgspec.Raw` values the reader passes it.
- `rank_selectors` against a plain boolean mask, for grouped and shuffled rank columns.
- `partition_steps` / `breakdown` do not depend on the row order of the event table (the
  per-rank slices are only a shortcut).
- `concat_runs` keeps every string of every rank when the ranks' categories differ.
- gzip inflated in a helper thread: several members + padding, early stop, errors in order.
"""

from __future__ import annotations

import gzip
import random
import threading
from decimal import Decimal
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd
import pytest

from tracekit.analyse.timeline.breakdown import breakdown
from tracekit.analyse.timeline.partition import cat_mask, partition_steps, rank_selectors
from tracekit.analyse.timeline.steps import find_steps
from tracekit.classify import classify
from tracekit.classify.rules import COMM_LIKE_HINT
from tracekit.errors import TraceFormatError
from tracekit.model.events import Run, make_events
from tracekit.read import concat_runs
from tracekit.read.kineto import parse_us_to_ns, read_kineto
from tracekit.read.kineto_blocks import FileProgress, iter_blocks

INT64_MAX = 2**63 - 1
_TsStruct = msgspec.defstruct("_TsStruct", [("ts", msgspec.Raw)])


def _raws(texts: list[bytes]) -> list[msgspec.Raw]:
    doc = b"[" + b",".join(b'{"ts":%s}' % t for t in texts) + b"]"
    return [e.ts for e in msgspec.json.decode(doc, type=list[_TsStruct])]


def _oracle(texts: list[bytes]) -> tuple[list[int], list[bool], int]:
    """Exact ns by Decimal; values that do not fit int64 are invalid; sub-ns digits counted."""
    ns: list[int] = []
    ok: list[bool] = []
    sub = 0
    for t in texts:
        v = Decimal(t.decode()) * 1000
        fits = abs(int(v)) <= INT64_MAX
        ns.append(int(v) if fits else 0)
        ok.append(fits)
        sub += int(fits and v != v.to_integral_value())
    return ns, ok, sub


@pytest.mark.parametrize("layout", ["fixed", "mixed"])
def test_parse_us_to_ns_matches_decimal(layout: str) -> None:
    rng = random.Random(7 if layout == "fixed" else 11)
    for _ in range(150):
        n = rng.randint(1, 40)
        int_len, decimals = rng.randint(1, 16), rng.randint(0, 5)
        texts = []
        for _ in range(n):
            if layout == "fixed":  # one layout for all rows, like Kineto's "%.3f"
                ip = str(rng.randint(10 ** (int_len - 1), 10**int_len - 1))
                nd = decimals
            else:
                ip = str(rng.randint(0, 10 ** rng.randint(1, 16)))
                nd = rng.randint(0, 5)
            s = ip + ("." + "".join(rng.choice("0123456789") for _ in range(nd)) if nd else "")
            if layout == "mixed" and rng.random() < 0.1:
                s = "-" + s
            texts.append(s.encode())
        want_ns, want_ok, want_sub = _oracle(texts)
        for given in (texts, _raws(texts)):
            ns, ok, sub = parse_us_to_ns(given)
            assert ok.tolist() == want_ok, texts
            assert np.where(ok, ns, 0).tolist() == want_ns, texts
            assert sub == want_sub, texts


def test_parse_us_to_ns_edge_cases() -> None:
    texts = [b"1712195495519695.123", b"9300000000000000.000", b"1.5e3", b'"12.5"', b"null", b".", b""]
    ns, ok, sub = parse_us_to_ns(texts)
    # epoch-us with 3 decimals fits int64 exactly; 9.3e18 ns does not; exponent via Decimal;
    # a string number is accepted; null / "." / empty are not numbers
    assert ok.tolist() == [True, False, True, True, False, False, False]
    assert ns[0] == 1712195495519695123 and ns[2] == 1_500_000 and ns[3] == 12_500
    assert sub == 0
    # a fixed layout with 4 decimals: the 4th digit is below 1 ns, dropped and counted
    ns, ok, sub = parse_us_to_ns([b"1.2345", b"6.7890", b"0.0001"])
    assert ns.tolist() == [1234, 6789, 0] and ok.all() and sub == 2


@pytest.mark.parametrize("shuffle", [False, True])
def test_rank_selectors_equal_masks(shuffle: bool) -> None:
    rng = np.random.default_rng(3)
    ranks = np.repeat(np.array([0, 2, 5, 7]), [10, 1, 30, 4])
    if shuffle:
        rng.shuffle(ranks)
    sel = rank_selectors(ranks)
    assert sorted(sel) == [0, 2, 5, 7]
    for r, s in sel.items():
        got = np.zeros(len(ranks), bool)
        got[s] = True
        assert np.array_equal(got, ranks == r)
    assert rank_selectors(np.zeros(0, np.int64)) == {}


def test_cat_mask_on_codes_equals_isin() -> None:
    s = pd.Series(pd.Categorical(["kernel", "runtime", "", "memcpy", "kernel"]))
    s2 = s.cat.set_categories(["kernel", "runtime", "memcpy"])  # "" becomes missing (code -1)
    for col in (s, s2, s.astype(str)):
        assert cat_mask(col, ("kernel", "memcpy")).tolist() == col.isin(["kernel", "memcpy"]).tolist()


def _two_rank_table() -> pd.DataFrame:
    """Two ranks with steps, kernels on two streams, a sync: hand-made, with overlaps."""
    rows = []
    for r in (0, 1):
        off = 1000 * r
        rows += [
            ("annotation", "ProfilerStep#1", 0, 100),
            ("annotation", "ProfilerStep#2", 100, 200),
            ("kernel", "ampere_sgemm_32x128_nt", 10 + off % 7, 60),
            ("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float", 40, 90),
            ("memcpy", "Memcpy DtoD (Device -> Device)", 120, 130),
            ("kernel", "mystery_allreduce_xyz", 150, 170 + r),  # looks like communication: unknown
            ("sync", "Stream Sync", 175, 190),
        ]
    n = len(rows)
    return make_events(
        {
            "rank": np.repeat([0, 1], n // 2),
            "device": [0 if k != "annotation" and k != "sync" else -1 for k, *_ in rows],
            "stream": [7] * n,
            "kind": [k for k, *_ in rows],
            "name": [nm for _, nm, *_ in rows],
            "start_ns": [a for *_, a, _ in rows],
            "end_ns": [b for *_, b in rows],
        }
    )


def test_partition_and_breakdown_do_not_depend_on_row_order() -> None:
    ev = _two_rank_table()
    shuffled = ev.iloc[np.random.default_rng(5).permutation(len(ev))].reset_index(drop=True)
    a = classify(ev)
    b = classify(shuffled)
    pa = partition_steps(a, find_steps(a))
    pb = partition_steps(b, find_steps(b))
    pd.testing.assert_frame_equal(pa, pb)
    # hand-computed rank 0, step 1 [0, 100): compute 10..60 (50), collective 60..90 (30), idle 20
    row = pa[(pa["rank"] == 0) & (pa["step"] == 1)].iloc[0]
    assert (row["compute_ns"], row["collective_ns"], row["idle_ns"]) == (50, 30, 20)
    assert row["overlapped_collective_ns"] == 20
    ba = breakdown(Run(events=ev, sources={0: "a", 1: "b"}))
    bb = breakdown(Run(events=shuffled, sources={0: "a", 1: "b"}))
    assert ba.kernels_by_class == bb.kernels_by_class
    assert ba.kernels_by_class["unknown"] == {"count": 2, "total_ns": 20 + 21}
    assert (
        msgspec.to_builtins(ba.unknown_kernels)
        == msgspec.to_builtins(bb.unknown_kernels)
        == [{"name": "mystery_allreduce_xyz", "count": 2, "total_ns": 41, "hint": COMM_LIKE_HINT}]
    )


def test_concat_runs_keeps_strings_across_different_categories() -> None:
    def one(rank: int, names: list[str], coll: list[str]) -> Run:
        ev = make_events(
            {
                "rank": [rank] * len(names),
                "kind": ["kernel"] * len(names),
                "name": names,
                "start_ns": np.arange(len(names)),
                "end_ns": np.arange(len(names)) + 1,
                "coll_op": coll,
            }
        )
        return Run(events=ev, sources={rank: f"r{rank}"})

    r1 = one(1, ["b", "c", "b"], ["", "all_reduce", ""])
    r0 = one(0, ["a", "b"], ["all_gather", ""])
    out = concat_runs([r1, r0]).events
    assert out["rank"].tolist() == [0, 0, 1, 1, 1]  # ordered by rank
    assert out["name"].astype(str).tolist() == ["a", "b", "b", "c", "b"]
    assert out["coll_op"].astype(str).tolist() == ["all_gather", "", "", "all_reduce", ""]
    assert str(out["name"].dtype) == "category"


# ------------------------------------------------------------------------------------------------
# gzip inflated in a helper thread


@pytest.fixture
def h200(real_kineto_file: Path) -> Path:
    """A real H200 rank file of the project's own (conftest.real_kineto_file)."""
    return real_kineto_file


def test_gzip_members_and_padding_equal_plain_json(h200: Path, tmp_path: Path) -> None:
    """The same JSON as plain text, as one gzip member, and split over three members + zero
    padding (what concatenated / padded .gz files look like) gives the same table."""
    raw = gzip.decompress(h200.read_bytes())
    plain = tmp_path / "rank-0.json"
    plain.write_bytes(raw)
    multi = tmp_path / "rank-0.json.gz"
    third = len(raw) // 3
    multi.write_bytes(
        gzip.compress(raw[:third])
        + gzip.compress(raw[third : 2 * third])
        + gzip.compress(raw[2 * third :])
        + b"\0" * 512
    )
    a = read_kineto(plain)
    b = read_kineto(multi, chunk_bytes=8192)
    pd.testing.assert_frame_equal(a.events, b.events)
    assert a.data_quality.counts == b.data_quality.counts


def test_gunzip_thread_stops_when_the_reader_stops(h200: Path) -> None:
    """Closing the block iterator early (an error in the reader) ends the helper thread."""
    before = {t.ident for t in threading.enumerate()}
    blocks = iter_blocks(h200, FileProgress())
    first = next(blocks)
    assert first.lstrip().startswith(b"{")
    blocks.close()
    left = [t for t in threading.enumerate() if t.ident not in before and t.name == "tracekit-gunzip"]
    assert not left


def test_gunzip_thread_raises_in_order(h200: Path, tmp_path: Path) -> None:
    """A truncated gzip: the blocks before the cut arrive, then the TraceFormatError."""
    data = h200.read_bytes()
    bad = tmp_path / "rank-0.json.gz"
    bad.write_bytes(data[: len(data) // 2])
    got = bytearray()
    with pytest.raises(TraceFormatError, match="truncated gzip"):
        for block in iter_blocks(bad, FileProgress()):
            got += block
    assert len(got) > 0 and gzip.decompress(data).startswith(bytes(got))
