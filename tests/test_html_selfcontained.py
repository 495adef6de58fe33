"""Reports open anywhere: `tracekit report` (and `study`) write HTML with plotly.js inlined by
default, so an air-gapped machine draws the charts; `--cdn` links it instead; `--offline` is still
accepted (it is the default now)."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from tracekit.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
ARGS = [str(ROOT / "traces" / "cpu-tp2"), "--baseline", str(ROOT / "traces" / "cpu-tp1")]


class _Refs(HTMLParser):
    """Every resource a page would fetch: script src, link href, img/iframe src."""

    def __init__(self) -> None:
        super().__init__()
        self.external: list[str] = []
        self.inline_scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        ref = a.get("src") if tag in ("script", "img", "iframe") else a.get("href") if tag == "link" else None
        if ref:
            self.external.append(ref)
        elif tag == "script":
            self.inline_scripts += 1


def _refs(text: str) -> _Refs:
    p = _Refs()
    p.feed(text)
    return p


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The report of ARGS written by the CLI with each way of shipping plotly.js. The pair is
    analysed once (the first command's analyses are handed to the next two: what is checked here
    is how the page is written, and the analyses do not depend on it; ~1 CPU-s a command)."""
    from tracekit import engine

    real, memo = engine.analyse_dirs, {}

    def analysed_once(*a: object, **k: object) -> object:
        key = repr((a, sorted(k.items())))
        if key not in memo:
            memo[key] = real(*a, **k)
        return memo[key]

    tmp = tmp_path_factory.mktemp("html")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "analyse_dirs", analysed_once)
        for label, extra in (("default", []), ("cdn", ["--cdn"]), ("offline", ["--offline"])):
            path = tmp / f"{label}.html"
            assert main(["report", *ARGS, "-o", str(path), *extra]) == 0
            out[label] = path.read_text(encoding="utf-8")
    assert len(memo) == 1  # the three commands asked for the same analyses
    return out


def test_default_report_fetches_nothing(pages):
    page = pages["default"]
    refs = _refs(page)
    assert refs.external == []  # no script, stylesheet or image from anywhere
    # plotly.js itself is in the page: the basic bundle (bar and scatter traces, every chart the
    # report draws) when scripts/fetch_plotly_basic.sh put it in the asset cache (.ci/run does), so
    # the page stays under ~1.5 MB (issue 24: 4.9 MB before); else plotly.py's full bundle
    from tracekit.report.html import plotly_js

    js, which = plotly_js()
    assert js in page and len(page) > len(js)
    if not which.startswith("plotly.js-basic-dist-min"):
        pytest.skip("the basic plotly.js bundle is not in the asset cache (scripts/fetch_plotly_basic.sh)")
    assert len(page) < 1_500_000


def test_offline_is_an_alias_of_the_default(pages):
    assert _refs(pages["offline"]).external == []
    from tracekit.report.html import plotly_js

    assert pages["offline"].count(plotly_js()[0]) == 1


def test_cdn_links_plotly_with_its_integrity_hash(pages):
    refs = _refs(pages["cdn"])
    assert len(refs.external) == 1 and refs.external[0].startswith("https://cdn.plot.ly/plotly-")
    assert 'integrity="sha384-' in pages["cdn"]
    assert len(pages["cdn"]) < len(pages["default"]) - 1_000_000


def test_cdn_and_offline_together_is_one_usage_error(tmp_path: Path, capsys):
    for cmd in (["report", *ARGS, "-o", str(tmp_path / "r.html")], ["study", "-o", str(tmp_path / "s")]):
        assert main([*cmd, "--cdn", "--offline"]) == 2
        err = capsys.readouterr().err
        assert "--cdn and --offline" in err and err.count("\n") == 1
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "s").exists()


def test_study_inlines_plotly_by_default():
    from tracekit.pipeline.study import StudyConfig

    assert StudyConfig().offline is True
