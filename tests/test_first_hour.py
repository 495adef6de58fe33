"""The first hour (issue 24), the defects a new user still met after the earlier stops, each kept
from returning: `compare-links --device cpu` (two runs of one gloo sweep) must not print NVLink /
PCIe columns, ratios or verdicts; a report that inlined plotly.py's full 4.8 MB bundle says so and
names the one step that makes its pages ~1.3 MB; and the mistakes a user makes on every analysis
command give one `tracekit: error: <file> ...` line and exit 2, never a traceback.

Cheap: the committed runs (traces/cpu-tp1, traces/cpu-tp2), probe rows made by construction, no
capture, no sweep."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from tracekit.cli.main import main
from tracekit.model.documents import to_builtins
from tracekit.model.documents.links import ProbeRow
from tracekit.probe import spec
from tracekit.probe.results import make_row

REPO = Path(__file__).resolve().parents[1]
CPU_TP1 = REPO / "traces" / "cpu-tp1"
CPU_TP2 = REPO / "traces" / "cpu-tp2"
LINK_WORDS = re.compile(r"nvlink|pcie|p2p", re.IGNORECASE)


def _gloo_rows(mode: str, busbw: dict[int, float]) -> list[ProbeRow]:
    rows = []
    for size, bw in busbw.items():
        lay = spec.layout("all_reduce", size, 2, 4)
        t_us = size / bw / 1e3  # all_reduce on 2 ranks: bus factor 1
        rows.append(
            make_row(
                op="all_reduce", lay=lay, backend="gloo", device="cpu", dtype="float32", in_place=True,
                time_us_per_rank=[t_us, t_us], host_time_us_per_rank=[t_us, t_us], timer="host",
                wrong=0, iters=5, warmup=1, mode=mode, transport="gloo/tcp",
            )
        )  # fmt: skip
    return rows


@pytest.fixture(scope="module")
def cpu_compare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved compare-links result of `--device cpu` as `compare_links` writes it (modes named
    after their NCCL settings, which gloo ignores), the second run 4x slower: host noise."""
    cpu_note = "gloo over host memory/TCP on CPU: no GPU link involved, NCCL variables have no effect"
    modes = [
        {"mode": m, "env": env, "backend": "gloo", "device": "cpu", "devices": None, "ranks": 2,
         "notes": [f"{m}: {cpu_note}"]}
        for m, env in (("nvlink", {"NCCL_NVLS_ENABLE": "0"}),
                       ("pcie", {"NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"}))
    ]  # fmt: skip
    doc = {
        "schema_version": "1.1",
        "kind": "tracekit.compare_links",
        "modes": modes,
        "rows": _gloo_rows("nvlink", {1024: 0.004, 4096: 0.016})
        + _gloo_rows("pcie", {1024: 0.001, 4096: 0.004}),
        "config": {
            "ops": ["all_reduce"],
            "modes": ["nvlink", "pcie"],
            "min_bytes": 1024,
            "max_bytes": 4096,
            "factor": 4,
            "iters": 5,
            "warmup": 1,
            "dtype": "float32",
            "nccl_debug": "init",
            "algo_pass": True,
            "graph": False,
            "pcie_p2p_level": None,
        },
        "transports": {m["mode"]: {"uses_nvlink": None, "notes": m["notes"], "log_dir": None} for m in modes},
        "links": {"source": "", "gpus": [], "links": [], "notes": ["no GPU found"], "nvidia_smi_topo": None},
        "meta": {"torch": "2.13.0+cpu", "python": "3.11.7", "cuda": None},
        "probe_notes": [
            "CPU only: each mode runs the same gloo sweep (no GPU links to compare; NCCL variables have no effect)",
            *(m["notes"][0] for m in modes),
        ],
    }
    path = tmp_path_factory.mktemp("links") / "cpu-links.json"
    path.write_text(json.dumps(to_builtins(doc)))
    return path


def test_compare_links_on_the_cpu_prints_no_link_words(cpu_compare: Path, capsys: pytest.CaptureFixture[str]):
    """Issue 24: on a CPU machine compare-links printed columns headed nvlink and pcie, ratios and
    "nvlink 1.12 GB/s vs pcie 0.70 GB/s (x1.60)" as its verdict: two runs of one gloo sweep."""
    assert main(["compare-links", "--load", str(cpu_compare)]) == 0
    out = capsys.readouterr().out
    assert not LINK_WORDS.search(out), [ln for ln in out.splitlines() if LINK_WORDS.search(ln)]
    head = next(ln for ln in out.splitlines() if ln.startswith("# op "))
    assert "run 1 busbw" in head and "run 2 busbw" in head and "ratio" not in head
    verdict = out.split("# verdict: ", 1)[1]
    assert verdict.startswith(
        "CPU only (gloo): there are no GPU links to compare; the same gloo sweep ran 2 times"
    )
    assert "busbw at 4 KiB 0.016 / 0.004 GB/s" in verdict and "(x4" not in verdict
    # against the committed gloo decode and its baseline: the same, the runs named as runs
    assert (
        main(
            ["compare-links", "--load", str(cpu_compare), "--trace", str(CPU_TP2), "--baseline", str(CPU_TP1)]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert not LINK_WORDS.search(out), [ln for ln in out.splitlines() if LINK_WORDS.search(ln)]
    assert "run 1 of the gloo sweep" in out and "S = " in out


def test_compare_links_on_gpus_keeps_its_link_names(capsys: pytest.CaptureFixture[str]):
    """The relabelling is the CPU's alone: the committed two-H200 result keeps nvlink / pcie."""
    saved = REPO / "reports" / "h200" / "links.json"
    assert main(["compare-links", "--load", str(saved)]) == 0
    out = capsys.readouterr().out
    head = next(ln for ln in out.splitlines() if ln.startswith("# op "))
    assert "nvlink busbw" in head and "pcie busbw" in head and "ratio" in head
    assert "NVLink is 1.05x faster than the PCIe/SHM path" in out.split("# verdict: ", 1)[1]


def test_a_report_with_the_full_plotly_bundle_says_how_to_shrink_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    """Issue 24: a fresh report was 4.9 MB (4.8 MB of it plotly.js) without a word; the basic
    bundle is fetched by a script (not in the repository: another project's code)."""
    from tracekit.cli.report import plotly_bundle_note

    monkeypatch.delenv("TRACEKIT_PLOTLYJS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))  # no basic bundle here
    page = tmp_path / "r.html"
    assert main(["report", str(CPU_TP2), "--baseline", str(CPU_TP1), "-o", str(page)]) == 0
    err = capsys.readouterr().err
    assert "note: the page inlines plotly.py's full plotly.js" in err
    assert "scripts/fetch_plotly_basic.sh" in err and str(tmp_path / "empty-cache") in err
    assert page.stat().st_size > 4_000_000  # what the note is about
    assert plotly_bundle_note([page], cdn=True) is None  # a linked bundle: nothing inlined
    assert plotly_bundle_note([tmp_path / "r.md"], cdn=False) is None  # no page
    other = tmp_path / "plotly-other.min.js"
    other.write_text("/* a build the user chose */")
    monkeypatch.setenv("TRACEKIT_PLOTLYJS", str(other))
    assert plotly_bundle_note([page], cdn=False) is None


# -- five mistakes, on every analysis command -----------------------------------------------------


def _mistakes(root: Path) -> dict[str, Path]:
    """What a user points tracekit at by mistake; each a path the error line must name."""
    out: dict[str, Path] = {}
    wrong = root / "wrong-folder"
    (wrong / "notes").mkdir(parents=True)
    (wrong / "notes" / "todo.txt").write_text("not a trace\n")
    out["wrong folder"] = wrong
    other = root / "other-tool.json"
    other.write_text(json.dumps({"version": 3, "sources": [], "mappings": "AAAA"}))  # a source map
    out["another tool's JSON"] = other
    raw = gzip.decompress((CPU_TP2 / "rank-0.pt.trace.json.gz").read_bytes())
    cut = root / "truncated" / "rank-0.pt.trace.json"
    cut.parent.mkdir()
    cut.write_bytes(raw[: len(raw) // 2])
    out["truncated JSON"] = cut
    bare = root / "no-manifest"
    bare.mkdir()
    (bare / "rank-0.pt.trace.json").write_text("[1, 2")
    out["run without its manifest, damaged"] = bare
    empty_gz = root / "empty.json.gz"
    empty_gz.write_bytes(gzip.compress(b""))
    out["empty gzip"] = empty_gz
    return out


#: every analysis command, with where the bad input goes ({bad}); the committed runs elsewhere
ANALYSES = {
    "breakdown": ["breakdown", "{bad}"],
    "shortfall": ["shortfall", "--baseline", str(CPU_TP1), "--sharded", "{bad}"],
    "report": ["report", "{bad}", "--baseline", str(CPU_TP1), "-o", "{tmp}/r.html"],
    "diff": ["diff", str(CPU_TP2), "{bad}"],
    "dilation": ["dilation", "{bad}"],
    "whatif": ["whatif", "--baseline", str(CPU_TP1), "--sharded", "{bad}"],
    "export": ["export", "--perfetto", "{tmp}/x.json", "{bad}"],
    "roofline": ["roofline", "{bad}"],
    "decompose": ["decompose", "--baseline", str(CPU_TP1), "--intermediate", "{bad}", "--full", str(CPU_TP2)],
    "advise": ["advise", "--tp1", str(CPU_TP1), "--tpn", "{bad}", "--gpus", "2"],
    "predict": ["predict", "--shard", "{bad}", "--link", "{bad}"],
    "compare-links": ["compare-links", "--load", "{bad}"],
}


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _mistakes(tmp_path_factory.mktemp("mistakes"))


@pytest.mark.parametrize("command", list(ANALYSES))
def test_every_analysis_command_refuses_each_mistake_in_one_line(
    command: str, mistakes: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    for what, bad in mistakes.items():
        if command == "compare-links" and bad.is_dir():
            continue  # --load takes a file (click refuses a folder with its usage line, exit 2)
        args = [a.replace("{bad}", str(bad)).replace("{tmp}", str(tmp_path)) for a in ANALYSES[command]]
        capsys.readouterr()
        rc = main(args)
        cap = capsys.readouterr()
        lines = [ln for ln in cap.err.splitlines() if ln.strip()]
        assert rc == 2, f"{command} on {what}: exit {rc}\n{cap.err}\n{cap.out[-500:]}"
        assert "Traceback" not in cap.err and "Traceback" not in cap.out, f"{command} on {what}"
        errors = [ln for ln in lines if ln.startswith("tracekit: error: ")]
        assert len(errors) == 1, f"{command} on {what}: {lines}"
        assert bad.name in errors[0], f"{command} on {what} does not name the file: {errors[0]}"


def test_probe_and_links_files_name_the_byte_where_they_stop_being_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """`--load` / `--link` read a result tracekit wrote; given a gzip, a truncated file or a
    hand-edited one they said "'utf-8' codec can't decode byte 0x8b in position 1" or failed with
    a KeyError traceback deep in the verdict."""
    saved = json.loads((REPO / "reports" / "h200" / "links.json").read_text())
    gz = tmp_path / "links.json.gz"
    gz.write_bytes(gzip.compress(json.dumps(saved).encode()))
    cut = tmp_path / "cut.json"
    text = json.dumps(saved)
    cut.write_text(text[:1000])
    edited = tmp_path / "edited.json"
    del saved["rows"][3]["correct"]
    edited.write_text(json.dumps(saved))
    shard = str(REPO / "traces" / "h200-shard2-graphs")
    cases = [
        (["compare-links", "--load", str(gz)], "links.json.gz at byte 1: not the compare-links result (the file is a gzip file)"),
        (["predict", "--shard", shard, "--link", f"{gz}@nvlink"], "links.json.gz at byte 1: not the probe JSON (the file is a gzip file)"),
        (["compare-links", "--load", str(cut)], "cut.json at byte 1000: the compare-links result is not valid JSON"),
        (["compare-links", "--load", str(edited)], "edited.json at $.rows[3]: not a compare-links result (Object missing required field `correct`)"),
    ]  # fmt: skip
    for argv, want in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"tracekit: error: {tmp_path}/{want}"), (argv, lines)


def _with_workload(src: Path, dest: Path, **changes: object) -> Path:
    shutil.copytree(src, dest)
    m = json.loads((dest / "manifest.json").read_text())
    m["workload"].update(changes)
    m.pop("files", None)  # the checksums are of the files, not of the manifest: keep them valid
    (dest / "manifest.json").write_text(json.dumps(m))
    return dest


def test_a_pair_of_two_workloads_is_said_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """Issue 24 (a mismatched pair): `shortfall` of a baseline of another model put the note at the
    end of 129 lines of data quality; `diff` of two workloads said nothing. Both now warn on stderr
    before the result (the device is not a workload: the same decode on two machines is a diff)."""
    base = _with_workload(CPU_TP1, tmp_path / "tp1-batch8", batch=8)
    capsys.readouterr()
    assert main(["shortfall", "--baseline", str(base), "--sharded", str(CPU_TP2)]) == 0
    cap = capsys.readouterr()
    assert cap.err.startswith(
        "warning: the baseline's manifest describes another workload than the sharded run's"
    )
    assert "batch 8 vs 1" in cap.err.splitlines()[0] and "warning" not in cap.out.split("\n", 1)[0]
    after = _with_workload(CPU_TP2, tmp_path / "tp2-batch8", batch=8, device="cuda")
    assert main(["diff", str(CPU_TP2), str(after)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"warning: {after} is another workload than {CPU_TP2} (batch 1 vs 8): what moved includes the change "
        "of model or input, not only of the code"
    )
    same = _with_workload(CPU_TP2, tmp_path / "tp2-other-machine", device="cuda")
    assert main(["diff", str(CPU_TP2), str(same)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_an_nsys_export_of_another_schema_names_its_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """A column renamed by another nsys version: the error names the file, the column and the
    export's own nsys and schema versions (META_DATA_EXPORT), so the user knows which export it is."""
    import sqlite3

    from tests.conftest import REAL_NSYS_GZ

    db = tmp_path / "other-version.sqlite"
    db.write_bytes(gzip.decompress(REAL_NSYS_GZ.read_bytes()))
    con = sqlite3.connect(db)
    con.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME COLUMN start TO startNs")
    con.commit()
    con.close()
    capsys.readouterr()
    assert main(["breakdown", str(db), "--no-cache"]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"tracekit: error: {db}: ")
    assert "no such column: start" in lines[0] and "Nsight Systems 2025.3.2.0, schema 3.20.3" in lines[0]


def test_a_folder_of_runs_is_named_as_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """The folder a user keeps runs in (traces/, runs/, a study's output) given as one run: its
    runs were read as the ranks of one ("rank 0 appears in two files") or its own JSON files as
    traces ("traces/cpu-truth-probes.json: no traceEvents"). Now the error says what it is."""
    runs = tmp_path / "runs"
    for name in ("cpu-tp1", "cpu-tp2"):
        shutil.copytree(REPO / "traces" / name, runs / name)
    (runs / "breakdown.json").write_text("{}")  # a result saved beside them
    for argv in (["breakdown", str(runs)], ["shortfall", "--baseline", str(CPU_TP1), "--sharded", str(runs)]):
        capsys.readouterr()
        assert main(argv) == 2
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert lines == [
            f"tracekit: error: {runs}: a folder of runs (cpu-tp1, cpu-tp2: each has its manifest.json), "
            "not one run: give one of them"
        ]
    assert main(["breakdown", str(runs / "cpu-tp2"), "--format", "json"]) == 0  # one of them reads
