"""Write the manifest of a capture whose ranks wrote every file but never exited (issue 14: both
ranks of `capture --tp 2 --cuda-graphs` blocked in NCCL's destroy, pytorch/pytorch#115388, before
tracekit ended such ranks itself). Used once, on this machine, for the two runs that came back so:

    python scripts/assemble_manifest.py RUN SIBLING_RUN -- CAPTURE FLAGS...

The per-rank result files in RUN hold the timings, checksums, versions and devices; the host,
topology and device list are taken from SIBLING_RUN (a run captured minutes before on the same
machine), since this machine is not that one. A note in the manifest says all this."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tracekit.capture import runner
from tracekit.capture.manifest import finish_run
from tracekit.cli.capture import command as capture_command
from tracekit.read import load_manifest


def main() -> None:
    run, sibling = Path(sys.argv[1]), Path(sys.argv[2])
    flags = sys.argv[sys.argv.index("--") + 1 :]
    ctx = capture_command.make_context("capture", [*flags, "--out", str(run)])
    p = ctx.params
    config = runner.CaptureConfig(
        tp=p["tp"],
        tokens=p["tokens"],
        rounds=p["rounds"],
        prompt=p["prompt"],
        batch=p["batch"],
        preset=p["preset"],
        layers=p["layers"],
        seed=p["seed"],
        warmup=p["warmup"],
        cuda_graphs=p["cuda_graphs"],
        compile=p["compile_"],
        command="tracekit capture " + " ".join(flags),
    )
    sib = json.loads((sibling / "manifest.json").read_text())
    w = sib["workload"]
    res = runner.Resolved(device=w["device"], backend=w["backend"], dtype=w["dtype"], mode=w["mode"])
    results = runner.read_results(run)
    man = runner.build_manifest(
        world=config.tp,
        results=results,
        workload_doc=runner.workload(config, res, config.tp),
        command=config.command or "",
        errors=[],
        needs_traces=True,
    )
    sib_m = load_manifest(sibling / "manifest.json")
    man.host, man.topology, man.devices = sib_m.host, sib_m.topology, sib_m.devices
    man.created = sib_m.created
    man.notes = [
        "manifest assembled after the run from the ranks' result files (scripts/assemble_manifest.py): "
        "both ranks wrote every file, then blocked in NCCL's destroy after CUDA graphs "
        "(pytorch/pytorch#115388) until the call's timeout; host, topology and devices are those of "
        f"{sibling.name}, captured minutes before on the same machine"
    ]
    finish_run(run, man)


if __name__ == "__main__":
    main()
