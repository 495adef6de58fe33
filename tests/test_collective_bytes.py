"""Message sizes of collectives the trace leaves without bytes, from the capture manifest's
`workload.collectives` (the decoder's shapes), and `bytes_source` in the instances table and the
shortfall JSON.

- synthetic tables: two ranks of NCCL kernels without args inside `decode_step` windows; every
  expected size / busbw is computed here by hand from the intervals and nccl-tests' definitions;
- real CPU captures: a `ranges`-mode capture (gloo ops without shapes, so without bytes) filled
  from the manifest equals the bytes the committed `cpu`-mode capture carries in its own shapes,
  and the same list agrees with the `cpu`-mode trace's bytes (no disagreement counted).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd
import pytest

from tracekit.analyse.collectives.matching import match_collectives
from tracekit.analyse.collectives.sizes import ManifestCollective, manifest_collectives, step_sequence
from tracekit.model.documents import to_builtins
from tracekit.model.documents.manifest import Manifest
from tracekit.model.events import make_events
from tracekit.read.manifests import manifest_from_json

REPO = Path(__file__).resolve().parents[1]

AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def table(kernel_rows: list[tuple[int, int, int, str]], steps: list[tuple[int, int, int]]) -> pd.DataFrame:
    """kernel_rows: (rank, start, end, name) NCCL kernels without args; steps: (step, start, end)
    `decode_step#k` annotations on both ranks' host threads."""
    rows = []
    for r, s, e, name in kernel_rows:
        rows.append(
            {"rank": r, "device": r, "stream": 7, "kind": "kernel", "name": name, "start_ns": s, "end_ns": e}
        )
    for k, s, e in steps:
        for r in (0, 1):
            rows.append(
                {
                    "rank": r,
                    "device": -1,
                    "stream": 1,
                    "kind": "annotation",
                    "name": f"decode_step#{k}",
                    "start_ns": s,
                    "end_ns": e,
                }
            )
    cols = {c: [row[c] for row in rows] for c in rows[0]}
    df = make_events(cols)
    df["cls"] = pd.Categorical(["collective" if k == "kernel" else "host" for k in cols["kind"]])
    return df


def manifest(entries: list) -> Manifest:
    """A manifest with this collectives list, read as manifest.json is (its rules applied)."""
    return typed({"workload": {"tp": 2, "step_pattern": "decode_step", "collectives": entries}})


def typed(doc: dict) -> Manifest:
    return manifest_from_json(doc).manifest


def entry(op: str, name: str, in_b: int, out_b: int, per_token: int) -> dict:
    return {
        "op": op,
        "name": name,
        "in_bytes": in_b,
        "out_bytes": out_b,
        "dtype": "bfloat16",
        "per_token": per_token,
    }


def test_manifest_list_parsing_and_step_order():
    m = manifest(
        [
            entry("all_reduce", "o_proj", 8192, 8192, 2),
            entry("all_reduce", "down_proj", 8192, 8192, 2),
            {"op": "allgather", "name": "lm_head", "in_bytes": 64000, "out_bytes": 128000, "per_token": 1},
            {"op": "all_reduce", "name": "bad"},  # no bytes: left out
            "junk",
        ]
    )
    got = manifest_collectives(m)
    assert [(e.op, e.name, e.per_token) for e in got] == [
        ("all_reduce", "o_proj", 2),
        ("all_reduce", "down_proj", 2),
        ("all_gather", "lm_head", 1),
    ]
    assert manifest_collectives(None) == [] and manifest_collectives(typed({"workload": {}})) == []
    a = ManifestCollective("all_reduce", "a", 1, 1, 2)
    b = ManifestCollective("all_reduce", "b", 2, 2, 2)
    c = ManifestCollective("all_reduce", "c", 3, 3, 1)
    # round by round: layer-major for per-layer entries
    assert [e.name for e in step_sequence([a, b, c])] == ["a", "b", "c", "a", "b"]


def test_one_size_per_op_fills_every_instance_in_a_step():
    # step 1 = [0, 1000): two all-reduces and one all-gather; a prefill all-reduce before it at
    # [-500, -400) is outside every step and must stay unknown
    ev = table(
        [
            (0, -500, -400, AR),
            (1, -480, -390, AR),
            (0, 100, 300, AR),  # a = 150; rank 0 waits 50, transfers 150; rank 1 transfers 150
            (1, 150, 300, AR),
            (0, 400, 500, AR),  # a = 400; transfers 100 and 110
            (1, 380, 510, AR),
            (0, 600, 900, AG),  # a = 700; transfers 200 and 200
            (1, 700, 900, AG),
        ],
        [(1, 0, 1000)],
    )
    m = manifest(
        [
            entry("all_reduce", "o_proj", 8192, 8192, 1),
            entry("all_reduce", "down_proj", 8192, 8192, 1),
            entry("all_gather", "lm_head", 64000, 128000, 1),
        ]
    )
    ci = match_collectives(ev, manifest=m, clock="shared")
    inst = ci.instances.sort_values("first_start_ns").reset_index(drop=True)
    assert inst["bytes_source"].tolist() == ["unknown", "manifest", "manifest", "manifest"]
    # nccl-tests size: all_reduce = in bytes; all_gather = max(in, out) = the gathered buffer
    assert inst["size_bytes"].tolist() == [-1, 8192, 8192, 128000]
    # busbw = size / mean transfer x factor: all_reduce 2(n-1)/n = 1, all_gather (n-1)/n = 0.5
    assert inst.loc[1, "busbw_gbps"] == pytest.approx(8192 / 150 * 1.0)
    assert inst.loc[2, "busbw_gbps"] == pytest.approx(8192 / 105 * 1.0)
    assert inst.loc[3, "busbw_gbps"] == pytest.approx(128000 / 200 * 0.5)
    assert pd.isna(inst.loc[0, "busbw_gbps"])
    pr = ci.per_rank
    assert set(pr.loc[pr["op"] == "all_gather", "out_bytes"]) == {128000}
    dq = ci.data_quality.counts
    assert dq["collective_bytes_from_manifest"] == 3 and dq["collective_bytes_unknown"] == 1
    # each step has 2 all-reduces as the list says (1 + 1 per token): no count mismatch
    assert "collective_manifest_count_mismatch" not in dq


def test_sizes_by_order_within_a_step():
    # two all-reduce sizes, per_token 2 each: the step's calls are A, B, A, B
    a_in, b_in = 1000, 3000
    m = manifest([entry("all_reduce", "A", a_in, a_in, 2), entry("all_reduce", "B", b_in, b_in, 2)])
    rows = []
    for base in (0, 10_000):  # steps 1 and 2: four all-reduces each, 1000 ns apart
        for k in range(4):
            s = base + 100 + 1000 * k
            rows += [(0, s, s + 400, AR), (1, s + 100, s + 400, AR)]
    # step 3 has only three all-reduces: positions cannot be known, left unknown
    for k in range(3):
        s = 20_000 + 100 + 1000 * k
        rows += [(0, s, s + 400, AR), (1, s + 100, s + 400, AR)]
    ev = table(rows, [(1, 0, 5000), (2, 10_000, 15_000), (3, 20_000, 25_000)])
    ci = match_collectives(ev, manifest=m, clock="shared")
    inst = ci.instances.sort_values("first_start_ns")
    assert inst["size_bytes"].tolist() == [a_in, b_in, a_in, b_in] * 2 + [-1] * 3
    assert inst["bytes_source"].tolist() == ["manifest"] * 8 + ["unknown"] * 3
    assert ci.data_quality.counts["collective_manifest_count_mismatch"] == 1
    assert ci.data_quality.counts["collective_bytes_unknown"] == 3


def test_trace_bytes_are_kept_and_checked():
    ev = table([(0, 100, 300, AR), (1, 150, 300, AR), (0, 400, 500, AR), (1, 380, 510, AR)], [(1, 0, 1000)])
    ev["coll_in_bytes"] = [8192, 8192, 4096, 4096, -1, -1]
    ev["coll_out_bytes"] = [8192, 8192, 4096, 4096, -1, -1]
    m = manifest([entry("all_reduce", "o_proj", 8192, 8192, 2)])
    ci = match_collectives(ev, manifest=m, clock="shared")
    inst = ci.instances.sort_values("first_start_ns")
    assert inst["bytes_source"].tolist() == ["trace", "trace"]
    assert inst["size_bytes"].tolist() == [8192, 4096]  # never overwritten
    assert ci.data_quality.counts["collective_bytes_manifest_disagrees"] == 1
    assert "collective_bytes_from_manifest" not in ci.data_quality.counts


def test_without_steps_nothing_is_filled():
    ev = table([(0, 100, 300, AR), (1, 150, 300, AR)], [(1, 0, 1000)])
    ev = ev[ev["kind"] == "kernel"].reset_index(drop=True)
    ci = match_collectives(ev, manifest=manifest([entry("all_reduce", "o_proj", 8192, 8192, 1)]))
    assert ci.instances["bytes_source"].tolist() == ["unknown"]
    assert ci.data_quality.counts["collective_manifest_without_steps"] == 1
    # no manifest list at all: unknown, counted, no note about steps
    ci2 = match_collectives(ev)
    assert ci2.instances["bytes_source"].tolist() == ["unknown"]
    assert "collective_manifest_without_steps" not in ci2.data_quality.counts


def test_shortfall_json_by_op_carries_the_source():
    from tracekit.analyse.attribution.document import collectives_json as coll_json
    from tracekit.analyse.attribution.options import AttributionOptions
    from tracekit.analyse.attribution.plan import attribute_run
    from tracekit.model.events import Run

    ev = table(
        [(0, 100, 300, AR), (1, 150, 300, AR), (0, 1100, 1300, AR), (1, 1150, 1300, AR)],
        [(1, 0, 1000), (2, 1000, 2000)],
    )
    ev = ev.drop(columns=["cls"])
    m = manifest([entry("all_reduce", "o_proj", 8192, 8192, 1)])
    run = Run(events=ev, sources={0: "r0", 1: "r1"}, manifest=m)
    parts = attribute_run(run, AttributionOptions(skip_first=0))
    doc = to_builtins(coll_json(parts))
    assert [(o["op"], o["bytes"], o["bytes_source"], o["count"]) for o in doc["by_op"]] == [
        ("all_reduce", 8192, "manifest", 2)
    ]
    assert doc["by_op"][0]["busbw_gbps_median"] == pytest.approx(8192 / 150)


# ---------------------------------------------------------------------------------------------
# real CPU captures: `ranges` mode (no shapes) filled from the manifest == `cpu` mode's own bytes


def _decoder_list(m: dict) -> list[dict]:
    """The manifest's list, or (when the capture predates it) the same list from the workload's
    shapes: all-reduce of [batch, 1, hidden] in the model dtype twice per layer, all-gather of the
    float32 logits [batch, vocab / tp] once."""
    wl = m["workload"]
    if wl.get("collectives"):
        return wl["collectives"]
    shape, tp, batch = wl["shape"], wl["tp"], wl["batch"]
    size = {"float32": 4, "bfloat16": 2, "float16": 2}[wl["dtype"]]
    ar = batch * shape["hidden"] * size
    ag = batch * (shape["vocab"] // tp) * 4
    return [
        entry("all_reduce", "o_proj", ar, ar, shape["layers"]),
        entry("all_reduce", "down_proj", ar, ar, shape["layers"]),
        entry("all_gather", "lm_head", ag, ag * tp, 1),
    ]


@pytest.fixture(scope="module")
def ranges_run():
    """A real TP=2 capture in mode `ranges` (committed: traces/cpu-tp2-ranges, 4 tokens, taken by
    scripts/capture_cpu_test_traces.sh; read only)."""
    out = REPO / "traces" / "cpu-tp2-ranges"
    assert json.loads((out / "manifest.json").read_text())["workload"]["collectives"]  # as captured now
    return out


def test_ranges_capture_filled_from_manifest_equals_cpu_capture_bytes(ranges_run):
    from tracekit.read import read_run

    cpu_dir = REPO / "traces" / "cpu-tp2"
    if not cpu_dir.exists():
        pytest.skip("committed traces/cpu-tp2 not found")
    cpu = read_run(cpu_dir, cache=False)
    rng = read_run(ranges_run, cache=False)
    assert rng.manifest is not None and cpu.manifest is not None
    rng_m, cpu_m = rng.manifest.to_json(), cpu.manifest.to_json()
    assert rng_m["workload"]["mode"] == "ranges" and cpu_m["workload"]["mode"] == "cpu"
    for key in ("preset", "tp", "batch", "dtype"):
        assert rng_m["workload"][key] == cpu_m["workload"][key]
    # ranges mode: no shapes, so the trace has no bytes
    ci_bare = match_collectives(rng.events, ranks=rng.ranks, manifest=typed({"workload": {}}))
    assert set(ci_bare.instances["bytes_source"]) == {"unknown"}

    lst = _decoder_list(rng_m)
    m = copy.deepcopy(rng_m)
    m["workload"]["collectives"] = lst
    ci_rng = match_collectives(rng.events, ranks=rng.ranks, manifest=typed(m))
    assert set(ci_rng.instances["bytes_source"]) == {"manifest"}
    ci_cpu = match_collectives(cpu.events, ranks=cpu.ranks, manifest=cpu.manifest)
    assert set(ci_cpu.instances["bytes_source"]) == {"trace"}

    def sizes(ci):
        return sorted(set(zip(ci.instances["op"], ci.instances["size_bytes"], strict=True)))

    assert sizes(ci_rng) == sizes(ci_cpu) == [("all_gather", 4096), ("all_reduce", 1024)]
    per_rank_bytes = ci_rng.per_rank.groupby("op")[["in_bytes", "out_bytes"]].agg(lambda s: sorted(set(s)))
    assert per_rank_bytes.loc["all_reduce"].tolist() == [[1024], [1024]]
    assert per_rank_bytes.loc["all_gather"].tolist() == [[2048], [4096]]
    # the same list checked against the cpu-mode trace's own bytes: no disagreement
    m_cpu = copy.deepcopy(cpu_m)
    m_cpu["workload"]["collectives"] = lst
    ci_chk = match_collectives(cpu.events, ranks=cpu.ranks, manifest=typed(m_cpu))
    assert "collective_bytes_manifest_disagrees" not in ci_chk.data_quality.counts
    assert "collective_manifest_count_mismatch" not in ci_chk.data_quality.counts
    assert json.dumps(lst)  # the list is plain JSON


def test_compare_links_trace_sizes_from_the_manifest(ranges_run):
    """`compare-links --trace` on a run whose trace has no bytes: the decode's sizes come from the
    manifest and say so."""
    from tracekit.analyse.links.trace import trace_collectives

    tr = trace_collectives(ranges_run)
    got = {(z.coll_op, z.bytes, z.bytes_source, z.count) for z in tr.sizes}
    # 4 tokens x (2 layers x 2 all-reduces, 1 all-gather)
    assert got == {("all_reduce", 1024, "manifest", 16), ("all_gather", 4096, "manifest", 4)}
    assert tr.source == "transfer" and all((z.busbw_gbps or 0) > 0 for z in tr.sizes)


# ---------------------------------------------------------------------------------------------
# the GPU smoke run (2 x H200, NCCL, mode `cuda`): NCCL kernels without args


def _smoke_dir() -> Path:
    import os

    for cand in (
        os.environ.get("TRACEKIT_SMOKE_TP2"),
        REPO.parent / "shared" / "traces" / "h200" / "smoke-tp2",
    ):
        if cand and (Path(cand) / "rank-1.pt.trace.json.gz").exists():
            return Path(cand)
    pytest.skip("GPU smoke traces not found (../shared/traces/h200/smoke-tp2 or $TRACEKIT_SMOKE_TP2)")


def test_gpu_smoke_nccl_kernels_pair_and_take_manifest_bytes(tmp_path):
    import gzip
    import shutil

    from tracekit.classify import classify
    from tracekit.read import read_run

    src = _smoke_dir()
    # independently, from the raw JSON: each rank's NCCL kernels in start order
    raw = {}
    for r in (0, 1):
        doc = json.load(gzip.open(src / f"rank-{r}.pt.trace.json.gz"))
        ks = sorted(
            (
                e
                for e in doc["traceEvents"]
                if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel")
            ),
            key=lambda e: e["ts"],
        )
        raw[r] = ks
    assert len(raw[0]) == len(raw[1]) > 0
    for a, b in zip(raw[0], raw[1], strict=True):
        assert a["name"].split("(")[0] == b["name"].split("(")[0]
        # a collective finishes on both ranks together: the k-th kernels end within 2 us
        assert abs((a["ts"] + a["dur"]) - (b["ts"] + b["dur"])) < 2.0

    for f in src.iterdir():
        if f.is_file():
            shutil.copy(f, tmp_path / f.name)
    m = json.loads((tmp_path / "manifest.json").read_text())
    m["workload"]["collectives"] = _decoder_list(m)
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    run = read_run(tmp_path, cache=False)
    ci = match_collectives(
        classify(run.events), ranks=run.ranks, rank_info=run.rank_info, manifest=run.manifest
    )
    assert ci.level == "gpu_kernel" and ci.n_instances == len(raw[0])
    # the pairing is the raw k-th <-> k-th one: instance k holds each rank's k-th kernel
    base = {
        r: json.load(gzip.open(src / f"rank-{r}.pt.trace.json.gz"))["baseTimeNanoseconds"] for r in (0, 1)
    }
    for r in (0, 1):
        ends = [base[r] + round(e["ts"] * 1000) + round(e["dur"] * 1000) for e in raw[r]]
        got = ci.per_rank[ci.per_rank["rank"] == r].sort_values("instance")["raw_end_ns"].tolist()
        assert len(got) == len(ends) and all(abs(g - x) <= 2 for g, x in zip(got, ends, strict=True))
    inst = ci.instances
    wl = m["workload"]
    ar = wl["batch"] * wl["shape"]["hidden"] * 2  # bf16
    ag_out = wl["batch"] * wl["shape"]["vocab"] * 4  # float32 logits, gathered
    assert set(inst["bytes_source"]) == {"manifest"}
    assert set(zip(inst["op"], inst["size_bytes"], strict=True)) == {
        ("all_reduce", ar),
        ("all_gather", ag_out),
    }
    # wait / transfer: every rank's interval splits exactly; the transfer is the common tail
    assert (ci.per_rank["wait_ns"] >= 0).all() and (ci.per_rank["transfer_ns"] > 0).all()
    assert "collective_end_before_last_arrival" not in ci.data_quality.counts
