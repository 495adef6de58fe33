"""tracekit study's merge of a degree's block captures (`pipeline.study.merge_blocks`), on the
manifests as read (typed), written and read back as the analysis reads them."""

from __future__ import annotations

import json
from pathlib import Path

from tracekit.model.documents.base import given
from tracekit.pipeline.study import merge_blocks
from tracekit.read.manifests import read_manifest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = [ROOT / "traces" / "cpu-tp2" / "manifest.json", ROOT / "traces" / "cpu-tp2-ranges" / "manifest.json"]


def test_merged_blocks_keep_every_round_in_order_and_read_back_without_a_note(tmp_path: Path) -> None:
    blocks = [read_manifest(p).manifest for p in BLOCKS]
    raw = [json.loads(p.read_text()) for p in BLOCKS]
    u_in = [r for d in raw for r in d["unprofiled"].get("rounds") or []]
    p_in = [r for d in raw for r in d["profiled"].get("rounds") or []]
    assert u_in and p_in
    # one degree only: no group (no pairs of degrees), which the manifest states as null
    merged = merge_blocks(blocks, group=None, tps=(2,), order=["TP=2 block 1", "TP=2 block 2"], per_block=1)
    out = tmp_path / "manifest.json"
    out.write_text(json.dumps(merged.to_json(), indent=1))
    back = read_manifest(out)
    assert back.notes == []  # group null fits the document (it was dropped with a note before)
    m = back.manifest
    wl = given(m.workload)
    assert wl is not None and wl.interleaved is not None
    il = given(wl.interleaved)
    assert (
        il is not None
        and il.group is None
        and il.blocks == 2
        and il.order == ["TP=2 block 1", "TP=2 block 2"]
    )
    assert wl.rounds == len(p_in)
    up, pp = given(m.unprofiled), given(m.profiled)
    assert up is not None and pp is not None
    assert up.rounds == u_in and up.per_token_ns == u_in[0]
    assert pp.rounds == p_in and pp.traced_round == len(p_in) - 1
    assert m.created == raw[0]["created"]  # the first block's time
    assert m.files == blocks[-1].files  # the last block's traces
    assert list(merged.to_json())[:4] == list(raw[-1])[:4]  # the capture's layout
