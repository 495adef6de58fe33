"""`tracekit report --extra FILE.json`: a section per decompose / advise / rho / whatif / diff result.

On the committed traces (traces/cpu-tp1, cpu-tp2) and the committed results under reports/: each
section's numbers are recomputed here from the source JSON's inputs (per-token times, throughputs),
not copied from the section; the three formats carry the same figures; names from the files are
escaped; a file of another kind is refused in one line before any analysis."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import pytest
import report_samples as rs

from tracekit.cli.main import main
from tracekit.report.extras import ExtraSection, extra_section, extra_sections
from tracekit.report.html import render_html
from tracekit.report.markdown import render_markdown

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
REPORTS = ROOT / "reports"
EXTRAS = {
    "decompose": REPORTS / "decompose" / "cpu-injected.json",
    "advise": REPORTS / "advise" / "predicted-from-committed.json",
    "rho": REPORTS / "rho" / "h200.json",
    "whatif": REPORTS / "whatif" / "cpu-straggler.json",
    "diff": REPORTS / "diff" / "h200-tp2-straggler.json",
}


def _html_figures(page: str) -> dict[str, str]:
    return {k: html.unescape(v) for k, v in re.findall(r'data-key="([^"]+)">([^<]*)</td>', page)}


def _md_figures(md: str) -> dict[str, str]:
    cell = r"(?:[^|\\]|\\.)+"  # a cell may hold escaped pipes (a name from the file)
    return {k: v for v, k in re.findall(rf"^\| {cell} \| ({cell}) \| `([^`]+)` \|$", md, flags=re.M)}


def _src(name: str) -> dict:
    return json.loads(EXTRAS[name].read_text())


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("extras")
    args = ["report", str(TRACES / "cpu-tp2"), "--baseline", str(TRACES / "cpu-tp1")]
    for p in EXTRAS.values():
        args += ["--extra", str(p)]
    for suffix in ("md", "html", "json"):
        args += ["-o", str(out / f"r.{suffix}")]
    assert main(args) == 0
    return {s: (out / f"r.{s}").read_text() for s in ("md", "html", "json")}


def test_every_kind_gets_a_section_with_its_answer_in_every_format(written):
    doc = json.loads(written["json"])
    assert [x["kind"] for x in doc["extras"]] == [f"tracekit.{k}" for k in EXTRAS]
    assert list(doc)[-3:] == ["title", "created", "generator"]
    answers = {x["command"]: x["answer"] for x in doc["extras"]}
    # the answer is the command's own sentence where it writes one
    assert answers["decompose"] == _src("decompose")["verdict"]
    assert answers["diff"] == _src("diff")["summary"]
    assert answers["advise"] == " ".join(r["text"] for r in _src("advise")["recommendations"])
    for x in doc["extras"]:
        assert x["answer"] and html.escape(x["answer"], quote=True) in written["html"]
        assert f'id="extra-{x["key"]}"' in written["html"]
        assert f"## {x['title']}" in written["md"]
    # the same printed figures in the three formats, the report's own ones untouched
    h, m = _html_figures(written["html"]), _md_figures(written["md"])
    assert h == m
    extra_keys = {f["key"]: f["text"] for x in doc["extras"] for f in x["figures"]}
    assert extra_keys and all(h[k] == t for k, t in extra_keys.items())
    assert {k["key"] for k in doc["key_figures"]} == set(h) - set(extra_keys)


def test_section_numbers_follow_from_the_source_inputs(written):
    figs = {f["key"]: f for x in json.loads(written["json"])["extras"] for f in x["figures"]}
    # decompose: A/C from the three per-token times, the runtime part log(A/B) / log(A/C)
    runs = _src("decompose")["runs"]
    a, b, c = (runs[r]["per_token_ns"] for r in ("baseline", "intermediate", "full"))
    assert figs["extra.decompose.speedup.total"]["text"].startswith(f"{a / c:.2f}x [")
    assert figs["extra.decompose.parts.runtime"]["text"].startswith(
        f"{100 * math.log(a / b) / math.log(a / c):.1f}% ["
    )
    # rho: matrix throughput / the fp32 FMA throughput of the same file
    rho = _src("rho")
    fma = next(v["tops"] for v in rho["vector"] if v["dtype"] == "fp32")
    for m in rho["matrix"]:
        if m.get("tops"):
            ratio = m["tops"] / fma
            assert figs[f"extra.rho.rho.{m['dtype']}"]["value"] == pytest.approx(ratio, rel=1e-12)
            assert figs[f"extra.rho.rho.{m['dtype']}"]["text"] == (
                f"{ratio:.1f}" if ratio >= 10 else f"{ratio:.2f}"
            )
    # advise: tokens/s = instances x batch / per-token latency
    for r in _src("advise")["options"]:
        want = r["instances"] * r["batch"] * 1e9 / r["per_token_latency_ns"]
        assert figs[f"extra.advise.b{r['batch']}.tp{r['tp']}.tokens_per_s"]["text"] == f"{want:,.0f}"
    # whatif: S = TN - T1/N from the two runs' per-token times (rounded to the ns)
    w = _src("whatif")["runs"]
    s_ns = w["sharded"]["per_token_ns"] - w["baseline"]["per_token_ns"] / w["sharded"]["ranks"]
    assert figs["extra.whatif.shortfall"]["value"] == pytest.approx(s_ns, abs=1)
    assert figs["extra.whatif.shortfall"]["text"] == f"{s_ns / 1e6:.3f} ms"
    # diff: after - before
    pt = _src("diff")["per_token_ns"]
    assert figs["extra.diff.change"]["text"].startswith(f"{(pt['after'] - pt['before']) / 1e6:+.3f} ms [")


def test_a_report_without_extras_has_no_extras_key(tmp_path: Path):
    data = rs.build(breakdown=rs.breakdown(1, 5.0))
    assert "extras" not in data.to_json()
    assert "extra" not in render_markdown(data).lower()


def test_names_from_the_files_are_escaped_in_html_and_markdown():
    evil = "<script>alert(1)</script>|`*_[x](y)"
    adv = _src("advise")
    for r in adv["options"]:
        r["option"] = evil
    rho = _src("rho")
    rho["device"]["name"] = evil
    rho["matrix"][0]["method"] = evil
    wi = _src("whatif")
    wi["check"]["knobs"] = evil
    secs = extra_sections([(adv, evil), (rho, None), (wi, None)])
    assert all(isinstance(s, ExtraSection) for s in secs)
    data = rs.build(breakdown=rs.breakdown(1, 5.0), extras=secs)
    page, md = render_html(data), render_markdown(data)
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    # the path is shown in a code span (literal, no markup: md_code); everything else is escaped
    assert "From ``<script>alert(1)</script>|`*_[x](y)``." in md
    plain = md.replace("From ``<script>alert(1)</script>|`*_[x](y)``.", "")
    assert "<script>alert(1)" not in plain and "[x](y)" not in plain
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\|\\`\\*\\_\\[x\\](y)" in md  # a table cell stays one cell
    assert _html_figures(page) == _md_figures(md)


def test_layers_note_and_two_results_of_one_kind(tmp_path: Path):
    adv = _src("advise")
    adv["layers"], adv["layers_traced"] = 32, 8
    one, two = extra_sections([(adv, None), (_src("advise"), None)])
    assert (one.key, two.key) == ("advise", "advise-2")
    assert any("memory for 32 layers (the traces have 8)" in line for line in one.lines)
    assert not any("layers" in line for line in two.lines)  # the committed file predates --layers


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"kind": "tracekit.report"}', "kind 'tracekit.report'"),
        ("[1, 2]", "no 'kind'"),
        ('{"kind": "tracekit.rho",', "x.json at byte 24: the --extra file is not valid JSON"),
        (b"\x1f\x8b\x08 gzip", "x.json at byte 1: not the --extra file (the file is a gzip file)"),
    ],
)
def test_cli_refuses_a_file_of_another_kind_in_one_line(tmp_path: Path, capsys, content, says):
    bad = tmp_path / "x.json"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    run = tmp_path / "run"
    run.mkdir()  # no traces: the refusal comes before any analysis
    assert main(["report", str(run), "--extra", str(bad), "-o", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracekit: error:") and "x.json" in err and says in err and err.count("\n") == 1


def test_cli_names_the_file_and_the_place_where_an_extra_does_not_fit(tmp_path: Path, capsys):
    """Decoded once into its Struct: a field of the wrong type is refused in one line naming the
    file and the JSON path of the field."""
    doc = _src("decompose")
    doc["speedup"]["total"] = "fast"
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps(doc))
    run = tmp_path / "run"
    run.mkdir()
    assert main(["report", str(run), "--extra", str(bad), "-o", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bad} at $.speedup.total: a tracekit.decompose document" in err


def test_a_document_missing_its_fields_is_an_error_naming_it():
    with pytest.raises(ValueError, match="broken.json: a tracekit.decompose document"):
        extra_section({"kind": "tracekit.decompose"}, "broken.json")
