"""What a capture records about where it ran, and how its files are written.

Versions, host, devices, topology (`nvidia-smi topo -m`, NVML links), the NCCL_* environment,
checksums, atomic writes, and the per-token statistics the manifest carries (docs/JSON.md#manifest).
Torch and NVML are imported inside functions, and only where present.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import platform
import shutil
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tracekit.model.digest import sha256_of
from tracekit.model.documents.manifest import (
    ManifestDevice,
    ManifestFilesValue,
    ManifestHost,
    ManifestNvmlLink,
    ManifestTopology,
)

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = "1.2"  # 1.1: workload.nsys; 1.2: rounds (alternating passes), dilation_interval


def trace_name(rank: int) -> str:
    """File name of rank `rank`'s Kineto trace."""
    return f"rank-{rank}.pt.trace.json.gz"


def result_name(rank: int) -> str:
    """Per-rank side file (timings, tokens, errors) the manifest is assembled from."""
    return f".rank-{rank}.result.json"


# -- files ---------------------------------------------------------------------------------------
def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary name in the same folder and one rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:  # a full disk (ENOSPC), Ctrl-C: no half-written temporary left behind
        _unlink_quietly(tmp)
        _name_the_file(exc, path)
        raise


def _name_the_file(exc: BaseException, path: Path) -> None:
    """A failed write() carries no file name: put the one being written into the OSError."""
    if isinstance(exc, OSError) and exc.filename is None:
        exc.filename = str(path)


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def atomic_write_json(path: Path, doc: Any) -> None:
    atomic_write_bytes(path, (json.dumps(doc, indent=1, sort_keys=False) + "\n").encode())


def gzip_file_atomic(src: Path, dest: Path) -> None:
    """gzip `src` into `dest` (temporary name, then rename) and remove `src`."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with open(src, "rb") as fin, open(tmp, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0) as gz:
                shutil.copyfileobj(fin, gz, 1 << 20)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, dest)
    except BaseException as exc:  # nothing half-written under either name; `src` is the caller's to remove
        _unlink_quietly(tmp)
        _name_the_file(exc, dest)
        raise
    src.unlink()


def file_entry(path: Path, rank: int | None) -> ManifestFilesValue:
    """A file the capture wrote as the manifest's `files` lists it: its rank (None: every rank's,
    an nsys report), sha256 and size."""
    return ManifestFilesValue(rank=rank, sha256=sha256_of(path), bytes=path.stat().st_size)


# -- statistics ----------------------------------------------------------------------------------
def dilation(
    unprofiled_rounds: Sequence[Mapping[str, Sequence[int]]],
    profiled_rounds: Sequence[Mapping[str, Sequence[int]]],
) -> tuple[float | None, list[float] | None]:
    """The manifest's `dilation` and `dilation_interval` from every round of each kind (each
    round {rank: [ns, ...]}): mean profiled / mean unprofiled per-token time, per token the slowest
    rank, the first token of each round skipped, rounds pooled, and its 95% bootstrap interval.
    The same code as `tracekit dilation` (tracekit.analyse.dilation.dilation_of), so the figure the
    capture states is the one the analysis applies. (None, None) without times of both kinds."""
    from tracekit.analyse.dilation import dilation_of
    from tracekit.model.documents.manifest import Manifest, ManifestProfiled, ManifestUnprofiled

    def rounds(of: Sequence[Mapping[str, Sequence[int]]]) -> list[dict[str, list[int]]]:
        return [{str(r): [int(x) for x in v] for r, v in rnd.items()} for rnd in of]

    d = dilation_of(
        Manifest(
            unprofiled=ManifestUnprofiled(rounds=rounds(unprofiled_rounds)),
            profiled=ManifestProfiled(rounds=rounds(profiled_rounds)),
        )
    )
    if d.dilation is None:
        return None, None
    interval = [round(x, 4) for x in d.interval] if d.interval is not None else None
    return round(d.dilation, 4), interval


# -- environment ---------------------------------------------------------------------------------
def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def host_info() -> ManifestHost:
    return ManifestHost(
        hostname=socket.gethostname(), cpu=_cpu_name(), cpu_count=os.cpu_count(), platform=platform.platform()
    )


def versions() -> dict[str, str | None]:
    from tracekit._version import __version__

    out: dict[str, str | None] = {
        "tracekit": __version__,
        "python": platform.python_version(),
        "torch": None,
        "cuda": None,
        "nccl": None,
    }
    try:
        import torch

        out["torch"] = str(torch.__version__)  # a str subclass, which msgspec does not encode
        out["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            with contextlib.suppress(Exception):
                v = torch.cuda.nccl.version()
                out["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except ImportError:
        pass
    return out


def devices() -> list[ManifestDevice]:
    """The CUDA devices this process sees ([] on a CPU-only host)."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    out: list[ManifestDevice] = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(
            ManifestDevice(
                index=i,
                name=str(p.name),
                memory_bytes=int(p.total_memory),
                capability=f"{p.major}.{p.minor}",
                multiprocessors=int(p.multi_processor_count),
            )
        )
    return out


def nvml_links() -> list[ManifestNvmlLink] | None:
    """Per GPU pair: P2P status over NVLink, and active NVLink count per GPU. None without NVML."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        n = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        rows: list[ManifestNvmlLink] = []
        for i, h in enumerate(handles):
            active = 0
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(h, link):
                        active += 1
                except Exception:
                    break
            rows.append(ManifestNvmlLink(gpu=i, nvlink_active_links=active))
        for i in range(n):
            for j in range(i + 1, n):
                row = ManifestNvmlLink(gpu_a=i, gpu_b=j)
                for key, idx in (
                    ("p2p_nvlink", getattr(pynvml, "NVML_P2P_CAPS_INDEX_NVLINK", None)),
                    ("p2p_read", getattr(pynvml, "NVML_P2P_CAPS_INDEX_READ", None)),
                ):
                    if idx is None:
                        continue
                    try:
                        st = pynvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], idx)
                        said = "ok" if st == pynvml.NVML_P2P_STATUS_OK else f"status {st}"
                    except Exception as exc:  # not supported on this driver
                        said = f"error: {exc}"
                    setattr(row, key, said)
                rows.append(row)
        return rows
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def topology() -> ManifestTopology:
    from tracekit.probe.links import nvidia_smi_topo

    return ManifestTopology(nvidia_smi_topo=nvidia_smi_topo(), nvml_links=nvml_links())


def nccl_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if env is None else env
    return {k: v for k, v in sorted(env.items()) if k.startswith("NCCL_")}


def now_utc() -> str:
    import datetime as _dt

    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
