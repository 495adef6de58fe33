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
from tracekit.report.build import load_links, render, write_report
from tracekit.report.data import build_report_data
from tracekit.report.html import render_html, safe_json
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


def test_waterfall_sums_to_shortfall_exactly_and_in_method_order():
    data = build_report_data(**rs.full_inputs())
    a = data.attribution
    assert a is not None
    steps = a["waterfall"]
    assert [w["term"] for w in steps] == [
        "compute", "memory", "transfer", "coordination.wait", "coordination.sync", "coordination.idle",
    ]  # fmt: skip
    # S = T2 - T1/2 = 7 - 5 = 2 ms, designed in report_samples
    assert sum(w["ns"] for w in steps) == a["shortfall_ns"] == 2_000_000
    assert data.per_token_ns == {"baseline": 10_000_000, "sharded": 7_000_000, "ideal": 5_000_000}
    # the HTML's waterfall figure: relative bars then the total, the same numbers in ms
    fig = embedded_figures(render_html(data))["fig-waterfall"]["data"][0]
    assert fig["type"] == "waterfall"
    assert fig["measure"] == ["relative"] * 6 + ["total"]
    assert fig["y"] == pytest.approx([0.4, 0.1, 0.3, 0.8, 0.2, 0.2, 2.0])


def test_markdown_and_json_carry_the_html_numbers():
    data = build_report_data(**rs.full_inputs())
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
    doc = json.loads(render(build_report_data(**rs.full_inputs()), "json"))
    assert list(doc)[:2] == ["kind", "schema_version"]
    assert doc["kind"] == "tracekit.report" and doc["schema_version"] == "1.2"
    for key in ("verdict", "dilation", "per_token_ns", "attribution", "runs", "collectives", "stragglers",
                "busbw", "links", "manifests", "notes"):  # fmt: skip
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
    data = build_report_data(**inputs)
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
    data = build_report_data(**rs.full_inputs(dilation_sharded=sharded))
    page, md = render_html(data), render_markdown(data)
    assert data.dilation["inflated"] is warned
    assert (
        f"sharded {sharded:.2f}x" in data.dilation["sentence"]
        and "baseline 1.02x" in data.dilation["sentence"]
    )
    # the dilation line follows the verdict directly
    assert re.search(r'id="verdict">[^<]*</p>\s*<p class="dilation" id="dilation">Profiler dilation', page)
    assert ('id="dilation-warning"' in page) is warned
    assert ("coordination share is inflated" in md) is warned


def test_dilation_below_one_is_a_caution_not_a_warning():
    inputs = rs.full_inputs()
    inputs["shortfall"]["dilation"]["sharded"] = 0.85  # profiled faster than unprofiled: a noisy host
    data = build_report_data(**inputs)
    assert data.dilation["warning"] is None and not data.dilation["inflated"]
    assert data.dilation["caution"].startswith("Caution: dilation below 1 (sharded 0.85x)")
    assert 'id="dilation-caution"' in render_html(data) and "Caution: dilation below 1" in render_markdown(
        data
    )
    assert build_report_data(**rs.full_inputs()).dilation["caution"] is None


def test_breakdown_only_report_has_a_verdict_from_the_breakdown_and_no_shortfall():
    data = build_report_data(breakdown=rs.breakdown(2, 7.0), manifest=rs.manifest(2), run_path="tp2")
    assert data.attribution is None and data.collectives is None
    # step median 7 ms, compute is 50% of the step by construction
    assert data.verdict.startswith("Per token 7.000 ms on 2 rank(s)")
    assert "compute at 50.0%" in data.verdict
    assert any("--baseline" in n for n in data.notes)
    page = render_html(data)
    assert "fig-waterfall" not in page and "fig-steps-0" in page
    assert [d["run"] for d in data.dilation["runs"]] == ["run"]
    assert html_key_figures(page) == md_key_figures(render_markdown(data))


def test_missing_manifest_is_said():
    data = build_report_data(breakdown=rs.breakdown(1, 5.0))
    assert any("no manifest.json" in n for n in data.notes)
    assert "Profiler dilation" in data.dilation["sentence"]  # from the breakdown's own dilation: 1.05


def test_probe_rows_list_is_accepted_as_links(tmp_path: Path):
    rows = rs.links()["rows"]
    p = tmp_path / "probe.json"
    p.write_text(json.dumps(rows))
    data = build_report_data(**rs.full_inputs(links=load_links(p)))
    assert len(data.busbw["probes"]) == 2
    assert all(len(c["points"]) == 11 for c in data.busbw["probes"])
    # points sorted by size, busbw increasing for these rows
    pts = data.busbw["probes"][0]["points"]
    assert [q["bytes"] for q in pts] == sorted(q["bytes"] for q in pts)


def test_write_report_picks_the_format_by_suffix(tmp_path: Path):
    data = build_report_data(**rs.full_inputs())
    out = write_report(data, [tmp_path / "r.html", tmp_path / "r.md", tmp_path / "sub" / "r.json"])
    assert [p.suffix for p in out] == [".html", ".md", ".json"]
    assert out[0].read_text().startswith("<!DOCTYPE html>")
    assert out[1].read_text().startswith("# tracekit report")
    assert json.loads(out[2].read_text())["kind"] == "tracekit.report"
    assert "cdn.plot.ly" in out[0].read_text()
    offline = render(data, "html", offline=True)
    assert "cdn.plot.ly/plotly" not in offline and len(offline) > 3_000_000


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
    assert "links.json at byte 15" in err


def test_without_plotly_the_other_formats_are_written_and_the_error_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU box without plotly must not lose the Markdown/JSON of a long study to the HTML."""
    import sys

    from tracekit.report.build import ReportError

    data = build_report_data(**rs.full_inputs())
    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly -> ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    monkeypatch.delitem(sys.modules, "tracekit.report.html", raising=False)
    outs = [tmp_path / "r.html", tmp_path / "r.md", tmp_path / "r.json"]
    with pytest.raises(ReportError, match=r"r\.html: the HTML report needs plotly") as err:
        write_report(data, outs)
    assert "r.md" in str(err.value) and "r.json" in str(err.value)
    assert (tmp_path / "r.md").read_text() and json.loads((tmp_path / "r.json").read_text())
    assert not (tmp_path / "r.html").exists()


def test_report_collective_wait_is_the_waiting_ranks_wait_on_h200() -> None:
    """The report carries the shortfall's wait (median of the per-instance max wait, schema 1.4): on
    the committed H200 TP=2 run the early rank waits the whole skew (every all_reduce ends after its
    last arrival), so the reported wait is the skew, not the ~0 of a median over every rank's row."""
    from tracekit.report.build import report_from_dirs

    root = Path(__file__).resolve().parents[1] / "traces"
    if not (root / "h200-tp2").is_dir():
        pytest.skip("traces/h200-tp2 not in this checkout")
    doc = report_from_dirs(root / "h200-tp2", root / "h200-tp1").to_json()
    ar = next(o for o in doc["collectives"]["by_op"] if o["op"] == "all_reduce")
    assert ar["skew_ns_median"] > 100_000
    assert abs(ar["wait_ns_median"] - ar["skew_ns_median"]) <= 0.2 * ar["skew_ns_median"]
