"""`tracekit probe`: collective bandwidth sweeps (nccl-tests' method) and copy-engine probes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import click
import orjson

from tracekit.cli.options import config_of, format_option, message
from tracekit.cli.options import show_progress as _show_progress
from tracekit.cli.sweep_options import fork_cpu_ranks, sweep_options, sweep_output_option
from tracekit.errors import ProbeError
from tracekit.model.documents import to_builtins
from tracekit.probe import spec

if TYPE_CHECKING:
    from tracekit.model.documents.links import ProbeRow
    from tracekit.probe.sweep import SweepResult


def _json_default(v: object) -> object:
    raise TypeError(f"cannot write {type(v).__name__} as JSON")


def _clean(v: object) -> object:
    """NaN/inf -> None so the JSON is valid."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def dumps_json(obj: object) -> bytes:
    """`obj` (a document, rows, or plain JSON values) as indented JSON, NaN written as null."""
    return orjson.dumps(_clean(to_builtins(obj)), option=orjson.OPT_INDENT_2, default=_json_default) + b"\n"


def _format_from(out: Path | None, fmt: str | None) -> str:
    if fmt:
        return fmt
    if out is not None and out.suffix.lower() in (".json", ".csv"):
        return out.suffix.lower()[1:]
    return "table"


def _transport_notes(result: SweepResult) -> list[str]:
    t = result.transport
    notes = []
    if t is not None:
        notes.append(
            f"NCCL {t.nccl_version or '?'}: transport {t.transport or 'none logged'}"
            f" {dict(t.transports)}, planned path {', '.join(t.graph_types) or '?'},"
            f" wire {t.wire}, NVLS used: {'yes' if t.nvls_used else 'no'}"
        )
        if t.algo_source:
            notes.append(f"algorithm/protocol per size from the {t.algo_source}")
    if result.log_dir:
        notes.append(f"NCCL logs: {result.log_dir}")
    return notes


@click.command("probe", context_settings={"help_option_names": ["-h", "--help"]})
@sweep_options(
    op={
        "help": "all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall, sendrecv (comma list or "
        "'all'); copy (copy-engine probes); links (which link joins each GPU pair)."
    },
    min={
        "default": None,
        "show_default": False,
        "help": "Smallest size, bytes with K/M/G suffix [8; copy: 1M].",
    },
    max={"help": "Largest size [1G on CUDA, 16M on CPU; copy: 1G / 64M]."},
    nccl_debug={
        "type": click.Choice(["init", "tuning", "off"]),
        "help": "NCCL logging in the timed sweep: init = INIT,GRAPH (the transport; nothing per call), "
        "tuning = INIT,GRAPH,TUNING (a host log line per call: inflates small-size times), off.",
    },
    log_dir={"help": "Where each rank's NCCL log goes [a temporary folder]."},
)
@click.option(
    "--backend", type=click.Choice(["nccl", "gloo"]), default=None, help="[nccl on CUDA, gloo on CPU]"
)
@click.option(
    "--check/--no-check", default=True, show_default=True, help="Check every result (nccl-tests' #wrong)."
)
@format_option(
    "table", "json", "csv", default=None, help="Output format [table; or from -o/--output's suffix]."
)
@sweep_output_option
def command(
    op_text: str,
    min_text: str | None,
    max_text: str | None,
    factor: int,
    iters: int,
    warmup: int,
    dtype: str,
    ranks: int | None,
    backend: str | None,
    device: str,
    gpus: str | None,
    nccl_debug: str,
    algo_pass: bool,
    log_dir: Path | None,
    graph: bool,
    check: bool,
    fmt: str | None,
    out: Path | None,
    progress: bool | None,
) -> None:
    """Measure collective bandwidth the way NVIDIA's nccl-tests does, or copy-engine bandwidth.

    \b
    For each size: warm-up, then timed iterations (CUDA events around the loop and a host-clock
    loop closed by a stream sync), out-of-place and in-place, a correctness check, algbw and busbw
    with nccl-tests' byte counts and factors; time = average over ranks (nccl-tests' default),
    min and max in JSON/CSV. The transport NCCL used is read from its NCCL_DEBUG=INFO logs
    (INIT,GRAPH: no per-call logging in the timed loop); algorithm/protocol per size from a
    separate un-timed TUNING pass. NCCL_NVLS_ENABLE=0 always. Without --graph every iteration is
    one Python call, so small sizes measure the host's launch rate (~35-45 us a call); --graph
    times one CUDA-graph replay of the iterations instead (rows carry "graph": true).

    \b
    Examples:
      tracekit probe --op all_reduce --min 8 --max 1G --ranks 2          # 2 GPUs, NCCL
      tracekit probe --op all_reduce --min 8 --max 64M --gpus 0,1 --graph # CUDA-graph timing
      tracekit probe --op all_reduce,all_gather --device cpu --ranks 3 --max 1M -o rows.json
      tracekit probe --op copy --min 64M --max 1G                         # copy engine + ceiling
      tracekit probe --op links                                           # NVLink / PCIe per GPU pair
    """

    fmt = _format_from(out, fmt)
    show_progress = _show_progress() if progress is None else progress
    if graph and op_text.strip().lower() in ("links", "copy"):
        raise ProbeError("--graph applies to collective sweeps, not --op links/copy")
    if op_text.strip().lower() == "links":
        _links(fmt, out)
        return
    if op_text.strip().lower() == "copy":
        _copy(min_text, max_text, factor, iters, warmup, device, gpus, fmt, out)
        return
    from tracekit.probe.sweep import SweepConfig, resolve_device, run_sweep_detailed

    where = resolve_device(device, backend)
    cfg = config_of(  # the other fields: the options of the same names
        SweepConfig,
        click.get_current_context().params,
        ops=spec.parse_ops(op_text),
        min_bytes=spec.parse_size(min_text or "8"),
        max_bytes=spec.parse_size(max_text or ("1G" if where == "cuda" else "16M")),
        devices=spec.parse_gpus(gpus),
        log_dir=str(log_dir) if log_dir else None,
        progress=show_progress,
    )
    fork_cpu_ranks()
    result = run_sweep_detailed(cfg)
    if not result.rows:  # a torchrun rank other than 0
        return
    text = render_rows(result.rows, fmt, _transport_notes(result) + _header(result))
    _emit(text, out, fmt, result.rows)


def _header(result: SweepResult) -> list[str]:
    c = result.config
    devices = list(c.devices) if c.devices else None
    return [
        f"tracekit probe: ops {','.join(c.ops)}, ranks {c.ranks}, backend {c.backend}, device {c.device}"
        f" {devices or ''}, dtype {c.dtype}, iters {c.iters}, warmup {c.warmup}",
        "time = average over ranks of per-iteration time ("
        + (
            "CUDA events around one CUDA-graph replay of the iterations / iters; host clock in JSON/CSV host_time_us"
            if c.graph
            else "CUDA events around the loop; host clock in JSON/CSV host_time_us"
            if c.device == "cuda"
            else "host clock"
        )
        + "); all_reduce/broadcast/reduce are in-place only in torch.distributed; alltoall/sendrecv out-of-place only",
    ]


def render_rows(rows: list[ProbeRow], fmt: str, notes: list[str]) -> str:
    from tracekit.render.probe import format_table, rows_to_csv

    if fmt == "json":
        return dumps_json(rows).decode()
    if fmt == "csv":
        return rows_to_csv(rows)
    return format_table(rows, notes)


def _emit(text: str, out: Path | None, fmt: str, rows: list[ProbeRow]) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        if fmt != "table":
            from tracekit.render.probe import format_table

            text = format_table(rows)
        message(text.rstrip("\n"))  # what was measured, for the person watching (stderr)
        message(f"wrote {out}")
    else:
        click.echo(text, nl=False)


def _links(fmt: str, out: Path | None) -> None:
    from tracekit.probe.links import detect_topology

    topo = detect_topology()
    if fmt == "json":
        text = dumps_json(topo.document()).decode()
    else:
        from tracekit.render.links import topology_text

        text = topology_text(topo.document())
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        message(f"wrote {out}")
    else:
        click.echo(text, nl=False)


def _copy(
    min_text: str | None,
    max_text: str | None,
    factor: int,
    iters: int,
    warmup: int,
    device: str,
    gpus: str | None,
    fmt: str,
    out: Path | None,
) -> None:
    from tracekit.probe.copy import CopyConfig, format_copy_table, run_copy_probe
    from tracekit.probe.sweep import resolve_device

    cuda = resolve_device(device, None) == "cuda"
    cfg = CopyConfig(
        min_bytes=spec.parse_size(min_text or "1M"),
        max_bytes=spec.parse_size(max_text or ("1G" if cuda else "64M")),
        factor=factor,
        iters=iters,
        warmup=warmup,
        device=device,
        devices=spec.parse_gpus(gpus),
    )
    rows = run_copy_probe(cfg)
    if fmt == "json":
        text = dumps_json(rows).decode()
    elif fmt == "csv":
        import csv
        import io

        from tracekit.probe.copy import COPY_FIELDS

        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(COPY_FIELDS), lineterminator="\n")
        w.writeheader()
        for r in to_builtins(rows):
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in COPY_FIELDS})
        text = buf.getvalue()
    else:
        text = format_copy_table(rows)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        message(format_copy_table(rows).rstrip("\n"))
        message(f"wrote {out}")
    else:
        click.echo(text, nl=False)
