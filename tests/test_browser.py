"""The HTML report in a real browser: headless Chromium (Debian's `chromium`, installed by .ci/run)
opens the --offline page (no network in CI), runs its JavaScript, and we check: no console output
at all (so no errors, and no hostile name executed: the names below would log or throw if they
ran), every figure rendered to plotly's SVG, the verdict present, the hostile names shown as text,
and a screenshot that is not blank."""

from __future__ import annotations

import html
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
import report_samples as rs

from tracekit.report.data import build_report_data
from tracekit.report.html import render_html

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install chromium; .ci/run installs it)"
)

HOSTILE_KERNEL = "<img src=x onerror=console.error('XSS-kernel')><script>alert(1)</script>"
HOSTILE_OP = "</script><script>console.error('XSS-op')</script>"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=10000",
    "--window-size=1200,2000",
]


def chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    cmd = [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def png_pixels(path: Path) -> tuple[int, int, int, bytes]:
    """A tiny PNG decoder (8-bit RGB/RGBA, non-interlaced): width, height, channels, raw pixels."""
    blob = path.read_bytes()
    assert blob[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(blob):
        (length,) = struct.unpack(">I", blob[pos : pos + 4])
        ctype = blob[pos + 4 : pos + 8]
        chunk = blob[pos + 8 : pos + 8 + length]
        if ctype == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and interlace == 0 and colour in (2, 6), (depth, colour, interlace)
            channels = 3 if colour == 2 else 4
        elif ctype == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    out = bytearray()
    prev = bytearray(stride)
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 0xFF
            elif ftype == 2:
                line[i] = (line[i] + b) & 0xFF
            elif ftype == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 0xFF
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        out += line
        prev = line
    return width, height, channels, bytes(out)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    inputs = rs.full_inputs(kernel_name=HOSTILE_KERNEL, dilation_sharded=1.3)
    inputs["shortfall"]["collectives"]["by_op"][0]["op"] = HOSTILE_OP
    data = build_report_data(**inputs)
    path = tmp_path_factory.mktemp("report") / "report.html"
    path.write_text(render_html(data, offline=True), encoding="utf-8")
    return path, data


def test_page_runs_without_console_output_and_renders_every_figure(page, tmp_path: Path):
    path, data = page
    res = chromium(tmp_path, path, "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    console = [line for line in res.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], "console output from the page:\n" + "\n".join(console)
    dom = res.stdout
    # one plotly figure per .fig div, each rendered to SVG (plotly draws two main-svg per plot)
    figs = re.findall(r'<div id="(fig-[\w-]+)" class="fig[^"]*"', dom)
    assert set(figs) >= {
        "fig-per-token",
        "fig-waterfall",
        "fig-steps-0",
        "fig-steps-1",
        "fig-collectives",
        "fig-busbw",
        "fig-critical-path",
    }
    for fid in figs:
        block = dom.split(f'id="{fid}"', 1)[1].split('<div id="fig-', 1)[0]
        assert 'class="main-svg"' in block, f"figure {fid} did not render"
    assert re.search(r"class=\"fig\">plotly.js could not", dom) is None
    # the verdict and the dilation warning are on the page
    assert html.escape(data.verdict, quote=False) in dom
    assert 'id="dilation-warning"' in dom
    # hostile names are text: escaped in the DOM, in the tables and in the SVG axis labels
    assert HOSTILE_KERNEL not in dom and HOSTILE_OP not in dom
    assert html.escape(HOSTILE_KERNEL, quote=False) in dom
    assert "&lt;/script&gt;&lt;script&gt;console.error('XSS-op')&lt;/script&gt;" in dom
    assert "XSS" not in res.stderr


def test_screenshot_is_not_blank(page, tmp_path: Path):
    path, _ = page
    shot = tmp_path / "shot.png"
    res = chromium(tmp_path, path, f"--screenshot={shot}")
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    width, height, channels, px = png_pixels(shot)
    assert (width, height) == (1200, 2000)
    grey = [sum(px[i : i + 3]) / 3 for i in range(0, len(px), channels * 7)]  # every 7th pixel
    mean = sum(grey) / len(grey)
    variance = sum((g - mean) ** 2 for g in grey) / len(grey)
    # a blank page has variance 0; text and coloured bars give hundreds
    assert variance > 100, f"screenshot looks blank (variance {variance:.1f})"
    # the figures' colours are on screen: the TP=2 bar's orange (#F58518) and the TP=1 blue (#4C78A8)
    colours = {px[i : i + 3] for i in range(0, len(px), channels)}
    assert bytes((0xF5, 0x85, 0x18)) in colours and bytes((0x4C, 0x78, 0xA8)) in colours


def test_report_of_the_committed_cpu_traces_renders(tmp_path: Path):
    traces = Path(__file__).resolve().parents[1] / "traces"
    if not (traces / "cpu-tp1").is_dir() or not (traces / "cpu-tp2").is_dir():
        pytest.skip("committed CPU traces traces/cpu-tp1, traces/cpu-tp2 not found")
    from tracekit.report.build import report_from_dirs

    data = report_from_dirs(traces / "cpu-tp2", traces / "cpu-tp1")
    path = tmp_path / "cpu.html"
    path.write_text(render_html(data, offline=True), encoding="utf-8")
    res = chromium(tmp_path, path, "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    assert [line for line in res.stderr.splitlines() if ":CONSOLE" in line] == []
    figs = re.findall(r'<div id="(fig-[\w-]+)" class="fig[^"]*"', res.stdout)
    assert {
        "fig-per-token",
        "fig-waterfall",
        "fig-steps-0",
        "fig-steps-1",
        "fig-collectives",
        "fig-critical-path",
    } <= set(figs)
    assert res.stdout.count('class="main-svg"') >= 2 * len(figs)
    assert html.escape(data.verdict, quote=False) in res.stdout  # the DOM writes quotes as they are
