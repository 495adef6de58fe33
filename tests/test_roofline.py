"""The roofline of a decode step (tracekit/analyse/compute/roofline.py), checked by hand on the committed
two-H200 CUDA-graph run (7b shape, 8 layers, bf16, batch 1, static KV cache of 51 positions: prompt 16 +
34 warm-up steps + 1, the length `runner.decoder_max_len` gives the decoder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit.analyse.compute.roofline import Peaks, RooflineError, load_peaks, roofline
from tracekit.cli.main import main
from tracekit.read import read_run

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "traces" / "h200x2-tp1-b1-graphs"
COPY = ROOT / "reports" / "h200" / "copy.json"
RHO = ROOT / "reports" / "rho" / "h200.json"


@pytest.fixture(scope="module")
def doc() -> dict:
    return roofline(read_run([RUN]), load_peaks(COPY, RHO, "bfloat16"))


def test_peaks_are_the_measured_ones() -> None:
    p = load_peaks(COPY, RHO, "bfloat16")
    # reports/h200/copy.txt: local D2D 1 GiB in 505.10 us on GPU 0 -> 2 x 2^30 B read + written / 505.10 us
    assert p.bw_gbps == pytest.approx(2 * 2**30 / 505.10082244873047e3, rel=1e-9)
    # reports/rho/h200.txt: bf16 torch.mm measured 748.5 TFLOP/s
    assert p.matrix_tflops == pytest.approx(748.45, abs=0.01)


def test_one_gemm_and_one_attention_by_hand(doc: dict) -> None:
    roles = {r["role"]: r for r in doc["by_role"]}
    # gate/up projection, 8 layers: weight 4096 x (2 x 14336) bf16 + activations in (4096) and out (28672)
    gate_up = 8 * 2 * (4096 * 28672 + 4096 + 28672)
    assert roles["gate_up"]["bytes"] == gate_up == 1_879_572_480
    assert roles["gate_up"]["flops"] == 8 * 2 * 4096 * 28672
    # its floor: memory-bound at the copy rate (4251.6 GB/s): 1.8796 GB / 4251.6 GB/s = 442.1 us
    assert roles["gate_up"]["floor_ns"] == pytest.approx(1_879_572_480 / 4251.594, rel=1e-4)
    # attention, 8 layers: keys + values of the 8 KV heads over the 51-entry static cache, bf16, plus q and out
    attn = 8 * (2 * 8 * 51 * 128 * 2 + 2 * 32 * 128 * 2)
    assert roles["attention"]["bytes"] == attn == 1_802_240
    assert roles["attention"]["flops"] == 8 * 4 * 32 * 128 * 51
    assert doc["workload"]["kv_len"] == 51
    # achieved rate = bytes / measured time; the measured time is the kernels' own (their mean per token)
    assert roles["gate_up"]["achieved_gbps"] == pytest.approx(gate_up / roles["gate_up"]["time_ns"], rel=1e-3)


def test_the_floor_is_the_weights_read_once(doc: dict) -> None:
    # 7b shape, 8 layers: per layer qkv 4096 x 6144, o 4096 x 4096, gate_up 4096 x 28672, down 14336 x 4096;
    # the LM head 4096 x 32000; bf16 -> 3.75 GB (issue 26's "~3.75 GB read once per token")
    params = 8 * (4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096) + 4096 * 32000
    assert doc["per_token"]["bytes"] == pytest.approx(2 * params, rel=0.01)
    # at ~4.25 TB/s the floor is ~0.88 ms (issue 26: "~0.87 ms")
    assert 0.85e6 < doc["per_token"]["floor_ns"] < 0.90e6
    assert doc["shapes"]["matched"] is True
    # the GEMMs are near their roofline; the non-matrix kernels hold the loss
    gate_up = next(r for r in doc["by_role"] if r["role"] == "gate_up")
    assert gate_up["efficiency"] > 0.9
    assert doc["by_role"][0]["role"] == "other"
    assert "non-matrix kernels" in doc["verdict"]


def test_peaks_missing_or_wrong() -> None:
    d = roofline(read_run([RUN]), Peaks())
    assert d["per_token"]["floor_ns"] is None and "No floor" in d["verdict"]
    with pytest.raises(RooflineError, match="no measured matrix rate"):
        load_peaks(None, COPY, "bfloat16")  # a copy JSON is not a rho JSON


def test_cli_refuses_a_cpu_run_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["roofline", str(ROOT / "traces" / "cpu-tp1")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a GPU trace" in err[0]


def test_cli_json(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert (
        main(
            [
                "roofline",
                str(RUN),
                "--copy",
                str(COPY),
                "--rho",
                str(RHO),
                "--format",
                "json",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    d = json.loads(out.read_text())
    assert d["kind"] == "tracekit.roofline" and d["per_token"]["efficiency"] < 0.6


def test_the_static_kv_length_is_the_cache_the_capture_gave_the_decoder() -> None:
    """workload.kv_cache_len when recorded; else the runner's decoder length (prompt + warm-up steps + 1:
    `runner.decoder_max_len`), as for the committed graph runs; else the old default."""
    from tracekit.analyse.compute.roofline import KV_STATIC_LEN, _static_kv_len
    from tracekit.model.documents.manifest import ManifestWorkload
    from tracekit.read import load_manifest

    assert _static_kv_len(ManifestWorkload(kv_cache_len=64, prompt=16, warmup_tokens=34))[0] == 64
    assert _static_kv_len(ManifestWorkload(prompt=16, warmup_tokens=34))[0] == 51
    assert _static_kv_len(ManifestWorkload())[0] == KV_STATIC_LEN
    assert "kv_cache_len" not in json.loads((RUN / "manifest.json").read_text())["workload"]
    wl = load_manifest(RUN / "manifest.json").workload
    assert isinstance(wl, ManifestWorkload) and _static_kv_len(wl)[0] == 51
