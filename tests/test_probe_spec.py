"""Probe arithmetic against nccl-tests' own definitions (doc/PERFORMANCE.md, src/*.cu GetBw /
GetCollByteCount), computed independently here; and the fill / expected values against a numpy
simulation of each collective."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tracekit.errors import ProbeError
from tracekit.model.documents.links import ROW_FIELDS
from tracekit.probe import spec
from tracekit.probe.results import make_row, rows_from_csv
from tracekit.render.probe import format_table, rows_to_csv

NS = (1, 2, 3, 4, 8)


def perf_md_factor(op: str, n: int) -> float:
    # doc/PERFORMANCE.md "Summary"
    return {
        "all_reduce": 2 * (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_gather": (n - 1) / n,
        "alltoall": (n - 1) / n,
        "broadcast": 1.0,
        "reduce": 1.0,
        "sendrecv": 1.0,
    }[op]


def nccl_tests_algbw(op: str, param_count: int, typesize: int, sec: float, n: int) -> float:
    # each test's GetBw: the byte count from the count passed to NCCL (per-rank for the gathers)
    per_rank_total = op in ("all_gather", "reduce_scatter", "alltoall")
    return (param_count * typesize * (n if per_rank_total else 1)) / 1.0e9 / sec


@pytest.mark.parametrize("op", spec.COLLECTIVE_OPS)
@pytest.mark.parametrize("n", NS)
def test_bus_factor_matches_performance_md(op: str, n: int) -> None:
    assert spec.probe_factor(op, n) == pytest.approx(perf_md_factor(op, n), abs=0, rel=1e-15)


@pytest.mark.parametrize("op", spec.COLLECTIVE_OPS)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("size", (8, 1000, 4096, 1 << 20))
def test_row_bandwidth_is_nccl_tests(op: str, n: int, size: int) -> None:
    lay = spec.layout(op, size, n, 4)
    # count column: what nccl-tests passes to NCCL
    count = size // 4
    want_param = count // n if op in ("all_gather", "reduce_scatter", "alltoall") else count
    assert lay.param_count == want_param
    if lay.param_count == 0:
        # fewer elements than ranks: nccl-tests passes a zero count (no row to time); nothing more to check
        assert op in ("all_gather", "reduce_scatter", "alltoall") and count < n
        return
    # size column: max(send, recv) bytes = sendcount*4*n for the gathers (PERFORMANCE.md)
    want_size = want_param * 4 * (n if op in ("all_gather", "reduce_scatter", "alltoall") else 1)
    assert lay.size_bytes == want_size
    times = [10.0, 12.5, 20.0][: max(1, min(3, n))]
    row = make_row(
        op=op,
        lay=lay,
        backend="gloo",
        device="cpu",
        dtype="float32",
        in_place=False,
        time_us_per_rank=times,
        host_time_us_per_rank=[t + 1 for t in times],
        timer="host",
        wrong=0,
        iters=5,
        warmup=1,
    )
    avg = sum(times) / len(times)
    alg = nccl_tests_algbw(op, want_param, 4, avg * 1e-6, n)
    assert row.time_us == pytest.approx(avg)
    assert (row.time_us_min, row.time_us_max) == (min(times), max(times))
    assert row.algbw_gbps == pytest.approx(alg, rel=1e-12)
    assert row.busbw_gbps == pytest.approx(alg * perf_md_factor(op, n), rel=1e-12)
    host_avg = avg + 1
    assert row.host_busbw_gbps == pytest.approx(
        nccl_tests_algbw(op, want_param, 4, host_avg * 1e-6, n) * perf_md_factor(op, n)
    )
    assert row.correct is True and row.bytes == want_size and row.count == want_param


def _simulate(op: str, inputs: list[np.ndarray], n: int, c: int) -> list[np.ndarray | None]:
    """What each rank holds after the collective, computed directly from the inputs."""
    if op == "all_reduce":
        return [sum(inputs) for _ in range(n)]
    if op == "reduce":
        return [sum(inputs) if r == 0 else None for r in range(n)]
    if op == "broadcast":
        return [inputs[0].copy() for _ in range(n)]
    if op == "all_gather":
        return [np.concatenate(inputs) for _ in range(n)]
    if op == "reduce_scatter":
        total = sum(inputs)
        return [total[r * c : (r + 1) * c] for r in range(n)]
    if op == "alltoall":
        return [np.concatenate([inputs[j][r * c : (r + 1) * c] for j in range(n)]) for r in range(n)]
    if op == "sendrecv":
        return [inputs[(r - 1) % n].copy() for r in range(n)]
    raise AssertionError(op)


@pytest.mark.parametrize("op", spec.COLLECTIVE_OPS)
@pytest.mark.parametrize("n", (1, 2, 3, 5, 13))
def test_expected_output_matches_simulated_collective(op: str, n: int) -> None:
    lay = spec.layout(op, 4 * 97 * n, n, 4)

    def arange(a: int, b: int) -> np.ndarray:
        return np.arange(a, b, dtype=np.int64)

    inputs = [spec.input_values(op, r, lay, arange) for r in range(n)]
    assert all(len(x) == lay.send_count for x in inputs)
    truth = _simulate(op, inputs, n, lay.chunk)
    for r in range(n):
        exp = spec.expected_output(op, r, lay, arange)
        if truth[r] is None:
            assert exp is None
            continue
        assert exp is not None and len(exp) == lay.recv_count
        np.testing.assert_array_equal(exp, truth[r])
        # small enough to be exact in int8 (the tightest dtype) for up to 13 ranks
        assert int(np.max(exp)) <= 127


def test_ranks_differ_in_gathered_data() -> None:
    # a wrong chunk order must be caught: each rank's chunk has its own values
    lay = spec.layout("all_gather", 4 * 12, 3, 4)
    out = spec.expected_output("all_gather", 0, lay, lambda a, b: np.arange(a, b))
    chunks = out.reshape(3, -1)
    assert len({tuple(ch) for ch in chunks}) == 3


@pytest.mark.parametrize(
    ("text", "value"), [("8", 8), ("1K", 1024), ("64M", 64 << 20), ("1G", 1 << 30), ("2k", 2048), (512, 512)]
)
def test_parse_size(text: str | int, value: int) -> None:
    assert spec.parse_size(text) == value


@pytest.mark.parametrize("bad", ["", "1T", "abc", "-1"])
def test_parse_size_rejects(bad: str) -> None:
    with pytest.raises(ProbeError):
        spec.parse_size(bad)


def test_sweep_sizes_like_nccl_tests() -> None:
    assert spec.sweep_sizes(8, 128, 2) == [8, 16, 32, 64, 128]
    assert spec.sweep_sizes(8, 100, 4) == [8, 32]
    assert len(spec.sweep_sizes(8, 1 << 30, 2)) == 28  # 8 B .. 1 GiB
    with pytest.raises(ProbeError):
        spec.sweep_sizes(64, 8, 2)


def test_variants_and_op_names() -> None:
    assert spec.variants("all_reduce") == (True,)
    assert spec.variants("all_gather") == (False, True)
    assert spec.variants("alltoall") == (False,)
    assert spec.normalise_op("all-to-all") == "alltoall"
    assert spec.BANDWIDTH_OP["sendrecv"] == "send_recv"
    with pytest.raises(ProbeError):
        spec.normalise_op("allscatter")


def _rows() -> list[dict]:
    rows = []
    for op, n in (("all_gather", 2), ("all_reduce", 2)):
        for size in (8, 1024):
            for ip in spec.variants(op):
                lay = spec.layout(op, size, n, 4)
                rows.append(
                    make_row(
                        op=op,
                        lay=lay,
                        backend="gloo",
                        device="cpu",
                        dtype="float32",
                        in_place=ip,
                        time_us_per_rank=[5.0, 7.0],
                        host_time_us_per_rank=[6.0, 8.0],
                        timer="host",
                        wrong=0 if size == 8 else None,
                        iters=3,
                        warmup=1,
                    )
                )
    return rows


def test_table_has_nccl_tests_layout() -> None:
    text = format_table(_rows(), ["hello"])
    assert text.startswith("# hello\n")
    assert "out-of-place" in text and "in-place" in text
    assert "#wrong" in text and "algbw" in text and "busbw" in text and "(elements)" in text
    # all_reduce has no out-of-place form through torch.distributed
    ar = [ln for ln in text.splitlines() if not ln.startswith("#") and "sum" in ln]
    assert ar and all(ln.split()[5] == "n/a" for ln in ar)
    assert "# Out of bounds values : 0 OK" in text


def test_csv_round_trip() -> None:
    rows = _rows()
    back = rows_from_csv(rows_to_csv(rows))
    assert len(back) == len(rows)
    for a, b in zip(rows, back, strict=True):
        for k in ROW_FIELDS:
            v, w = getattr(a, k), getattr(b, k)
            if isinstance(v, float):
                assert math.isclose(v, w, rel_tol=0, abs_tol=0) or (math.isnan(v) and math.isnan(w))
            else:
                assert w == v, k


def test_csv_of_another_shape_is_refused_naming_the_row_and_field() -> None:
    """rows_from_csv decodes into ProbeRow: a cell of the wrong type is refused where it is, not
    carried into the verdict as text; an empty number cell reads as NaN (how NaN is written)."""
    from tracekit.model.documents import DocumentError

    text = rows_to_csv(_rows())
    head, first, *rest = text.splitlines()
    cells = first.split(",")
    cells[ROW_FIELDS.index("bytes")] = "eight"
    with pytest.raises(DocumentError) as err:
        rows_from_csv("\n".join([head, first, ",".join(cells), *rest]) + "\n")
    assert err.value.where == "$[1].bytes"
    cells = first.split(",")
    cells[ROW_FIELDS.index("busbw_gbps")] = ""
    (row,) = rows_from_csv("\n".join([head, ",".join(cells)]) + "\n")
    assert math.isnan(row.busbw_gbps) and row.bytes == _rows()[0].bytes
