"""benchmarks/bench_scale.py's `phase_scaling`: which part of a Dask run scales, from its task
streams. Checked on streams whose spans are known by construction: one task group per rank file
(reads, prep, a rank stage), the hand-on groups of the same count, and a one-task Reduce."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "benchmarks" / "bench_scale.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(case: str, wall: float, groups: dict[str, tuple[float, float, int]]) -> dict[str, Any]:
    # the stream's groups as _stream_summary writes them: start, stop, compute seconds, tasks
    return {
        "case": case,
        "wall_s": wall,
        "stream": {"groups": {k: [a, b, 0.0, n] for k, (a, b, n) in groups.items()}, "busy_s": []},
    }


def test_the_per_rank_phases_and_the_rest_of_the_wall_are_told_apart() -> None:
    bench = _script()
    one = _row(
        "dask:1",
        36.0,
        {
            "read": (0.0, 20.0, 130),
            "prep": (20.0, 21.0, 65),
            "run1-p0-s3": (21.0, 33.0, 64),
            "run1-p0-s3-small": (21.5, 33.0, 64),  # hands results on: not a phase
            "run1-p0-s3-kept-graph": (21.5, 33.0, 64),
            "run1-p0-s5-reduce": (33.0, 35.0, 1),  # one task: the serial chain
        },
    )
    eight = _row(
        "dask:8",
        8.0,
        {
            "read": (0.0, 2.5, 130),
            "prep": (2.4, 2.6, 65),  # overlaps the reads' tail: counted once in the union
            "run1-p0-s3": (3.0, 5.0, 64),
            "run1-p0-s3-small": (3.1, 5.0, 64),
            "run1-p0-s5-reduce": (5.0, 7.0, 1),
        },
    )
    lines = bench.phase_scaling([one, eight, {"case": "local", "wall_s": 14.0}], files=65)
    rows = {
        ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]]
        for ln in lines
        if ln.startswith("| ")
    }
    assert set(rows) == {
        "phase",
        "read",
        "prep",
        "run1-p0-s3",
        "all per-rank phases (union)",
        "the rest of the wall (Reduces, combines, gaps)",
    }
    assert rows["read"] == ["130", "20.00", "2.50", "8.00x"]
    assert rows["run1-p0-s3"] == ["64", "12.00", "2.00", "6.00x"]
    # the union: 0-21 and 21-33 at one worker (33 s); 0-2.6 and 3-5 at eight (4.6 s)
    assert rows["all per-rank phases (union)"] == ["", "33.00", "4.60", f"{33 / 4.6:.2f}x"]
    # the rest: 36 - 33 = 3 s and 8 - 4.6 = 3.4 s (the Reduce and the gaps do not spread)
    assert rows["the rest of the wall (Reduces, combines, gaps)"] == ["", "3.00", "3.40", f"{3 / 3.4:.2f}x"]


def test_no_table_without_a_one_worker_stream() -> None:
    bench = _script()
    eight = _row("dask:8", 8.0, {"read": (0.0, 2.5, 130)})
    assert bench.phase_scaling([eight], files=65) == []
    assert bench.phase_scaling([{**eight, "case": "dask:1"}], files=65) == []
