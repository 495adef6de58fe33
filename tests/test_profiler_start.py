"""Starting tracekit's profiler does not import inductor (tracekit/capture/profile.py
`_inductor_not_imported_to_start`): torch.profiler's `prepare_trace` asks `hasattr(torch,
"_inductor")`, which imports inductor and TorchDynamo (~4.5 CPU-s in every rank process of every
capture) to read a flag only compiled code uses. Checked in a fresh interpreter (this process may
have loaded inductor already), with a real trace written; and where inductor is asked for
(TORCHINDUCTOR_CUDAGRAPHS=1), torch reads its flag as it always does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = r"""
import gzip, json, os, sys
from pathlib import Path
import torch
import torch.profiler.profiler as tpp
from tracekit.capture.profile import Tracer

out = Path(sys.argv[1])
t = Tracer("cpu", "cpu", out, 0, warmup=0)
t.start()
prof = t.prof
x = torch.ones(64, 64)
for _ in range(3):
    t.step()
    x = x @ x / 64
path = t.stop()
names = [e.get("name") for e in json.loads(gzip.decompress(Path(path).read_bytes()))["traceEvents"]]
print(json.dumps({
    "inductor": "torch._inductor" in sys.modules,
    "dynamo": "torch._dynamo" in sys.modules,
    "has_cudagraphs": prof.has_cudagraphs,
    "shim_left": "hasattr" in vars(tpp),
    "mm": names.count("aten::mm"),
}))
"""


def _child(tmp_path: Path, **env: str) -> dict[str, object]:
    import os

    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_starting_the_profiler_imports_no_inductor_and_traces_the_ops(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    got = _child(tmp_path / "a")
    # the trace is a real one (the three steps' matmuls), and nothing compiled was loaded for it
    assert got["mm"] == 3
    assert got == {"inductor": False, "dynamo": False, "has_cudagraphs": False, "shim_left": False, "mm": 3}
    # inductor's cudagraphs asked for: torch imports inductor and reads the flag, unchanged
    on = _child(tmp_path / "b", TORCHINDUCTOR_CUDAGRAPHS="1")
    assert on["inductor"] is True and on["has_cudagraphs"] is True and on["mm"] == 3
