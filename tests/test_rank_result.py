"""The capture's rank result files (tracekit/capture/rank_result.py): one Struct written by the
rank, merged field by field, decoded once by the runner; a damaged file is its rank's error in the
manifest, naming the file and the field."""

from __future__ import annotations

from pathlib import Path

from tracekit.capture.manifest import build_manifest
from tracekit.capture.rank_result import RankError, RankResult, read_results, write_result
from tracekit.model.documents.manifest import ManifestFilesValue, ManifestWorkload


def test_write_result_merges_the_fields_a_rank_writes_as_it_goes(tmp_path: Path) -> None:
    write_result(tmp_path, RankResult(rank=1, device="cpu", pid=41))
    write_result(tmp_path, RankResult(rank=1, unprofiled_ns=[5, 6], pid=42))
    got = read_results(tmp_path)
    assert list(got) == [1]
    r = got[1]
    assert (r.device, r.pid, r.unprofiled_ns) == ("cpu", 42, [5, 6])
    assert '"profiled_ns"' not in (tmp_path / ".rank-1.result.json").read_text()  # unset: absent


def test_a_damaged_result_file_is_its_ranks_error_naming_the_file_and_field(tmp_path: Path) -> None:
    entry = ManifestFilesValue(rank=0, sha256="0" * 64, bytes=3)
    write_result(tmp_path, RankResult(rank=0, file=entry, unprofiled_ns=[10, 10], pid=7))
    (tmp_path / ".rank-1.result.json").write_text('{"rank": 1, "pid": "seven", "unprofiled_ns": [10]}')
    (tmp_path / ".rank-2.result.json").write_text('{"rank": 2, "pid": 9')  # cut short
    got = read_results(tmp_path)
    assert sorted(got) == [0, 1, 2]
    e1, e2 = got[1].error, got[2].error
    assert isinstance(e1, RankError) and isinstance(e2, RankError)
    assert ".rank-1.result.json" in e1.message and "$.pid" in e1.message
    assert ".rank-2.result.json" in e2.message and "not valid JSON" in e2.message
    assert got[1].unprofiled_ns is got[0].profiled_ns  # both UNSET: nothing of a damaged file is used

    m = build_manifest(world=3, results=got, workload=ManifestWorkload(tp=3), command=None)
    assert m.complete is False
    errors = {e.rank: (e.how, e.message) for e in m.errors}  # type: ignore[union-attr]
    assert set(errors) == {1, 2} and errors[1][0] == "error"
    assert "$.pid" in str(errors[1][1]) and "damaged" in str(errors[2][1])
    assert list(m.files) == ["rank-0.pt.trace.json.gz"]  # type: ignore[arg-type]
    assert m.unprofiled.per_token_ns == {"0": [10, 10]}  # type: ignore[union-attr]
