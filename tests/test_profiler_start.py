"""Starting tracekit's profiler does not import inductor (tracekit/capture/profile.py
`_inductor_not_imported_to_start`): torch.profiler's `prepare_trace` asks `hasattr(torch,
"_inductor")`, which imports inductor and TorchDynamo (~4.5 CPU-s in every rank process of every
capture) to read a flag only compiled code uses. Checked in a rank process as a CPU capture starts
one (forked from the capture's fork server, tracekit.capture.starter: a fresh interpreter that
imported torch, torch.distributed and torch.profiler; this process may have loaded inductor
already), with a real trace written; and where inductor is asked for (TORCHINDUCTOR_CUDAGRAPHS=1 in
the rank's environment, set before its profiler starts: the shim reads it there, and inductor's
config reads it when the rank imports inductor), torch reads its flag as it always does. Both ranks
fork from one server (the variable set in this process would start a second server, one more
import of torch, ~3 CPU-s)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import pytest


def _profile_three_matmuls(out: str, q: Any, env: dict[str, str]) -> None:
    import os

    os.environ.update(env)  # before anything here reads it (the server imported no inductor)
    import torch
    import torch.profiler.profiler as tpp

    from tracekit.capture.profile import Tracer

    before = {"inductor": "torch._inductor" in sys.modules, "dynamo": "torch._dynamo" in sys.modules}
    t = Tracer("cpu", "cpu", Path(out), 0, warmup=0)
    t.start()
    prof = t.prof
    x = torch.ones(64, 64)
    for _ in range(3):
        t.step()
        x = x @ x / 64
    path = t.stop()
    assert path is not None
    names = [e.get("name") for e in json.loads(gzip.decompress(Path(path).read_bytes()))["traceEvents"]]
    q.put(
        {
            "before": before,
            "inductor": "torch._inductor" in sys.modules,
            "dynamo": "torch._dynamo" in sys.modules,
            "has_cudagraphs": prof.has_cudagraphs,
            "shim_left": "hasattr" in vars(tpp),
            "mm": names.count("aten::mm"),
        }
    )


def _in_a_rank(out: Path, env: dict[str, str]) -> dict[str, Any]:
    from tracekit.capture.starter import Starter

    ctx = Starter()
    q = ctx.Queue()
    p = ctx.Process(target=_profile_three_matmuls, args=(str(out), q, env))
    p.start()
    got: dict[str, Any] = q.get(timeout=300)
    p.join(timeout=60)
    assert p.exitcode == 0
    return got


@pytest.mark.slow
def test_starting_the_profiler_imports_no_inductor_and_traces_the_ops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    monkeypatch.delenv("TORCHINDUCTOR_CUDAGRAPHS", raising=False)
    got = _in_a_rank(tmp_path / "a", {})
    # the trace is a real one (the three steps' matmuls), and nothing compiled was loaded for it,
    # neither by the server nor by the profiler's start
    assert got["mm"] == 3
    assert got == {
        "before": {"inductor": False, "dynamo": False},
        "inductor": False,
        "dynamo": False,
        "has_cudagraphs": False,
        "shim_left": False,
        "mm": 3,
    }
    # inductor's cudagraphs asked for: torch imports inductor and reads the flag, unchanged
    on = _in_a_rank(tmp_path / "b", {"TORCHINDUCTOR_CUDAGRAPHS": "1"})
    assert on["before"] == {"inductor": False, "dynamo": False}  # the same server: nothing compiled
    assert on["inductor"] is True and on["has_cudagraphs"] is True and on["mm"] == 3
