"""The report layer on analysis outputs shaped like docs/JSON.md, with known numbers (tests/report_samples.py):
the waterfall sums to S, the three formats print the same numbers, trace names are escaped, the
dilation warning appears exactly when it should, and the CLI refuses bad outputs in one line."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
import report_samples as rs

from tracekit.cli.main import main
from tracekit.model import documents
from tracekit.report.build import load_links, render, write_report
from tracekit.report.html import render_html
from tracekit.report.html_escape import safe_json
from tracekit.report.markdown import render_markdown

NUM = r"(-?\d+(?:\.\d+)?)"


def html_key_figures(page: str) -> dict[str, str]:
    return {k: html.unescape(v) for k, v in re.findall(r'data-key="([^"]+)">([^<]*)</td>', page)}


def md_key_figures(md: str) -> dict[str, str]:
    return {k: v for v, k in re.findall(r"^\| [^|]+ \| ([^|]+) \| `([^`]+)` \|$", md, flags=re.M)}


def embedded_figures(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="tk-figures">(.*?)</script>', page, flags=re.S)
    assert m, "no embedded figure JSON"
    return json.loads(m.group(1))


@pytest.mark.parametrize(
    "sample, struct",
    [
        (lambda: rs.shortfall(), documents.Shortfall),
        (lambda: rs.shortfall(1.25), documents.Shortfall),
        (lambda: rs.breakdown(2, 7.0), documents.Breakdown),
        (lambda: rs.breakdown(1, 10.0), documents.Breakdown),
    ],
)
def test_samples_are_whole_documents_with_their_designed_numbers(sample, struct):
    """Every sample decodes into its typed document (the report decodes its inputs once), and the
    completion from the real document kept the designed numbers the tests below reason about."""
    doc = sample()
    typed = documents.convert(doc, struct)
    if struct is documents.Shortfall:
        assert typed.shortfall_ns == 2 * rs.MS and typed.per_token_ns.sharded == 7 * rs.MS
        assert [r.terms_ns["coordination"] for r in typed.per_rank] == [1_600_000, 800_000]
        assert typed.spread_ns["compute"].p10 == 400_000 - 1000
        # a field the designed sample leaves out is the real document's, at the same place
        assert typed.spread_ns["compute"].median == rs.real("shortfall")["spread_ns"]["compute"]["median"]
    else:
        assert typed.steps[0].parts_ns["unknown"] == 1000


def test_waterfall_sums_to_shortfall_exactly_and_in_method_order():
    data = rs.build(**rs.full_inputs())
    a = data.attribution
    assert a is not None
    steps = a.waterfall
    assert [w.term for w in steps] == [
        "compute", "memory", "transfer", "coordination.wait", "coordination.sync", "coordination.idle",
    ]  # fmt: skip
    # S = T2 - T1/2 = 7 - 5 = 2 ms, designed in report_samples
    assert sum(w.ns for w in steps) == a.shortfall_ns == 2_000_000
    pt = data.per_token_ns
    assert (pt.baseline, pt.sharded, pt.ideal) == (10_000_000, 7_000_000, 5_000_000)
    # the HTML's waterfall figure: floating bars (each starting where the last ended), then S from 0
    fig = embedded_figures(render_html(data))["fig-waterfall"]["data"][0]
    assert fig["type"] == "bar"
    assert fig["y"] == pytest.approx([0.4, 0.1, 0.3, 0.8, 0.2, 0.2, 2.0])
    assert fig["base"] == pytest.approx([0.0, 0.4, 0.5, 0.8, 1.6, 1.8, 0.0])
    assert fig["base"][5] + fig["y"][5] == pytest.approx(fig["y"][6])  # the last term ends at S
    # each bar in its class's colour (issue 24: every increasing bar was the same green, so compute
    # and coordination looked alike): compute, memory, transfer, wait, sync, idle all differ, and
    # compute is drawn as compute is in the per-step chart
    colours = fig["marker"]["color"]
    assert len(set(colours[:6])) == 6
    steps_fig = embedded_figures(render_html(data))["fig-steps-1"]["data"]
    compute = next(t for t in steps_fig if t["name"] == "compute")
    assert colours[0] == compute["marker"]["color"]


def test_markdown_and_json_carry_the_html_numbers():
    data = rs.build(**rs.full_inputs())
    page, md = render_html(data), render_markdown(data)
    doc = json.loads(render(data, "json"))
    h, m = html_key_figures(page), md_key_figures(md)
    assert len(h) >= 15
    assert h == m  # same keys, same printed values
    by_key = {k["key"]: k for k in doc["key_figures"]}
    assert set(by_key) == set(h)
    for key, text in h.items():
        shown = float(re.match(NUM, text).group(1))
        raw = by_key[key]["value"]
        if text.endswith(" ms"):
            assert shown == pytest.approx(raw / 1e6, abs=0.0005), key
        elif text.endswith("%"):
            assert shown == pytest.approx(raw * 100, abs=0.05), key
        else:
            assert text.endswith("x") and shown == pytest.approx(raw, abs=0.005), key
    # and the printed numbers are the designed ones (independent of the code's own output)
    assert h["per_token.baseline"] == "10.000 ms" and h["per_token.ideal"] == "5.000 ms"
    assert h["shortfall"] == "2.000 ms" and h["shares.coordination"] == "60.0%"
    # the JSON's structured sections agree with the key figures
    assert (
        doc["attribution"]["terms_ns"]["coordination"] == by_key["terms.coordination"]["value"] == 1_200_000
    )
    assert doc["per_token_ns"]["sharded"] == by_key["per_token.sharded"]["value"]
    # the verdict is the same sentence in all three
    assert data.verdict in md and html.escape(data.verdict) in page and doc["verdict"] == data.verdict


def test_report_json_is_versioned_and_self_describing():
    doc = json.loads(render(rs.build(**rs.full_inputs()), "json"))
    assert list(doc)[:2] == ["kind", "schema_version"]
    assert doc["kind"] == "tracekit.report" and doc["schema_version"] == "1.4"
    for key in ("verdict", "dilation", "per_token_ns", "attribution", "runs", "collectives", "stragglers",
                "busbw", "links", "manifests", "notes", "per_rank", "critical_path", "straggler",
                "term_words"):  # fmt: skip
        assert key in doc, key
    assert [r["role"] for r in doc["runs"]] == ["baseline", "sharded"]
    assert [s["rank"] for s in doc["stragglers"]] == [0, 1]
    assert {c["mode"] for c in doc["busbw"]["probes"]} == {"nvlink", "pcie"}
    # the shortfall's realised busbw wins; compare-links' trace sizes add what the shortfall lacks
    assert doc["busbw"]["trace"] == [
        {"op": "all_reduce", "bytes": 8192, "busbw_gbps": pytest.approx(8192 / 37_500), "count": 32},
        {"op": "all_gather", "bytes": 4096, "busbw_gbps": 0.25, "count": 8},
    ]
    assert doc["links"]["modes"] == ["nvlink", "pcie"]
    assert doc["links"]["transports"]["pcie"].startswith(
        "transport SHM; wire host_memory; NVLS off; no NVLink"
    )
    # per-step per-rank parts survive, and each step's parts sum to its window
    steps = doc["runs"][1]["steps"]
    assert len(steps) == 8
    assert all(sum(s["parts_ns"].values()) == s["window_ns"] for s in steps)


@pytest.mark.parametrize(
    "name",
    [rs.HOSTILE, "</script><script>alert(2)</script>", "<img src=x onerror=alert(3)>", "a&b<c>"],
)
def test_hostile_trace_names_are_escaped_everywhere(name):
    inputs = rs.full_inputs(kernel_name=name)
    inputs["shortfall"]["collectives"]["by_op"][0]["op"] = name
    inputs["manifest"]["host"]["hostname"] = name
    inputs["breakdown"]["steps"][0]["name"] = name
    data = rs.build(**inputs)
    page = render_html(data)
    md = render_markdown(data)
    assert name not in page and name not in md
    # the only <script> elements are ours: plotly.js, the figure JSON and the boot script
    assert len(re.findall(r"<script\b", page, flags=re.I)) == 3
    assert len(re.findall(r"</script", page, flags=re.I)) == 3
    assert html.escape(name) in page  # shown as text in the tables
    # inside the embedded JSON no <, > or & at all
    block = re.search(r'id="tk-figures">(.*?)</script>', page, flags=re.S).group(1)
    assert not set("<>&") & set(block)
    # the figure text carries the HTML-escaped name, which plotly shows as the original text
    assert html.escape(name) in json.dumps(embedded_figures(page))
    assert html.escape(name, quote=False) in md
    # the JSON document is data: it keeps the raw name for tools to read
    assert json.loads(render(data, "json"))["runs"][1]["unknown_kernels"][0]["name"] == name


def test_safe_json_round_trips():
    obj = {"a": "</script><b>&amp;\u2028", "n": [1, 2.5, None]}
    text = safe_json(obj)
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == obj


@pytest.mark.parametrize(("sharded", "warned"), [(1.05, False), (1.30, True), (1.10, False), (1.11, True)])
def test_dilation_is_stated_next_to_the_verdict_and_warned_above_10_percent(sharded, warned):
    data = rs.build(**rs.full_inputs(dilation_sharded=sharded))
    page, md = render_html(data), render_markdown(data)
    assert data.dilation.inflated is warned
    assert f"sharded {sharded:.2f}x" in data.dilation.sentence and "baseline 1.02x" in data.dilation.sentence
    # the dilation follows the verdict, folded under one line that states the figures (issue 24:
    # dilation and reconciliation in a collapsed section, the answer first)
    m = re.search(
        r'id="verdict">[^<]*</p>\s*(<p class="diagnosis"[^<]*</p>\s*)?<details id="dilation-details">'
        r"<summary>([^<]*)</summary>\s*<p class=\"dilation\" id=\"dilation\">Profiler dilation",
        page,
    )
    assert m and f"sharded {sharded:.2f}x" in m.group(2)
    assert (
        "<details>" in md and f"sharded {sharded:.2f}x" in md.split("<details>", 1)[1].split("</summary>")[0]
    )
    assert ('id="dilation-warning"' in page) is warned
    assert ("coordination share is inflated" in md) is warned


def test_dilation_below_one_is_a_caution_not_a_warning():
    inputs = rs.full_inputs()
    inputs["shortfall"]["dilation"]["sharded"] = 0.85  # profiled faster than unprofiled: a noisy host
    data = rs.build(**inputs)
    assert data.dilation.warning is None and not data.dilation.inflated
    assert data.dilation.caution.startswith("Caution: dilation below 1 (sharded 0.85x)")
    assert 'id="dilation-caution"' in render_html(data) and "Caution: dilation below 1" in render_markdown(
        data
    )
    assert rs.build(**rs.full_inputs()).dilation.caution is None


def test_breakdown_only_report_has_a_verdict_from_the_breakdown_and_no_shortfall():
    data = rs.build(breakdown=rs.breakdown(2, 7.0), manifest=rs.manifest(2), run_path="tp2")
    assert data.attribution is None and data.collectives is None
    # step median 7 ms, compute is 50% of the step by construction
    assert data.verdict.startswith("Per token 7.000 ms on 2 rank(s)")
    assert "compute at 50.0%" in data.verdict
    assert any("--baseline" in n for n in data.notes)
    page = render_html(data)
    assert "fig-waterfall" not in page and "fig-steps-0" in page
    assert [d.run for d in data.dilation.runs] == ["run"]
    assert html_key_figures(page) == md_key_figures(render_markdown(data))


def test_missing_manifest_is_said():
    data = rs.build(breakdown=rs.breakdown(1, 5.0))
    assert any("no manifest.json" in n for n in data.notes)
    assert "Profiler dilation" in data.dilation.sentence  # from the breakdown's own dilation: 1.05


def test_probe_rows_list_is_accepted_as_links(tmp_path: Path):
    rows = rs.links()["rows"]
    p = tmp_path / "probe.json"
    p.write_text(json.dumps(rows))
    data = rs.build(**rs.full_inputs(links=load_links(p)))
    assert len(data.busbw.probes) == 2
    assert all(len(c.points) == 11 for c in data.busbw.probes)
    # points sorted by size, busbw increasing for these rows
    pts = data.busbw.probes[0].points
    assert [q.bytes for q in pts] == sorted(q.bytes for q in pts)


def test_write_report_picks_the_format_by_suffix(tmp_path: Path):
    data = rs.build(**rs.full_inputs())
    out = write_report(data, [tmp_path / "r.html", tmp_path / "r.md", tmp_path / "sub" / "r.json"])
    assert [p.suffix for p in out] == [".html", ".md", ".json"]
    assert out[0].read_text().startswith("<!DOCTYPE html>")
    assert out[1].read_text().startswith("# tracekit report")
    assert json.loads(out[2].read_text())["kind"] == "tracekit.report"
    # self-contained by default (plotly.js inlined); offline=False (--cdn) links the CDN instead
    default = out[0].read_text()
    from tracekit.report.html import plotly_js

    js, which = plotly_js()
    assert "cdn.plot.ly/plotly" not in default and js in default
    if which.startswith("plotly.js-basic"):
        assert len(default) < 1_500_000  # the basic plotly.js bundle, not plotly.py's 4.8 MB one
    else:
        # a fresh machine without scripts/fetch_plotly_basic.sh's asset (the README's test command
        # alone): plotly.py's full bundle is inlined, the page is still whole, only larger
        assert "full bundle" in which and len(js) < len(default) < len(js) + 1_000_000
    cdn = render(data, "html", offline=False)
    assert "cdn.plot.ly/plotly" in cdn and len(cdn) < 1_000_000


def test_cli_refuses_bad_suffix_and_bad_links_in_one_line(tmp_path: Path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    assert main(["report", str(run), "-o", str(tmp_path / "r.pdf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracekit: error:") and "r.pdf" in err and err.count("\n") == 1
    bad = tmp_path / "links.json"
    bad.write_text('{"rows": [1, 2,, 3]}')
    assert main(["report", str(run), "--links", str(bad), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "links.json at byte 15: the links file is not valid JSON" in err and err.count("\n") == 1
    bad.write_bytes(b"\x1f\x8b\x08\x00 a gzip file given by mistake")
    assert main(["report", str(run), "--links", str(bad), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert (
        "links.json at byte 1: not the links file (the file is a gzip file)" in err and err.count("\n") == 1
    )
    # a links file of the wrong shape is refused naming the place (decoded once, into its Struct)
    rows = rs.links()["rows"]
    rows[3]["busbw_gbps"] = "fast"
    bad.write_text(json.dumps(rows))
    assert main(["report", str(run), "--links", str(bad), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "links.json at $[3].busbw_gbps: not a links file" in err


def test_without_plotly_the_other_formats_are_written_and_the_error_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU box without plotly must not lose the Markdown/JSON of a long study to the HTML."""
    import sys

    from tracekit.report.build import ReportError

    data = rs.build(**rs.full_inputs())
    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly -> ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    monkeypatch.delitem(sys.modules, "tracekit.report.html", raising=False)
    monkeypatch.delitem(sys.modules, "tracekit.report.html_figures", raising=False)
    outs = [tmp_path / "r.html", tmp_path / "r.md", tmp_path / "r.json"]
    with pytest.raises(ReportError, match=r"r\.html: the HTML report needs plotly") as err:
        write_report(data, outs)
    assert "r.md" in str(err.value) and "r.json" in str(err.value)
    assert (tmp_path / "r.md").read_text() and json.loads((tmp_path / "r.json").read_text())
    assert not (tmp_path / "r.html").exists()


# ----------------------------------------------------------------------------------------------
# per rank, the critical path, the dilation stated = applied, the transfer's name (issue 12)


def md_table(md: str, heading: str) -> list[list[str]]:
    """The rows (cells stripped, header and rule left out) of the first table after `heading`."""
    block = md.split(heading, 1)[1]
    rows = []
    for line in block.splitlines():
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
        elif rows:
            break
    return rows[2:]


def html_table(page: str, table_id: str) -> list[list[str]]:
    body = re.search(rf'<table id="{table_id}">.*?<tbody>(.*?)</tbody>', page, flags=re.S)
    assert body, f"no table #{table_id}"
    return [
        [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", tr)]
        for tr in re.findall(r"<tr>(.*?)</tr>", body.group(1))
    ]


def test_per_rank_rows_sum_to_s_and_average_to_the_aggregate_in_every_format():
    data = rs.build(**rs.full_inputs())
    doc = json.loads(render(data, "json"))
    pr = {r["rank"]: r for r in doc["per_rank"]}
    # the designed per-rank numbers (report_samples): rank 0 waits 1.4 ms, rank 1 0.2 ms, S = 2 ms
    assert pr[0]["coordination_ns"] == {"wait": 1_400_000, "sync": 200_000, "idle": 0}
    assert pr[1]["terms_ns"]["transfer"] == 500_000
    assert pr[0]["shares"]["wait"] == pytest.approx(0.7) and pr[1]["shares"]["idle"] == pytest.approx(0.2)
    for r in pr.values():
        assert sum(r["terms_ns"].values()) == doc["attribution"]["shortfall_ns"] == 2_000_000
        assert sum(r["coordination_ns"].values()) == r["terms_ns"]["coordination"]
    for k in ("wait", "sync", "idle"):  # the aggregate is the mean over ranks
        assert (pr[0]["coordination_ns"][k] + pr[1]["coordination_ns"][k]) / 2 == doc["attribution"][
            "coordination_ns"
        ][k]
    md_rows = md_table(render_markdown(data), "### Per rank")
    html_rows = html_table(render_html(data), "per-rank")
    assert md_rows == html_rows  # the same printed cells
    by_rank = {r[0]: r for r in html_rows}
    # columns: rank, compute, memory, transfer, coordination, wait, sync, idle, own window, pad
    assert by_rank["rank 0"][5] == "1.400 ms (70.0%)" and by_rank["rank 1"][3] == "0.500 ms (25.0%)"
    assert by_rank["mean over ranks (aggregate)"][5] == "0.800 ms (40.0%)"
    assert h_key(data, "per_rank.0.wait") == "1.400 ms"


def h_key(data, key: str) -> str:
    return html_key_figures(render_html(data))[key]


def test_critical_path_section_adds_up_and_names_the_cause():
    data = rs.build(**rs.full_inputs())
    cp = data.critical_path
    assert cp is not None
    assert sum(r.total_ns for r in cp.by_rank.values()) + cp.offset_ns == cp.step_ns == 7_000_000
    assert cp.by_rank["1"].host_ns == 2_200_000
    page, md = render_html(data), render_markdown(data)
    assert "## Critical path" in md and "**On the critical path, rank 1's host time is 2.20 ms" in md
    assert 'id="critical-path-cause"' in page
    rows = {r[0]: r for r in html_table(page, "critical-path")}
    # columns: rank, compute, memory, transfer, host, sync, unknown, on the path, share
    assert rows["rank 1"][4] == "2.200 ms" and rows["rank 1"][7] == "4.800 ms"
    assert rows["offset (step windows open at different times)"][7] == "0.100 ms"
    assert rows["per-token time T2"][7] == "7.000 ms"
    assert md_table(md, "## Critical path")[1][4] == "2.200 ms"
    # the stacked bar: per rank its parts on the path, and the offset
    fig = embedded_figures(page)["fig-critical-path"]
    assert fig["layout"]["barmode"] == "stack"
    host = next(t for t in fig["data"] if t["name"] == "host")
    assert host["x"][:2] == ["rank 0", "rank 1"] and host["y"][:2] == pytest.approx([0.5, 2.2])
    off = next(t for t in fig["data"] if t["name"].startswith("offset"))
    assert off["y"] == pytest.approx([0.1])
    total = sum(t["y"][i] for t in fig["data"] if t["name"] != off["name"] for i in range(2))
    assert total + off["y"][0] == pytest.approx(7.0)
    # the straggler test is stated with the collectives
    assert "Straggler test: rank 1 arrives last at 81% of the collectives" in md


@pytest.mark.parametrize("applied", [1.10, 1.30])
def test_stated_dilation_is_the_applied_factor_not_the_host_clock(applied):
    """report_samples gives the capture's host-clock figure 0.02 above the applied one: the report
    states the applied factor with its interval everywhere, the host clock only as a cross-check."""
    data = rs.build(**rs.full_inputs(dilation_sharded=applied))
    page, md = render_html(data), render_markdown(data)
    doc = json.loads(render(data, "json"))
    stated = f"sharded {applied:.2f}x [{applied - 0.03:.2f}-{applied + 0.03:.2f}]"
    assert stated in data.dilation.sentence and "baseline 1.02x [0.98-1.06]" in data.dilation.sentence
    assert f"{applied + 0.02:.2f}x" not in data.dilation.sentence
    # the cross-check sets the corrected per-token time against the unprofiled rounds' own mean
    assert data.dilation.cross_check.startswith("Cross-check, the corrected per-token time")
    assert "sharded 7.000 vs 7.140 ms (-2.0%)" in data.dilation.cross_check
    assert html_key_figures(page)["dilation.sharded"] == f"{applied:.2f}x"
    assert md_key_figures(md)["dilation.sharded"] == f"{applied:.2f}x"
    run = {r["run"]: r for r in doc["dilation"]["runs"]}["sharded"]
    assert run["dilation"] == applied and run["source"] == "applied"
    assert run["host_clock"]["dilation"] == pytest.approx(applied + 0.02)
    assert doc["runs"][1]["dilation"] == applied
    # the warning follows the applied factor: 1.10 is within the threshold though the host clock says 1.12
    assert data.dilation.inflated is (applied > 1.10)
    # the manifest's own figure is labelled as the capture's cross-check, not "dilation"
    assert all("dilation" not in m for m in doc["manifests"])
    assert "| capture's host-clock dilation (cross-check, not the factor applied) | 1.05x |" in md


def _transfer_lines(text: str) -> list[str]:
    """Lines that speak of the transfer, with the allowed denials ("not a GPU link") taken out;
    the inlined plotly.js library (its own code says "link" and "transfer") is not the report's."""
    from tracekit.report.html import plotly_js

    js = plotly_js()[0]
    text = text.replace(js, "").replace(html.unescape(js), "")
    out = []
    for line in text.splitlines():
        if "transfer" in line.lower():
            out.append(re.sub(r"(not|nothing about) a GPU link|compare[- ]links", "", line))
    return out


def test_cpu_run_never_calls_the_transfer_a_link_in_the_samples():
    data = rs.build(**rs.full_inputs(links=None))
    assert data.term_words["transfer"].startswith("gloo's exchange")
    md, page = render_markdown(data), render_html(data)
    for line in _transfer_lines(md) + _transfer_lines(html.unescape(page)):
        assert "link" not in line.lower(), line
    assert data.attribution.waterfall[2].label.startswith("transfer: gloo's exchange")


def test_transfer_is_named_by_the_timeline_when_the_shortfall_has_no_words():
    inputs = rs.full_inputs()
    del inputs["shortfall"]["term_words"]
    label = rs.build(**inputs).attribution.waterfall[2].label  # a host timeline: gloo
    assert label.startswith("transfer: gloo's exchange") and "bytes on the link" not in label
    inputs["breakdown"]["source"]["timeline"] = "gpu"
    assert rs.build(**inputs).attribution.waterfall[2].label.endswith("(collective transfer)")


TRACES = Path(__file__).resolve().parents[1] / "traces"
INJECTED_NS = 32_000_000  # traces/h200-tp2-straggler: rank 1 sleeps 2 ms x 16 all-reduces per token


@pytest.fixture(scope="module")
def h200_straggler():
    from tracekit.report.build import report_from_dirs

    for name in ("h200-tp1", "h200-tp2-straggler"):
        if not (TRACES / name).is_dir():
            pytest.fail(f"traces/{name} is committed and must be in the checkout")
    data = report_from_dirs(TRACES / "h200-tp2-straggler", TRACES / "h200-tp1")
    return data, data.to_json(), render_markdown(data), render_html(data)


def test_h200_straggler_report_shows_the_waiting_rank_and_the_cause_on_the_path(h200_straggler):
    """On the injected straggler the straggler's window is the longer one: a report that took the
    parts of the longest window (the defect) shows rank 0's ~44 ms of waiting as idle and ~3 ms of
    wait. Per rank, rank 0 must wait >= 85% of the 32 ms injected, and on the critical path rank 1's
    host time must be >= 85% of it, in the JSON, the Markdown and the HTML."""
    data, doc, md, page = h200_straggler
    manifest = json.loads((TRACES / "h200-tp2-straggler" / "manifest.json").read_text())
    # rank 1 sleeps 2 ms before each of its 16 all-reduces per token (8 layers x 2): 32 ms per token
    assert manifest["workload"]["inject_delay"] == {"rank": 1, "ms": 2.0}
    ar = next(o for o in doc["collectives"]["by_op"] if o["op"] == "all_reduce")
    assert ar["count"] / doc["runs"][1]["step_ns"]["n"] == 16
    pr = {r["rank"]: r for r in doc["per_rank"]}
    assert pr[0]["coordination_ns"]["wait"] >= 0.85 * INJECTED_NS
    assert pr[1]["coordination_ns"]["wait"] < 0.15 * INJECTED_NS  # the straggler itself does not wait
    host = doc["critical_path"]["by_rank"]["1"]["host_ns"]
    assert host >= 0.85 * INJECTED_NS
    assert doc["critical_path"]["by_rank"]["0"]["host_ns"] < 0.15 * INJECTED_NS
    assert doc["straggler"]["rank"] == 1 and doc["straggler"]["is_straggler"] is True
    s_ns = doc["attribution"]["shortfall_ns"]
    for r in doc["per_rank"]:  # no sub-term beyond what a rank's own accounting allows
        assert sum(r["terms_ns"].values()) == s_ns
    # the printed rows carry the same numbers
    for rows in (md_table(md, "### Per rank"), html_table(page, "per-rank")):
        row0 = next(r for r in rows if r[0] == "rank 0")
        wait_ms = float(re.match(NUM, row0[5]).group(1))
        assert wait_ms == pytest.approx(pr[0]["coordination_ns"]["wait"] / 1e6, abs=0.0005)
    for rows in (md_table(md, "## Critical path"), html_table(page, "critical-path")):
        row1 = next(r for r in rows if r[0] == "rank 1")
        assert float(re.match(NUM, row1[4]).group(1)) == pytest.approx(host / 1e6, abs=0.0005)
    assert doc["critical_path"]["cause"].startswith("On the critical path, rank 1's host time")
    assert doc["critical_path"]["cause"] in data.verdict
    assert html_key_figures(page) == md_key_figures(md)


def _steady_mean(values: list[float], skip: int = 1) -> float:
    return sum(values[skip:]) / len(values[skip:])


def _unprofiled_tokens(manifest: dict) -> list[float]:
    """Per token the slowest rank's unprofiled time, warm-up token of every round left out, pooled."""
    u = manifest["unprofiled"]
    rounds = u.get("rounds") or [u["per_token_ns"]]
    out: list[float] = []
    for rnd in rounds:
        per_rank = [rnd[r] for r in sorted(rnd)]
        out += [max(t) for t in zip(*per_rank, strict=True)][1:]
    return out


def _profiled_tokens(manifest: dict) -> list[float]:
    p = manifest["profiled"]
    rounds = p.get("rounds") or [p["per_token_ns"]]
    out: list[float] = []
    for rnd in rounds:
        per_rank = [rnd[r] for r in sorted(rnd)]
        out += [max(t) for t in zip(*per_rank, strict=True)][1:]
    return out


@pytest.mark.parametrize("sharded", ["h200-tp2-straggler", "h200-tp2"])
def test_report_dilation_equals_the_factor_applied_on_h200(sharded, h200_straggler):
    """The dilation the report states is the factor the attribution applies. By hand: these runs
    have one round of each, so D = mean profiled / mean unprofiled per-token time from the manifest
    (slowest rank per token, the first left out); the applied per-token time is the trace's mean
    steady step time (the longest rank window per step, from the report's per-step rows) / D. The
    old applied factor (traced / unprofiled mean) differs from D on these runs, so a report that
    stated one and applied the other fails here."""
    from tracekit.report.build import report_from_dirs

    if sharded == "h200-tp2-straggler":
        data, doc, md, page = h200_straggler
    else:
        data = report_from_dirs(TRACES / sharded, TRACES / "h200-tp1")
        doc, md, page = data.to_json(), render_markdown(data), render_html(data)
    stated = {r["run"]: r for r in doc["dilation"]["runs"]}
    for run, path in zip(doc["runs"], ("h200-tp1", sharded), strict=True):
        steps: dict[int, list[int]] = {}
        for s in run["steps"]:
            steps.setdefault(s["step"], []).append(s["window_ns"])
        traced = _steady_mean([max(steps[k]) for k in sorted(steps)])
        manifest = json.loads((TRACES / path / "manifest.json").read_text())
        u, p = _unprofiled_tokens(manifest), _profiled_tokens(manifest)
        by_hand = (sum(p) / len(p)) / (sum(u) / len(u))
        d = stated[run["role"]]
        assert d["dilation"] == pytest.approx(by_hand, rel=1e-9), run["role"]
        assert run["dilation"] == pytest.approx(by_hand, rel=1e-9)
        # applied: the per-token time the attribution uses is the traced one divided by it
        assert doc["per_token_ns"][run["role"] if run["role"] == "baseline" else "sharded"] == pytest.approx(
            traced / by_hand, abs=1
        )
        assert abs(traced / (sum(u) / len(u)) - by_hand) > 1e-4  # the old applied factor differs
        lo, hi = d["interval"]
        assert lo <= by_hand <= hi
        printed = f"{run['role']} {by_hand:.2f}x [{lo:.2f}-{hi:.2f}]"
        assert printed in data.dilation.sentence and printed in md
        assert html_key_figures(page)[f"dilation.{run['role']}"] == f"{by_hand:.2f}x"
    assert data.dilation.sentence.startswith("Profiler dilation (profiled / unprofiled per-token time")
    assert data.dilation.sentence in md and data.dilation.cross_check in md


def test_cpu_run_report_and_cli_never_call_the_transfer_a_link(tmp_path: Path, capsys):
    """traces/cpu-tp1 + traces/cpu-tp2 (gloo on one host): the transfer term is gloo's exchange after
    the last rank arrives, in the report (JSON words, Markdown, HTML) and in `tracekit shortfall`."""
    from tracekit.render.shortfall import table as render_table
    from tracekit.report.build import report_from_analyses

    for name in ("cpu-tp1", "cpu-tp2"):
        if not (TRACES / name).is_dir():
            pytest.fail(f"traces/{name} is committed and must be in the checkout")
    # report_from_dirs(cpu-tp2, cpu-tp1), on the pair's analyses made once for report_samples' real
    # documents (analyse_dirs: the same analyses report_from_dirs makes)
    assert rs.REAL_PAIR == (TRACES / "cpu-tp1", TRACES / "cpu-tp2")
    data = report_from_analyses(
        rs.real_analyses(), run_path=str(TRACES / "cpu-tp2"), baseline_path=str(TRACES / "cpu-tp1")
    )
    assert data.term_words["transfer"].startswith("gloo's exchange after the last rank arrives")
    md, page = render_markdown(data), html.unescape(render_html(data))
    for line in _transfer_lines(md) + _transfer_lines(page):
        assert "link" not in line.lower(), line
    assert "bytes on the link" not in md and "bytes on the link" not in page
    wf = {w.term: w.label for w in data.attribution.waterfall}
    assert wf["transfer"] == f"transfer: {data.term_words['transfer']}"
    # the CLI table of `tracekit shortfall` on the pair: the table of the pair's shortfall document
    sf = rs.real_analyses().shortfall
    text = render_table(sf, width=200, color=False)
    assert "transfer (gloo's exchange after the last rank arrives)" in text
    for line in _transfer_lines(text):
        assert "link" not in line.lower(), line
    assert "Per rank" in text and "Critical path of a token" in text
    assert "Profiler dilation applied (profiled / unprofiled per-token time from the capture's rounds" in text


def test_no_applied_factor_means_no_stated_dilation_not_the_host_clock_one():
    """A shortfall that applied no factor (no unprofiled timing) states none: the breakdown's or the
    manifest's host-clock figure must not stand in for it."""
    inputs = rs.full_inputs()
    inputs["shortfall"]["dilation"]["sharded"] = None
    data = rs.build(**inputs)
    run = {r.run: r for r in data.dilation.runs}["sharded"]
    assert run.dilation is None and data.runs[1].dilation is None
    assert "sharded" not in data.dilation.sentence and "baseline 1.02x" in data.dilation.sentence
    assert "dilation.sharded" not in {k.key for k in data.key_figures}


def test_headline_states_tn_ideal_s_the_top_term_and_the_cause_on_the_path():
    """The samples' numbers (report_samples): T2 7 ms, ideal 5 ms, S 2 ms of which coordination
    0.8 + 0.2 + 0.2 = 1.2 ms (60%); on the path rank 1's host time 2.2 ms is the largest component."""
    inputs = rs.full_inputs()
    data = rs.build(**inputs)
    assert data.headline == (
        "TP=2: 7.00 ms per token vs ideal 5.00 ms; S = 2.00 ms, 60% coordination; "
        "cause on the critical path: host time between its ops on rank 1, 2.20 of 7.00 ms."
    )
    # S's interval: the shortfall's own when it gives one, else the spread over steps, labelled
    inputs["shortfall"]["intervals"] = {"shortfall_ns": [1_500_000, 2_600_000]}  # the rest: the real one's
    inputs["shortfall"] = rs.complete(inputs["shortfall"], "shortfall")
    assert "S = 2.00 ms [95% 1.50-2.60 ms]," in rs.build(**inputs).headline
    del inputs["shortfall"]["intervals"]
    inputs["shortfall"]["spread_ns"]["shortfall"] = {"p10": 1_000_000, "p90": 3_000_000}
    inputs["shortfall"] = rs.complete(inputs["shortfall"], "shortfall")
    assert "S = 2.00 ms [p10-p90 over steps 1.00-3.00 ms]," in rs.build(**inputs).headline
    # the headline is the first line under the title in both formats, the JSON carries it on top
    page, md = render_html(data), render_markdown(data)
    assert re.search(r"</h1>\s*<p class=\"headline\" id=\"headline\">TP=2: 7.00 ms", page)
    assert md.split("\n")[2].startswith("**TP=2: 7.00 ms per token vs ideal 5.00 ms")
    assert list(data.to_json())[:3] == ["kind", "schema_version", "headline"]


def test_per_token_chart_says_what_it_plots():
    """Issue 24: the chart plotted the traced times / dilation under a title saying "unprofiled pass"."""
    data = rs.build(**rs.full_inputs())
    fig = embedded_figures(render_html(data))["fig-per-token"]
    assert "dilation-corrected" in fig["layout"]["title"]["text"]
    inputs = rs.full_inputs()
    inputs["shortfall"]["per_token_source"] = "trace"
    fig = embedded_figures(render_html(rs.build(**inputs)))["fig-per-token"]
    assert "dilation-corrected" not in fig["layout"]["title"]["text"]
    assert fig["layout"]["title"]["text"].startswith("Per-token time (traced")


def test_markdown_prose_has_no_backticks_and_numbers_align_right():
    inputs = rs.full_inputs()
    inputs["shortfall"]["verdict"] = (
        "Coordination holds this run back (see `uncorrected` for the traced figures)."
    )
    md = render_markdown(rs.build(**inputs))
    prose_lines = [ln for ln in md.splitlines() if ln and not ln.startswith("|")]
    assert not [ln for ln in prose_lines if "`" in ln and "From `" not in ln and ": `" not in ln]
    assert "see uncorrected for the traced figures" in md
    # the attribution table: label left, the three number columns right-aligned
    i = md.splitlines().index("| term | per token | share of S | spread over steps (p10 .. p90) |")
    assert md.splitlines()[i + 1] == "|---|---:|---:|---:|"


def test_sub_rows_keep_their_indent_in_markdown_and_html(h200_straggler_diff):
    md, page = h200_straggler_diff
    assert "| &nbsp;&nbsp;coordination: wait |" in md and "| &nbsp;&nbsp;compute: matrix |" in md
    assert "<td>&nbsp;&nbsp;&nbsp;&nbsp;coordination: wait</td>" in page


@pytest.fixture(scope="module")
def h200_straggler_diff():
    from tracekit.report.build import load_extras

    data = rs.build(
        **rs.full_inputs(), extras=load_extras([TRACES.parent / "reports/diff/h200-tp2-straggler.json"])
    )
    return render_markdown(data), render_html(data)


def test_busbw_chart_only_with_probe_data():
    """Issue 24: without --links the chart was two trace dots on an empty log-log grid; the realised
    busbw is in the collectives table either way."""
    with_links = embedded_figures(render_html(rs.build(**rs.full_inputs())))
    assert "fig-busbw" in with_links and len(with_links["fig-busbw"]["data"]) >= 3  # probes + trace
    data = rs.build(**rs.full_inputs(links=None))
    assert data.busbw.trace and not data.busbw.probes
    page = render_html(data)
    assert "fig-busbw" not in embedded_figures(page) and 'id="fig-busbw"' not in page
    assert "busbw (median)" in page  # the trace's own busbw, in the collectives table


def test_intervals_and_noise_readings_are_rendered():
    """The shortfall's 95% intervals (shortfall `intervals`) and readings (`noise`): the headline
    gives TN's and S's intervals, the attribution table an interval column, and a term whose
    interval holds zero gets no share ("within noise"); S within noise says so in the headline."""
    inputs = rs.full_inputs()
    sf = inputs["shortfall"]
    sf["intervals"] = {
        "level": 0.95,
        "method": "bootstrap over rounds and steps",
        "per_token_ns": {"baseline": [9_500_000, 10_500_000], "sharded": [6_800_000, 7_300_000],
                         "ideal": [4_750_000, 5_250_000]},
        "shortfall_ns": [1_600_000, 2_400_000],
        "terms_ns": {"compute": [300_000, 500_000], "memory": [-50_000, 250_000], "transfer": [250_000, 350_000],
                     "coordination": [900_000, 1_500_000]},
        "coordination_ns": {"wait": [600_000, 1_000_000], "sync": [-10_000, 400_000], "idle": [100_000, 300_000]},
    }  # fmt: skip
    sf["noise"] = {
        "status": "attributed",
        "cause": "coordination",
        "terms": {t: {"reading": "within_noise" if t == "memory" else "finding"} for t in sf["terms_ns"]},
    }
    inputs["shortfall"] = sf = rs.complete(sf, "shortfall")  # the fields not designed here: the real one's
    data = rs.build(**inputs)
    assert data.headline.startswith("TP=2: 7.00 ms [95% 6.80-7.30 ms] per token vs ideal 5.00 ms; ")
    assert "S = 2.00 ms [95% 1.60-2.40 ms], 60% coordination;" in data.headline
    md, page = render_markdown(data), render_html(data)
    assert "| term | per token | 95% interval | share of S | spread over steps (p10 .. p90) |" in md
    assert "| memory that did not scale | 0.100 ms | -0.050-0.250 ms | within noise |" in md
    assert (
        "| coordination: sync | 0.200 ms | -0.010-0.400 ms | within noise |" in md
    )  # a part: its own interval
    assert "| compute that did not scale | 0.400 ms | 0.300-0.500 ms | 20.0% |" in md
    assert "<td class=num>within noise</td>" in page
    fig = embedded_figures(page)["fig-waterfall"]["data"][0]
    assert fig["text"][1] == "0.100 ms (within noise)" and fig["text"][0] == "0.400 ms (20%)"
    sf["noise"]["status"] = "too_noisy"
    assert "S = 2.00 ms [95% 1.60-2.40 ms], too noisy to attribute" in rs.build(**inputs).headline
    sf["noise"]["status"] = "unsettled"  # S clear of zero, the resamples disagree on the largest term
    unsettled = rs.build(**inputs).headline
    assert "S = 2.00 ms [95% 1.60-2.40 ms], too noisy to say which term" in unsettled
    assert "coordination" not in unsettled


def test_one_colour_per_class_in_every_chart():
    """Issue 24: the waterfall drew every increasing bar the same green. Now a class has one colour on
    the whole page (per-step parts, critical path, collectives, waterfall), and the per-token chart's
    bars (runs, not classes) take none of the class colours."""
    figs = embedded_figures(render_html(rs.build(**rs.full_inputs())))
    seen: dict[str, set[str]] = {}
    for fid in ("fig-steps-0", "fig-steps-1", "fig-critical-path", "fig-collectives"):
        for t in figs[fid]["data"]:
            seen.setdefault(t["name"], set()).add(t["marker"]["color"])
    assert all(len(c) == 1 for c in seen.values()), seen
    wf = figs["fig-waterfall"]["data"][0]
    by_term = dict(zip(wf["x"], wf["marker"]["color"], strict=True))
    assert by_term["compute not scaled"] == next(iter(seen["compute"]))
    assert by_term["coordination: wait"] == next(iter(seen["wait"]))
    assert by_term["coordination: idle"] == next(iter(seen["idle"]))
    assert by_term["compute not scaled"] not in {by_term["coordination: wait"], by_term["coordination: idle"]}
    class_colours = {c for cs in seen.values() for c in cs} | set(wf["marker"]["color"][:-1])
    assert not set(figs["fig-per-token"]["data"][0]["marker"]["color"]) & class_colours


def test_per_step_chart_stays_readable_at_200_steps():
    """Issue 24: the per-step chart put every (rank, step) on a category axis (64 unreadable ticks
    for a 32-step TP=2 run). Now steps are numbers on a shared axis, one row per rank, so the axis
    thins its own ticks; at most 8 ranks are drawn (first, last, evenly between)."""
    from tracekit.model.documents.report import ReportRun_, ReportStep, ReportStepNs
    from tracekit.report.html_figures import fig_steps

    steps = [
        ReportStep(rank=r, step=k, name=f"decode_step#{k}", window_ns=1_000_000,
                   parts_ns={"compute": 600_000, "idle": 400_000}, overlapped_collective_ns=0)
        for r in range(16) for k in range(200)
    ]  # fmt: skip
    run = ReportRun_(
        role="sharded", path=None, n_ranks=16, ranks=list(range(16)), timeline="gpu", step_pattern="decode_step",
        step_ns=ReportStepNs(median=1_000_000, p10=1_000_000, p90=1_000_000, n=200), parts_ns_median={},
        steps=steps, per_rank=None, kernels_by_class={}, unknown_kernels=[], data_quality_notes=[], dilation=None,
    )  # fmt: skip
    fig = fig_steps(run).to_plotly_json()
    layout = fig["layout"]
    yaxes = sorted(k for k in layout if k.startswith("yaxis"))
    assert len(yaxes) == 8  # 8 of 16 ranks, each its own row
    titles = [layout[k]["title"]["text"].split("<br>")[0] for k in yaxes]
    assert titles[0] == "rank 0" and titles[-1] == "rank 15"
    for t in fig["data"]:
        assert all(isinstance(x, int) for x in t["x"]) and len(t["x"]) == 200  # numbers, not categories
    assert layout["bargap"] == 0.0 and "8 of 16 ranks" in layout["title"]["text"]
    # one legend entry per part, not one per rank
    assert sorted(t["name"] for t in fig["data"] if t.get("showlegend")) == ["compute", "idle"]


def _committed_reports() -> list[Path]:
    root = Path(__file__).resolve().parents[1] / "reports"
    return sorted(p for p in root.rglob("*.json") if b'"kind": "tracekit.report"' in p.read_bytes()[:200])


@pytest.mark.parametrize("path", _committed_reports(), ids=lambda p: str(p.relative_to(p.parents[2])))
def test_the_report_structs_hold_a_committed_report_key_for_key_in_its_order(path: Path):
    """`ReportData` is built from the `Report` document's section Structs and encoded in their
    field order: a Struct whose fields stand in another order than the writer's (top_kernels'
    `more` after `kernels` did) or that lacks a field would change the report's bytes."""
    from tracekit.model.documents.report import Report

    raw = path.read_bytes()
    assert json.dumps(documents.to_builtins(documents.decode(raw, Report))) == json.dumps(json.loads(raw))
