"""The main job in one call: capture each TP degree, breakdown, shortfall, link comparison where
there are GPUs, and the report (HTML, Markdown, JSON) with the run folders beside it.

    from tracekit.pipeline.study import StudyConfig, run_study
    result = run_study(StudyConfig(), Path("reports/study"))
    print(result.verdict, result.reports)

Layout of the output folder:
    tp1/, tp2/ ...                 capture folders (rank-<r>.pt.trace.json.gz + manifest.json): each TP
                                   degree captured in `blocks` captures alternating with the other
                                   degrees' (TP=1, TP=2, TP=1, TP=2, ...), merged into one manifest
                                   (`_capture_interleaved`: the trace of the last block, every round)
    breakdown-tp<N>.json           the breakdown of each run (docs/JSON.md#breakdown)
    shortfall-tp<N>.json           the shortfall of each TP=N>1 against TP=1 (docs/JSON.md#shortfall)
    links.json                     the compare-links result, when it ran
    report.html/.md/.json          the report of the largest TP (report-tp<N>.* for the others)

torch is imported only inside the capture (and the link probes); `study` itself imports it
lazily to count GPUs. This module sits above the stages (capture, probe, read, analyse, report:
docs/ARCHITECTURE.md); `tracekit.report` only renders what it is given.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import orjson

from tracekit.analyse.attribution.pair import shortfall_of_pair
from tracekit.analyse.attribution.plan import attribution_plan
from tracekit.analyse.command_plans import breakdown_plan
from tracekit.capture import environment as env
from tracekit.capture.runner import CaptureConfig, capture
from tracekit.engine import Engine, pair_check, run_plans, shortfall_paths
from tracekit.engine.executor import Job
from tracekit.errors import TracekitError
from tracekit.model.documents import (
    Breakdown,
    DocumentError,
    Links,
    Report,
    Shortfall,
    TopKernels,
    decode,
    read,
)
from tracekit.model.documents import Manifest as ManifestDoc
from tracekit.model.documents.base import given
from tracekit.model.documents.manifest import (
    ManifestInterleaved,
    ManifestProfiled,
    ManifestUnprofiled,
    ManifestWorkload,
)
from tracekit.model.events import DataQuality
from tracekit.probe.compare import CompareConfig, compare_links
from tracekit.read.manifests import read_manifest
from tracekit.report.build import (
    AnalysedRuns,
    analysed_document,
    report_from_analyses,
    write_report,
)

T = TypeVar("T")


#: presets used when --preset is not given
CPU_PRESET = "tiny"
GPU_PRESET = "7b"

#: hook(stage, done, total, detail): stage names a step of the study for a progress display
StudyProgress = Callable[[str, int, int, str], None]


@dataclass(frozen=True)
class StudyConfig:
    """What `tracekit study` runs. None means: decided from the machine (GPUs or not)."""

    tp: tuple[int, ...] | None = None  # TP degrees; default (1, 2) (on GPUs capped by the GPU count)
    preset: str | None = None  # decoder preset; default tiny on CPU, 7b on GPUs
    tokens: int = 16  # decode steps per pass
    backend: str = "auto"  # auto: nccl on GPUs, gloo on CPU
    device: str = "auto"  # auto: cuda when a GPU is visible
    mode: str = "auto"  # profiler mode (tracekit.capture.profile.MODES)
    links: bool | None = None  # compare-links: None = only where there are >= 2 GPUs
    offline: bool = True  # inline plotly.js in the HTML (False: link it from the CDN, study --cdn)
    layers: int | None = None  # override the preset's layer count
    step_pattern: str | None = None
    rounds: int = 8  # measured U/P rounds per TP degree, over all its blocks (--rounds)
    blocks: int = 2  # captures per TP degree, alternating TP=1, TP=N, TP=1, TP=N ... (--blocks)


@dataclass(frozen=True)
class StudyResult:
    """Where a study's outputs went and what it concluded."""

    out_dir: Path
    verdict: str
    dilation_sentence: str
    dilation_warning: str | None
    run_dirs: dict[int, Path]
    reports: list[Path]
    analyses: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    diagnosis: str = ""  # what to look at next (the shortfall's diagnosis), "" without a baseline
    device: str = "cpu"  # where the study's captures ran (cuda | cpu)

    def to_json(self) -> dict[str, str | None | list[str] | dict[str, str]]:
        """Plain JSON types (paths as strings, TP degrees as string keys)."""
        return {
            "out_dir": str(self.out_dir),
            "verdict": self.verdict,
            "diagnosis": self.diagnosis,
            "dilation_sentence": self.dilation_sentence,
            "dilation_warning": self.dilation_warning,
            "run_dirs": {str(tp): str(p) for tp, p in self.run_dirs.items()},
            "reports": [str(p) for p in self.reports],
            "analyses": {k: str(p) for k, p in self.analyses.items()},
            "notes": list(self.notes),
            "device": self.device,
        }


def _gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def plan(config: StudyConfig) -> tuple[str, str, tuple[int, ...], list[str]]:
    """Device, preset, TP degrees and notes, decided from the config and the machine."""
    notes: list[str] = []
    gpus = _gpu_count() if config.device in ("auto", "cuda") else 0
    device = config.device if config.device != "auto" else ("cuda" if gpus else "cpu")
    preset = config.preset or (GPU_PRESET if device == "cuda" else CPU_PRESET)
    if config.tp is not None:
        tps = tuple(sorted(set(config.tp)))
    else:
        tps = (1, 2)
        if device == "cuda" and gpus < 2:
            tps = (1,)
            notes.append(
                f"only {gpus} GPU visible: TP=1 only (no shortfall); give --device cpu for a gloo TP=2 study"
            )
    if not tps or min(tps) < 1:
        raise TracekitError(f"--tp needs positive degrees, got {config.tp}")
    return device, preset, tps, notes


def _write_document(result: object, type_: type[T], path: Path) -> T:
    """An analysis' result (an object with `to_json()`, or its JSON document) written to `path`
    as its JSON (indented) and returned as its typed document, decoded once from those bytes."""
    doc = result.to_json() if hasattr(result, "to_json") else result
    raw = orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    path.write_bytes(raw)
    return decode(raw, type_)


def _compare_links(
    device: str, tps: tuple[int, ...], trace_dir: Path | None, out_dir: Path, baseline_dir: Path | None = None
) -> tuple[Links, str | None]:
    """Run the link comparison (tracekit.probe.compare) against the largest-TP trace; (result, note).

    On GPUs: NVLink vs PCIe (P2P disabled), all_reduce and all_gather up to 64 MiB (the decode's
    messages are far smaller). On CPU (only with --links): the gloo path, quickly (up to 64 KiB)."""
    if device == "cuda":
        cfg = CompareConfig(
            ops=("all_reduce", "all_gather"),
            max_bytes=64 << 20,
            graph=True,  # CUDA-graph timing: small sizes show the link's latency, not the host's launch
            trace_dir=str(trace_dir) if trace_dir else None,
            baseline_dir=str(baseline_dir) if baseline_dir and trace_dir else None,
        )
    else:
        cfg = CompareConfig(
            ops=("all_reduce",), device="cpu", ranks=max(2, max(tps)), max_bytes=64 << 10, iters=3, warmup=1,
            trace_dir=str(trace_dir) if trace_dir else None,
            baseline_dir=str(baseline_dir) if baseline_dir and trace_dir else None,
        )  # fmt: skip
    doc = _write_document(compare_links(cfg), Links, out_dir / "links.json")
    note = (
        None
        if device == "cuda"
        else "link comparison on CPU: the gloo path only, there are no GPU links here."
    )
    return doc, note


def _capture_interleaved(
    config: StudyConfig,
    out_dir: Path,
    device: str,
    preset: str,
    tps: tuple[int, ...],
    tell: Callable[[str, int, int, str], None],
) -> dict[int, Path]:
    """Capture every TP degree in `blocks` alternating captures (TP=1, TP=N, TP=1, TP=N, ...), each
    of `rounds / blocks` U/P rounds, and merge each degree's blocks into one manifest: the rounds in
    run order, the trace of its last block (the traced round is the last), the dilation from every
    round, and `workload.interleaved` (one group for all degrees: the shortfall's bootstrap draws
    their rounds as pairs, docs/METHOD.md section "Noise and the profiler correction"). The ranks of
    TP=1 and TP=N are different process worlds, so the alternation is between captures, not inside
    one; the host's drift between blocks then falls on every degree alike. Only the last block
    calibrates the profiler (its manifest is the one kept: an earlier block's calibration would be
    measured and dropped, the largest part of a short CPU capture's time)."""
    blocks = max(1, config.blocks)
    per_block = max(1, -(-config.rounds // blocks))
    group = f"study-{uuid.uuid4().hex[:12]}" if blocks >= 2 and len(tps) >= 2 else None
    manifests: dict[int, list[ManifestDoc]] = {tp: [] for tp in tps}
    run_dirs = {tp: out_dir / f"tp{tp}" for tp in tps}
    order: list[str] = []
    for b in range(blocks):
        for tp in tps:
            cc = CaptureConfig(
                tp=tp,
                preset=preset,
                tokens=config.tokens,
                backend=config.backend,
                device=device,
                mode=config.mode,
                layers=config.layers,
                rounds=per_block,
                # the profiler's cost per call (tracekit.capture.calibrate): measured in the last
                # block only, the one whose manifest the merge keeps (an earlier block's is dropped)
                calibrate=b == blocks - 1,
                command=f"tracekit study (TP={tp}, preset {preset}, {config.tokens} tokens, block {b + 1}/{blocks})",
            )
            stage = f"capture TP={tp}"
            tell(stage, b, blocks, f"block {b + 1}/{blocks}")

            def cap_progress(phase: str, done: int, total: int, stage: str = stage, b: int = b) -> None:
                tell(stage, b, blocks, f"block {b + 1}/{blocks}: {phase} {done}/{total}")

            capture(cc, run_dirs[tp], progress=cap_progress)
            manifests[tp].append(read_manifest(run_dirs[tp] / env.MANIFEST_NAME).manifest)
            order.append(f"TP={tp} block {b + 1}")
            tell(stage, b + 1, blocks, "done" if b + 1 == blocks else f"block {b + 1}/{blocks} done")
    if blocks > 1:
        for tp in tps:
            merged = merge_blocks(manifests[tp], group=group, tps=tps, order=order, per_block=per_block)
            env.atomic_write_json(run_dirs[tp] / env.MANIFEST_NAME, merged.to_json())
    return run_dirs


def merge_blocks(
    blocks: list[ManifestDoc], *, group: str | None, tps: tuple[int, ...], order: list[str], per_block: int
) -> ManifestDoc:
    """One manifest from a degree's block captures (in run order): the last block's (its trace is
    the one in the folder), with every block's unprofiled and profiled rounds in run order, the
    traced round the last, the pass order and the dilation over all of them, and
    `workload.interleaved` = {group, tp, blocks, rounds_per_block, order}. The blocks are the
    capture's manifests as read (`read_manifest`): the capture writes its Struct in field order, so
    the merged file keeps the capture's layout and every field it wrote."""

    def rounds(p: ManifestUnprofiled | ManifestProfiled | None) -> list[dict[str, list[int]]]:
        return (given(p.rounds) if p is not None else None) or []

    last = msgspec.structs.replace(blocks[-1])  # its own copy: the fields merged are replaced whole
    u_rounds = [r for m in blocks for r in rounds(given(m.unprofiled))]
    p_rounds = [r for m in blocks for r in rounds(given(m.profiled))]
    last.unprofiled = ManifestUnprofiled(per_token_ns=u_rounds[0] if u_rounds else {}, rounds=u_rounds)
    last.profiled = msgspec.structs.replace(
        given(last.profiled) or ManifestProfiled(), rounds=p_rounds, traced_round=max(len(p_rounds) - 1, 0)
    )
    last.dilation, last.dilation_interval = env.dilation(u_rounds, p_rounds)
    last.workload = msgspec.structs.replace(
        given(last.workload) or ManifestWorkload(),
        rounds=len(p_rounds),
        pass_order="".join(
            given(wl.pass_order) or "" for m in blocks if (wl := given(m.workload)) is not None
        ),
        interleaved=ManifestInterleaved(
            group=group, tp=list(tps), blocks=len(blocks), rounds_per_block=per_block, order=list(order)
        ),
    )
    first_created = given(blocks[0].created)
    if first_created is not None:
        last.created = first_created
    return last


def run_study(
    config: StudyConfig, out_dir: Path, progress: StudyProgress | None = None, engine: Engine | None = None
) -> StudyResult:
    """Capture, analyse (on `engine`: the local one unless given) and report; returns where
    everything went and the verdict."""

    def tell(stage: str, done: int, total: int, detail: str = "") -> None:
        if progress is not None:
            progress(stage, done, total, detail)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device, preset, tps, notes = plan(config)

    run_dirs = _capture_interleaved(config, out_dir, device, preset, tps, tell)

    analyses: dict[str, Path] = {}
    breakdowns: dict[int, Breakdown] = {}
    manifests: dict[int, ManifestDoc | None] = {}
    kernels: dict[int, TopKernels] = {}
    sharded = [tp for tp in tps if tp > 1]
    paired = 1 in tps and bool(sharded)
    # every run read once, its plans (breakdown; attribution when there is a pair) on the engine
    jobs = [
        Job(
            (run_dirs[tp],),
            (breakdown_plan(step_pattern=config.step_pattern),)
            + ((attribution_plan(label="baseline" if tp == 1 else "sharded"),) if paired else ()),
        )
        for tp in tps
    ]

    def pair_checks(metas: list[Any]) -> dict[int, list[tuple[str, str]]]:
        if not paired:
            return {}
        return {tp: pair_check([metas[tps.index(1)], metas[tps.index(tp)]]) for tp in sharded}

    tell("breakdown", 0, len(tps), f"TP={tps[0]}")
    results, pair_notes = run_plans(engine, jobs, pair_checks)
    by_tp = dict(zip(tps, results, strict=True))
    for tp in tps:
        res = by_tp[tp]
        path = out_dir / f"breakdown-tp{tp}.json"
        breakdowns[tp] = _write_document(res.results[0].breakdown, Breakdown, path)
        kernels[tp] = analysed_document(res.results[0].top_kernels, TopKernels)
        manifests[tp] = res.meta.manifest
        analyses[f"breakdown-tp{tp}"] = path
    tell("breakdown", len(tps), len(tps), "done")

    shortfalls: dict[int, Shortfall] = {}
    if paired:
        base = by_tp[1].results[1]
        for i, tp in enumerate(sharded):
            tell("shortfall", i, len(sharded), f"TP=1 vs TP={tp}")
            # each pair's notes on its own copy of the baseline's data quality
            own = dataclasses.replace(base, data_quality=DataQuality().merge(base.data_quality))
            path = out_dir / f"shortfall-tp{tp}.json"
            shortfalls[tp] = _write_document(
                shortfall_of_pair(own, by_tp[tp].results[1], pair_notes[tp]), Shortfall, path
            )
            analyses[f"shortfall-tp{tp}"] = path
        tell("shortfall", len(sharded), len(sharded), "done")
    elif sharded:
        notes.append("no TP=1 run: the shortfall needs a TP=1 baseline, so only breakdowns are reported.")

    links_doc: Links | None = None
    links_note: str | None = None
    want_links = config.links if config.links is not None else (device == "cuda" and _gpu_count() >= 2)
    if want_links:
        tell("links", 0, 1, "compare-links")
        base_dir = run_dirs[1] if 1 in tps and max(tps) > 1 else None  # S for the link verdict
        links_doc, links_note = _compare_links(device, tps, run_dirs[max(tps)], out_dir, base_dir)
        if links_doc is not None:
            analyses["links"] = out_dir / "links.json"
        tell("links", 1, 1, "done")
    elif config.links is None:
        links_note = (
            "link comparison skipped: the study ran on CPU (it compares NVLink and PCIe between GPUs; --links runs the gloo path); "
            "run `tracekit compare-links` on a multi-GPU machine and pass its JSON to `tracekit report --links`."
            if device != "cuda"
            else "link comparison skipped: it needs two GPUs."
        )
    else:
        links_note = "link comparison skipped (--no-links)."

    reports: list[Path] = []
    main_tp = max(tps)
    verdict, diagnosis, dil_sentence, dil_warning = "", "", "", None
    for tp in tps if len(tps) > 1 else [main_tp]:
        if tp == 1 and len(tps) > 1:
            continue
        tell("report", 0, 1, f"TP={tp}")
        base = 1 if (1 in tps and tp > 1) else None
        # the documents written above, as their typed Structs for the report
        analysed = AnalysedRuns(
            breakdown=breakdowns[tp],
            manifest=manifests[tp],
            baseline_breakdown=breakdowns[1] if base else None,
            baseline_manifest=manifests[1] if base else None,
            shortfall=shortfalls.get(tp),
            top_kernels=kernels[tp],
            baseline_top_kernels=kernels[1] if base else None,
        )
        data = report_from_analyses(
            analysed,
            run_path=str(run_dirs[tp]),
            baseline_path=str(run_dirs[1]) if base else None,
            links=links_doc,
            links_note=links_note,
            title=f"tracekit study: TP=1 vs TP={tp}, preset {preset}, {device}"
            if base
            else f"tracekit study: TP={tp}, preset {preset}, {device}",
        )
        data.notes[:0] = notes
        stem = "report" if tp == main_tp else f"report-tp{tp}"
        reports += write_report(
            data,
            [out_dir / f"{stem}.html", out_dir / f"{stem}.md", out_dir / f"{stem}.json"],
            offline=config.offline,
        )
        if tp == main_tp:
            verdict = data.verdict
            diagnosis = data.diagnosis
            dil_sentence = data.dilation.sentence
            dil_warning = data.dilation.warning
        tell("report", 1, 1, "done")
    return StudyResult(
        out_dir=out_dir,
        verdict=verdict,
        diagnosis=diagnosis,
        dilation_sentence=dil_sentence,
        dilation_warning=dil_warning,
        run_dirs=run_dirs,
        reports=reports,
        analyses=analyses,
        notes=notes + ([links_note] if links_note else []),
        device=device,
    )


#: The committed two-H200 pairs a CPU study puts its verdict beside (label, baseline, sharded, the
#: committed report of the pair): the real GPU finding a newcomer should read first, from traces/ of
#: the checkout.
GPU_REFERENCE_PAIRS: tuple[tuple[str, str, str, str], ...] = (
    (
        "2x H200, eager decode (7b shape, 8 layers, batch 1)",
        "h200x2-tp1-b1",
        "h200x2-tp2-b1",
        "reports/multi-gpu/eager-tp2.json",
    ),
    (
        "2x H200, CUDA-graph decode (host out of the way)",
        "h200x2-tp1-b1-graphs",
        "h200x2-tp2-b1-graphs",
        "reports/multi-gpu/graphs-tp2.json",
    ),
)


def committed_report_verdict(report: Path, base: str, shard: str) -> str | None:
    """The verdict of the committed report `report` (scripts/make_reports.sh) when it is the report
    of traces/`base` -> traces/`shard`; None when the file is missing, is not a report of that pair
    or has no verdict (the caller then analyses the pair). tests/test_noise.py checks that each
    committed report's verdict is the one a fresh analysis of its pair gives."""
    try:
        doc = read(report, Report)
    except (OSError, DocumentError):
        return None
    paths = {r.role: r.path for r in doc.runs}
    if paths != {"baseline": f"traces/{base}", "sharded": f"traces/{shard}"}:
        return None
    return doc.verdict


def gpu_reference_verdicts(traces_dir: Path | None = None) -> list[tuple[str, str]]:
    """The verdicts of the committed two-H200 pairs (`GPU_REFERENCE_PAIRS`), labelled: what a study
    on a machine without GPUs shows beside its own gloo verdict. Read from the pair's committed
    report (the same verdict, without the ~6 s the two analyses take), else from an analysis of
    the traces; empty when the traces are not there (an installed package without the
    repository's traces/)."""
    root = traces_dir or Path(__file__).resolve().parents[2] / "traces"
    out = []
    for label, base, shard, report in GPU_REFERENCE_PAIRS:
        b, s = root / base, root / shard
        if not (b / "manifest.json").is_file() or not (s / "manifest.json").is_file():
            continue
        verdict = committed_report_verdict(root.parent / report, base, shard)
        if verdict is None:
            verdict = shortfall_paths(b, s).verdict()
        out.append(
            (f"{label}: tracekit shortfall --baseline traces/{base} --sharded traces/{shard}", verdict)
        )
    return out
