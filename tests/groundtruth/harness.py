"""Run tracekit on a case's written traces, the way the CLI does, and pair each figure with its
truth. `figures(case_name, root)` -> {group: [(label, tracekit value, truth value)]}."""

from __future__ import annotations

import re
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Any

from tests.groundtruth import sim
from tests.groundtruth.cases import CASES
from tests.groundtruth.kineto import write_run
from tests.groundtruth.truth import case_truth

PATH_KEYS = {
    "host": "host_ns",
    "compute": "compute_ns",
    "memory": "memory_ns",
    "transfer": "transfer_ns",
    "sync": "sync_ns",
}
TERM_KEYS = ("compute", "memory", "transfer", "coordination")
COORD_KEYS = ("wait", "sync", "idle")


#: labels of figures that are counts or choices, compared exactly
EXACT_PREFIXES = ("steps", "steady", "verdict", "diagnosis", "range")


def tolerance(truth: float, label: str = "") -> float:
    """Every figure within max(1 us, 1%) of its truth; counts and choices exactly."""
    if label.startswith(EXACT_PREFIXES):
        return 0.0
    if label.startswith("replay"):  # integer ns: the unchanged replay is exact by construction
        return 1.0
    return max(1000.0, 0.01 * abs(truth))


VERDICT_TERMS = ("compute", "memory", "transfer", "coordination")


def verdict_term(verdict: str) -> int:
    """Which term the verdict's first sentence names as holding the run back (-1: none)."""
    head = verdict.split(":")[0].lower()
    for i, t in enumerate(VERDICT_TERMS):
        if head.startswith(t):
            return i
    return -1


def _load(path: Path, label: str) -> tuple[Any, Any]:
    from tracekit.analyse.analysed import AnalysedRun
    from tracekit.analyse.attribution.plan import attribute_run
    from tracekit.read import read_run

    run = AnalysedRun.of(read_run([str(path)], cache=False))
    return attribute_run(run, label=label), run


@cache
def tracekit_results(name: str, root: str) -> dict[str, Any]:
    """tracekit's JSON for the case: shortfall, whatif (every knob, Shapley) and diff."""
    from tracekit.analyse.attribution.pair import shortfall_from_parts
    from tracekit.analyse.whatif.knobs import parse_knob
    from tracekit.analyse.whatif.pair import whatif

    case = CASES[name]
    d = Path(root) / name
    write_run(case.baseline, d / "tp1", drift=case.drift)
    out: dict[str, Any] = {}
    bp, br = _load(d / "tp1", "baseline")
    knobs = [parse_knob(k) for k in (sim.KNOBS if case.sharded is not None else ("launch=0", "sync=0"))]
    if case.sharded is None:
        out["whatif"] = whatif(bp, br, None, None, knobs).to_json()
        return out
    write_run(case.sharded, d / "tpn", drift=case.drift)
    sp, sr = _load(d / "tpn", "sharded")
    sf = shortfall_from_parts(bp, sp)
    out["shortfall"] = sf.to_json()
    # the pair's shortfall (its profiler correction) made once, for both documents, as a report does
    out["whatif"] = whatif(bp, br, sp, sr, knobs, [tuple(knobs)], shortfall=sf).to_json()
    if case.after is not None:
        from tracekit.analyse.compare.diff import diff_sides
        from tracekit.analyse.compare.sides import attribute_side, rank_side_tables, side_of, side_windows
        from tracekit.read import read_run

        write_run(case.after, d / "after")
        # the before side from the sharded run's attribution above (`attribute_side` is `attribute_run`
        # and these tables): the TP=N run is read and attributed once
        before = side_of(sp, "before", str(d / "tpn"), *rank_side_tables(sr.events, side_windows(sp)))
        after = attribute_side(
            read_run([str(d / "after")], cache=False), label="after", path=str(d / "after")
        )
        out["diff"] = diff_sides(before, after).to_json()
    return out


def figures(name: str, root: str) -> dict[str, list[tuple[str, float, Fraction | int]]]:
    """Per comparison group, (label, tracekit's figure, the truth)."""
    case = CASES[name]
    tk = tracekit_results(name, root)
    tr = case_truth(name)
    g: dict[str, list[tuple[str, float, Fraction | int]]] = {}
    wi = tk["whatif"]
    if case.sharded is None:
        g["whatif"] = [
            (f"T1 under {k}", wi["predicted_ns"][k]["1"], tr["whatif"][k]["1"])
            for k in ("launch=0", "sync=0")
        ]
        g["whatif"].append(("T1", wi["runs"]["baseline"]["per_token_ns"], tr["T1"]))
        g["replay"] = [
            (
                "replay of the unchanged TP=1 trace",
                wi["runs"]["baseline"]["replay_error"]["replayed_ns"],
                tr["T1_traced"],
            )
        ]
        return g
    sf = tk["shortfall"]
    n = str(case.sharded.tp)
    g["per_token"] = [
        ("T1", sf["per_token_ns"]["baseline"], tr["T1"]),
        ("TN", sf["per_token_ns"]["sharded"], tr["TN"]),
        ("S", sf["shortfall_ns"], tr["S"]),
    ]
    terms = [(f"term {k}", sf["terms_ns"][k], tr["terms"][k]) for k in TERM_KEYS]
    terms += [(f"term {k}", sf["coordination_ns"][k], tr["terms"][k]) for k in COORD_KEYS]
    g["terms"] = terms
    per_rank = []
    for pr in sf["per_rank"]:
        r = int(pr["rank"])
        per_rank += [(f"rank {r} term {k}", pr["terms_ns"][k], tr["terms_rank"][r][k]) for k in TERM_KEYS]
        per_rank += [
            (f"rank {r} term {k}", pr["coordination_ns"][k], tr["terms_rank"][r][k]) for k in COORD_KEYS
        ]
    g["terms_per_rank"] = per_rank
    cp = sf["critical_path"]
    g["path offset"] = [("path offset", cp["offset_ns"], 0)]
    for grp, kinds in (("path device", ("compute", "memory", "transfer")), ("path host", ("host", "sync"))):
        rows: list[tuple[str, float, Fraction | int]] = []
        for r in range(case.sharded.tp):
            row = cp["by_rank"].get(str(r), {})
            rows += [(f"path rank {r} {k}", row.get(PATH_KEYS[k], 0), tr["path"][r][k]) for k in kinds]
        g[grp] = rows
    corr = sf["dilation"].get("correction", {}).get("sharded") or {}
    if corr.get("identified") is False:
        _not_identified(g, case, corr, sf, tr)
    g["replay"] = [
        (
            "replay of the unchanged TP=1 trace",
            wi["runs"]["baseline"]["replay_error"]["replayed_ns"],
            tr["T1_traced"],
        ),
        (
            f"replay of the unchanged TP={n} trace",
            wi["runs"]["sharded"]["replay_error"]["replayed_ns"],
            tr["TN_traced"],
        ),
    ]
    for k in sim.KNOBS:
        g[f"whatif {k}"] = [
            (f"T1 under {k}", wi["predicted_ns"][k]["1"], tr["whatif"][k]["1"]),
            (f"T{n} under {k}", wi["predicted_ns"][k][n], tr["whatif"][k]["N"]),
        ]
    all_key = ",".join(sim.KNOBS)
    g["whatif all"] = [
        ("T1 under all knobs", wi["predicted_ns"][all_key]["1"], tr["whatif"]["all"]["1"]),
        (f"T{n} under all knobs", wi["predicted_ns"][all_key][n], tr["whatif"]["all"]["N"]),
    ]
    g["shapley"] = [(f"shapley {k}", wi["shapley_ns"][k], tr["shapley"][k]) for k in sim.KNOBS]
    g["shapley"].append(("shapley residual", wi["shapley_ns"]["residual"], tr["shapley_residual"]))
    if wi.get("identified") is False:
        _whatif_not_identified(g, wi, tr, n)
    g["clock"] = [
        (f"clock offset rank {r}", sf["clock"]["offsets_ns"].get(str(r), 0), v)
        for r, v in tr["clock"].items()
    ]
    largest = max(range(len(VERDICT_TERMS)), key=lambda i: tr["terms"][VERDICT_TERMS[i]])
    g["verdict"] = [
        (
            "verdict names the largest term (0 compute, 1 memory, 2 transfer, 3 coordination)",
            verdict_term(sf["verdict"]),
            largest,
        )
    ]
    if case.drift is not None and len(set(tr["largest_by_round"])) > 1:
        # the rounds disagree on the cause: a verdict that names one is noise passed off as a finding
        words = sf["verdict"].lower()
        g["verdict"] = [
            (
                "verdict says the run was too noisy (the rounds disagree on the largest term)",
                int("noise" in words or "noisy" in words),
                1,
            )
        ]
    if tr["no_wait"]:
        g["diagnosis"] = [
            ("diagnosis says ranks wait (no rank waits)", int("wait" in sf["diagnosis"].lower()), 0)
        ]
    st = sf["steps"]["sharded"]
    g["steps"] = [
        ("steps matched", st["total"], tr["steps"]["total"]),
        ("steady steps", st["steady"], tr["steps"]["steady"]),
    ]
    if "diff" in tk:
        df = tk["diff"]
        g["diff"] = [("diff T", _diff_T(df), tr["diff"]["T"])]
        g["diff"] += [(f"diff term {k}", v, tr["diff"]["terms"][k]) for k, v in _diff_terms(df).items()]
        g["diff"] += [
            (
                "diff path offset" if r < 0 else f"diff path rank {r} {k}",
                v,
                0 if r < 0 else tr["diff"]["path"][r][k],
            )
            for (r, k), v in _diff_path(df).items()
        ]
    return g


def _not_identified(
    g: dict[str, list[tuple[str, float, Fraction | int]]],
    case: Any,
    corr: dict[str, Any],
    sf: dict[str, Any],
    tr: dict[str, Any],
) -> None:
    """tracekit says the per-rank split of the profiler's cost is not identified (a solved cost on
    several ranks): the figures that depend on it (wait, sync, idle per rank and their means, the
    path per rank) are held to its stated ranges, not to a point (the truth must lie in each), and
    the verdict must name no rank on the path."""
    ranges = {**corr["ranges"], **corr["term_ranges"]}
    n = case.sharded.tp

    def inside(label: str, key: str, who: str, truth: Fraction) -> tuple[str, float, Fraction | int]:
        lo, hi = ranges[key][who]
        tol = max(1000.0, 0.01 * abs(float(truth)))  # the range's ends are figures, each within it
        ok = lo - tol <= float(truth) <= hi + tol
        return (f"range: {label} truth {float(truth):.0f} in [{lo}, {hi}] +- {tol:.0f}", int(ok), 1)

    g["terms"] = [row for row in g["terms"] if row[0].split()[-1] not in COORD_KEYS]
    g["terms"] += [inside(f"term {k}", k, "mean", tr["terms"][k]) for k in COORD_KEYS]
    g["terms_per_rank"] = [row for row in g["terms_per_rank"] if row[0].split()[-1] not in COORD_KEYS]
    g["terms_per_rank"] += [
        inside(f"rank {r} term {k}", k, str(r), tr["terms_rank"][r][k]) for r in range(n) for k in COORD_KEYS
    ]
    for grp, kinds in (("path device", ("compute", "memory", "transfer")), ("path host", ("host", "sync"))):
        g[grp] = [
            inside(f"path rank {r} {k}", f"path_{k}", str(r), tr["path"][r][k])
            for r in range(n)
            for k in kinds
        ]
    # a rank named on the path must be the one the truth puts on top (tracekit names it only when
    # it tops every split of the cost: prose.robust_path_top), never a guess that depends on the split
    named = re.search(r"On the critical path, rank (\d+)'s", sf["verdict"])
    top = max(((r, k) for r in range(n) for k in tr["path"][r]), key=lambda rk: tr["path"][rk[0]][rk[1]])
    ok = named is None or int(named.group(1)) == top[0]
    g["path host"].append(
        ("range: a rank named on the path it cannot identify is the truth's top", int(ok), 1)
    )


def _whatif_not_identified(
    g: dict[str, list[tuple[str, float, Fraction | int]]], wi: dict[str, Any], tr: dict[str, Any], n: str
) -> None:
    """tracekit says the sharded run's profiler cost per rank is not identified (whatif
    `identified` false): its TP=N predictions and the Shapley values are held to the stated ranges
    (the truth must lie in each, within max(1 us, 1%) of an end), and the text must print no value
    of a Shapley split it cannot identify: the table says "not identified" on every ranged row and
    the report's answer names no knob as the largest."""
    import json

    from tracekit.model.documents import Whatif
    from tracekit.model.documents.base import decode
    from tracekit.render.whatif import table
    from tracekit.report.extras import _whatif

    pr, sr = wi["predicted_ranges_ns"], wi["shapley_ranges_ns"]

    def inside(label: str, rng: list[int], truth: Fraction | int) -> tuple[str, float, Fraction | int]:
        lo, hi = rng
        tol = max(1000.0, 0.01 * abs(float(truth)))
        ok = lo - tol <= float(truth) <= hi + tol
        return (f"range: {label} truth {float(truth):.0f} in [{lo}, {hi}] +- {tol:.0f}", int(ok), 1)

    for k in sim.KNOBS:
        g[f"whatif {k}"] = [row for row in g[f"whatif {k}"] if not row[0].startswith(f"T{n} ")]
        g[f"whatif {k}"].append(inside(f"T{n} under {k}", pr[k][n], tr["whatif"][k]["N"]))
    all_key = ",".join(sim.KNOBS)
    g["whatif all"] = [row for row in g["whatif all"] if not row[0].startswith(f"T{n} ")]
    g["whatif all"].append(inside(f"T{n} under all knobs", pr[all_key][n], tr["whatif"]["all"]["N"]))
    g["shapley"] = [inside(f"shapley {k}", sr[k], tr["shapley"][k]) for k in sim.KNOBS]
    g["shapley"].append(inside("shapley residual", sr["residual"], tr["shapley_residual"]))
    cli = {**wi, "runs": {k: {**v, "path": None} for k, v in wi["runs"].items()}}  # as the CLI writes it
    doc = decode(json.dumps(cli), Whatif)
    text = table(doc, width=200, color=False)
    ranged = [k for k, (lo, hi) in sr.items() if round(lo / 1e6, 3) != round(hi / 1e6, 3)]
    cells = [line.replace("\u2502", " ").split() for line in text.splitlines()]  # the table's rows
    rows = {c[0]: " ".join(c) for c in cells if c and c[0] in sr}
    ok = all("not identified" in rows.get(k, "") for k in ranged)
    answer = _whatif(doc).answer
    ok = ok and "not identified" in answer and "gives" not in answer
    g["shapley"].append(("range: the what-if text prints no Shapley value it cannot identify", int(ok), 1))


def _diff_T(df: dict[str, Any]) -> float:
    return float(df["change_ns"])


def _diff_terms(df: dict[str, Any]) -> dict[str, float]:
    bp = df["by_part"]
    out = {k: float(bp["terms"][k]["change_ns"]) for k in TERM_KEYS}
    out.update({k: float(bp["leaves"][k]["change_ns"]) for k in COORD_KEYS})
    return out


def _diff_path(df: dict[str, Any]) -> dict[tuple[int, str], float]:
    ch = df["critical_path"]["change"]
    out: dict[tuple[int, str], float] = {(-1, "offset"): float(ch["offset_ns"])}
    for r, row in ch["by_rank"].items():
        for k, v in PATH_KEYS.items():
            out[(int(r), k)] = float(row.get(v, 0))
    return out
