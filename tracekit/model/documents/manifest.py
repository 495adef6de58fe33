"""The `Manifest` document: manifest.json, written by tracekit capture beside the rank traces (docs/JSON.md#manifest)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc, given


class ManifestError(Doc, kw_only=True):
    rank: int | None | UnsetType = UNSET
    message: str | UnsetType = UNSET
    how: str | UnsetType = UNSET


class ManifestHost(Doc, kw_only=True):
    hostname: str | UnsetType = UNSET
    cpu: str | UnsetType = UNSET
    cpu_count: int | None | UnsetType = UNSET  # null: os.cpu_count() could not tell
    platform: str | UnsetType = UNSET


class ManifestDevice(Doc, kw_only=True):
    index: int | UnsetType = UNSET
    name: str | UnsetType = UNSET
    memory_bytes: int | UnsetType = UNSET
    capability: str | UnsetType = UNSET
    multiprocessors: int | UnsetType = UNSET


class ManifestNvmlLink(Doc, kw_only=True):
    gpu_a: int | UnsetType = UNSET
    gpu_b: int | UnsetType = UNSET
    p2p_nvlink: str | UnsetType = UNSET
    p2p_read: str | UnsetType = UNSET
    gpu: int | UnsetType = UNSET
    nvlink_active_links: int | UnsetType = UNSET


class ManifestTopology(Doc, kw_only=True):
    nvidia_smi_topo: str | None | UnsetType = UNSET
    nvml_links: list[ManifestNvmlLink] | None | UnsetType = UNSET


class ManifestShape(Doc, kw_only=True):
    hidden: int | UnsetType = UNSET
    heads: int | UnsetType = UNSET
    kv_heads: int | UnsetType = UNSET
    intermediate: int | UnsetType = UNSET
    layers: int | UnsetType = UNSET
    vocab: int | UnsetType = UNSET
    rope_theta: float | UnsetType = UNSET
    norm_eps: float | UnsetType = UNSET


class ManifestCollective(Doc, kw_only=True):
    op: str | UnsetType = UNSET
    name: str | UnsetType = UNSET
    in_bytes: int | UnsetType = UNSET
    out_bytes: int | UnsetType = UNSET
    dtype: str | UnsetType = UNSET
    per_token: int | UnsetType = UNSET
    group_size: int | UnsetType = UNSET


class ManifestInjectDelay(Doc, kw_only=True):
    rank: int | UnsetType = UNSET
    ms: float | UnsetType = UNSET


class ManifestNsys(Doc, kw_only=True):
    unprofiled: str | UnsetType = UNSET
    traced: str | None | UnsetType = UNSET  # null: a user's script that failed before nsys
    unprofiled_rank_pids: dict[str, int] | UnsetType = UNSET
    unprofiled_rank_pids_rounds: list[dict[str, int]] | UnsetType = UNSET
    unprofiled_after_error: str | UnsetType = UNSET
    tokens_match: bool | None | UnsetType = UNSET  # null: the traced run generated no tokens


class ManifestInterleaved(Doc, kw_only=True):
    group: str | None | UnsetType = UNSET  # null: one degree only (no pairs of degrees to draw)
    tp: list[int] | UnsetType = UNSET
    blocks: int | UnsetType = UNSET
    rounds_per_block: int | UnsetType = UNSET
    order: list[str] | UnsetType = UNSET


class ManifestCalibration(Doc, kw_only=True):
    per_call_ns: dict[str, int] | UnsetType = UNSET
    method: str | UnsetType = UNSET
    calls: int | UnsetType = UNSET
    per_rank_ns: dict[str, dict[str, int]] | UnsetType = UNSET


class ManifestWorkload(Doc, kw_only=True):
    script: list[str] | UnsetType = UNSET  # `capture -- SCRIPT`: its argv (no preset, no shape)
    preset: str | UnsetType = UNSET
    tp: int | UnsetType = UNSET
    tokens: int | UnsetType = UNSET
    prompt: int | UnsetType = UNSET
    batch: int | UnsetType = UNSET
    backend: str | UnsetType = UNSET
    device: str | UnsetType = UNSET
    dtype: str | UnsetType = UNSET
    seed: int | UnsetType = UNSET
    layers: int | UnsetType = UNSET
    shape: ManifestShape | UnsetType = UNSET
    warmup_tokens: int | UnsetType = UNSET
    profiler_warmup_steps: int | UnsetType = UNSET
    untimed_tail_steps: int | UnsetType = UNSET
    collectives: list[ManifestCollective] | UnsetType = UNSET
    inject_delay: ManifestInjectDelay | None | UnsetType = UNSET
    inject_sync: bool | UnsetType = UNSET
    cuda_graphs: bool | UnsetType = UNSET
    compile: bool | UnsetType = UNSET
    mode: str | list[str] | UnsetType = UNSET  # a list: a user's script whose ranks ran in several
    step_pattern: str | UnsetType = UNSET
    cpu_threads_per_rank: int | None | UnsetType = UNSET
    rounds: int | UnsetType = UNSET
    shard_of: int | None | UnsetType = UNSET
    decoder_impl: str | UnsetType = UNSET
    kv_cache_len: int | None | UnsetType = UNSET
    pass_order: str | UnsetType = UNSET
    batch_rounds_order: str | UnsetType = UNSET
    interleaved: ManifestInterleaved | UnsetType = UNSET
    profiler_env: dict[str, str] | UnsetType = UNSET
    nsys: ManifestNsys | UnsetType = UNSET


class ManifestUnprofiled(Doc, kw_only=True):
    per_token_ns: dict[str, list[int]] | UnsetType = UNSET
    rounds: list[dict[str, list[int]]] | UnsetType = UNSET


class ManifestProfiled(Doc, kw_only=True):
    per_token_ns: dict[str, list[int]] | UnsetType = UNSET
    rounds: list[dict[str, list[int]]] | UnsetType = UNSET
    traced_round: int | UnsetType = UNSET


class ManifestFilesValue(Doc, kw_only=True):
    rank: int | None | UnsetType = UNSET
    sha256: str | UnsetType = UNSET
    bytes: int | UnsetType = UNSET
    gzip_of: str | UnsetType = UNSET
    uncompressed_sha256: str | UnsetType = UNSET
    uncompressed_bytes: int | UnsetType = UNSET


class Manifest(Doc, kw_only=True):
    r"""`manifest.json`, written by `tracekit capture` beside the rank traces.
    ```
    { "schema_version": "1.2", "kind": "tracekit.capture",   # 1.1: workload.nsys; 1.2: rounds, dilation_interval
      "complete": true,                     # false when a rank failed; "errors" says which and why
      "errors": [ {"rank": 1, "message": "...", "how": "hung"} ],  # how: error, killed, exited, hung, collective_timeout, interrupted, no_trace
      "created": "2026-11-29T16:00:00Z",
      "versions": {"tracekit": "...", "python": "...", "torch": "...", "cuda": "..." | null, "nccl": "..." | null},
      "host": {"hostname": "...", "cpu": "...", "cpu_count": 2},
      "devices": [ {"index": 0, "name": "NVIDIA H200", "memory_bytes": ...} ],   # [] on CPU
      "topology": {"nvidia_smi_topo": "..." | null, "nvml_links": [...] | null},
      "nccl_env": {"NCCL_P2P_DISABLE": "1", ...},
      "workload": {"preset": "tiny", "tp": 2, "tokens": 8, "prompt": 16, "batch": 1, "backend": "gloo",
                   "device": "cpu", "dtype": "float32", "seed": 0, "layers": 2,
                   "inject_delay": {"rank": 1, "ms": 20.0} | null, "inject_sync": false,
                   "cuda_graphs": false, "compile": false,   # --cuda-graphs / --compile: decode steps on static
                                            # shapes, one CUDA-graph replay per token / through torch.compile
                   "mode": "full" | "cuda" | "kernels" | "cpu" | "ranges" | "nvtx",   # profiler activities used
                                            # for the trace (tracekit.capture.profile.MODES); kernels: CUDA
                                            # activity only, steps rebuilt from marker runtime calls
                   "step_pattern": "decode_step",
                   "warmup_tokens": 10,     # steps of the warm-up pass: at least every position the
                                            # measured passes reach (a new KV length can cost a plan build)
                   "profiler_warmup_steps": 1, "untimed_tail_steps": 1,
                                            # each measured pass: 1 lead + `tokens` kept + 1 tail steps, same
                                            # positions in every pass; only kept steps open decode_step ranges
                   "rounds": 3,             # --rounds K: K unprofiled and K profiled passes, alternating; every
                                            # profiled one runs under the profiler, only the last keeps its trace
                                            # (1 under --nsys; absent before 1.2 and for a user's script)
                   "pass_order": "UPUPUP",  # the order rank 0 ran the measured passes in (U unprofiled, P
                                            # profiled); --nsys: "UPU" (plain run, run under nsys, plain run)
                   "interleaved": {"group": "study-3f2a...", "tp": [1, 2], "blocks": 2, "rounds_per_block": 4,
                                   "order": ["TP=1 block 1", "TP=2 block 1", ...]},   # tracekit study: this
                                            # degree was captured in `blocks` captures alternating with the
                                            # other degrees', merged (every round, the last block's trace);
                                            # runs of one group have their rounds paired in the intervals
                   "profiler_env": {"TEARDOWN_CUPTI": "1"},   # 1.2, CUDA runs: Kineto finalises CUPTI after
                                            # each profiled round, so no profiler cost stays for the next
                                            # unprofiled one (set unless the environment sets it)
                   "collectives": [         # per rank, per decode step, from the decoder's shapes ([] at tp=1);
                                            # fills bytes where the trace has none (mode cuda/kernels, nsys)
                      {"op": "all_reduce", "name": "o_proj" | "down_proj", "in_bytes": 8192, "out_bytes": 8192,
                       "dtype": "bfloat16", "per_token": 32, "group_size": 2},   # [batch, 1, hidden] in place,
                                                                                 # once per layer each
                      {"op": "all_gather", "name": "lm_head", "in_bytes": 64000, "out_bytes": 128000,
                       "dtype": "float32", "per_token": 1, "group_size": 2}],   # [batch, vocab/tp] float32
                                            # logits in; out = group_size x in (NCCL: all_gather_into_tensor)
                   "nsys": {                # --nsys only: three runs of the same workload and ranks
                      "unprofiled": "separate runs without nsys, one before and one after the run under nsys",
                                            # `unprofiled.rounds` come from the two plain runs (1.2; one before)
                      "traced": "run under nsys: warm-up and the traced pass only; ...",
                                            # the report holds exactly `tokens` decode_step ranges per rank;
                                            # `profiled`, rank_pids, files and versions are this run's
                      "unprofiled_rank_pids": {"0": 880, "1": 881},   # the first plain run's processes
                      "unprofiled_rank_pids_rounds": [{"0": 880, "1": 881}, {"0": 950, "1": 951}],  # 1.2
                      "unprofiled_after_error": "...",   # only when the second plain run failed (one round)
                      "tokens_match": true}},   # the plain runs generated the traced run's greedy tokens
                                            # `-- SCRIPT --nsys`: the script runs the same way, plain, under
                                            # nsys, plain (TRACEKIT_CAPTURE_PASSES=unprofiled, =traced,
                                            # =unprofiled), no tokens_match; "unprofiled": "none: ...", no
                                            # second plain run and dilation null when the script has no
                                            # tracekit.profile(profiled=False) block
                                            # (absent before 1.1; 1.0 --nsys runs said `"nsys": true` and
                                            # timed both passes under nsys: their dilation is meaningless)
      "unprofiled": {"per_token_ns": {"0": [..], "1": [..]},   # host wall time per token, per rank: the
                                            # FIRST unprofiled round (what pre-1.2 readers read)
                     "rounds": [{"0": [..], "1": [..]}, ...]},  # 1.2: every unprofiled round, in run order
      "profiled":   {"per_token_ns": {"0": [..], "1": [..]},   # same, the TRACED profiled round (the one whose
                                            # trace was written)
                     "rounds": [{"0": [..], "1": [..]}, ...],  # 1.2: every profiled round, in run order
                     "traced_round": 2},    # 1.2: index of the traced round in profiled.rounds (the last)
                                            # a manifest without `rounds` has one round of each: its per_token_ns
      "dilation": 1.93,                     # mean profiled / mean unprofiled per-token time: per token the
                                            # slowest rank, the first token of every round left out, all rounds
                                            # pooled (tracekit.analyse.dilation, the figure the analysis applies;
                                            # before 1.2: median over one pass of each)
      "dilation_interval": [1.71, 2.20],    # 1.2: 95% bootstrap interval of `dilation` (rounds drawn with
                                            # replacement, as U/P pairs, then tokens within each drawn round;
                                            # 2000 resamples, seed 0); null without both kinds of times
      "profiler_calibration": {"per_call_ns": {"op": 740, "range": 820, "collective": 71000},   # the profiler's
                                            # cost per call of each kind, timed with and without it after the
                                            # warm-up (tracekit/capture/calibrate.py; "runtime" on CUDA runs);
                                            # per kind the median over ranks; keys only where measured
                   "method": "(fastest profiled - fastest plain block of 200 calls) / 200, ...", "calls": 2400,
                   "per_rank_ns": {"0": {...}, "1": {...}}},   # absent under --nsys and for a user's script
      "tokens_generated": [[...], ...],     # greedy token ids, batch-major (equality TP=N vs TP=1)
      "files": {"rank-0.pt.trace.json.gz": {"rank": 0, "sha256": "...", "bytes": 12345}},
                                            # under --nsys: "nsys.nsys-rep", "nsys.sqlite" with rank null (one
                                            # report, every rank a process in it)
      "rank_pids": {"0": 910, "1": 911},    # OS pid of each rank's process (names the processes of an nsys report)
      "marker_steps": {"0": 64},            # mode kernels only: steps rebuilt from markers, per rank
      "command": "tracekit capture --tp 2 ..." }
    ```
    Read once (`tracekit.read.manifests.read_manifest`) into this Struct, leniently: numbers not
    finite or beyond +-2**62 and workload counts out of bounds are treated as missing, a field whose
    value does not fit its type is left out (a list with one bad item as a whole), each noted in the
    run's data_quality (`manifest_field_malformed`); keys it does not know (another tool's, a user's
    script's) are kept in `unknown_fields`, which is the reader's and never in the file.
    """

    schema_version: str | UnsetType = UNSET
    kind: str | UnsetType = UNSET
    complete: bool | UnsetType = UNSET
    errors: list[ManifestError] | UnsetType = UNSET
    created: str | UnsetType = UNSET
    versions: dict[str, str | None] | UnsetType = UNSET
    host: ManifestHost | UnsetType = UNSET
    devices: list[ManifestDevice] | UnsetType = UNSET
    topology: ManifestTopology | UnsetType = UNSET
    nccl_env: dict[str, str] | UnsetType = UNSET
    workload: ManifestWorkload | UnsetType = UNSET
    unprofiled: ManifestUnprofiled | UnsetType = UNSET
    profiled: ManifestProfiled | UnsetType = UNSET
    dilation: float | None | UnsetType = UNSET
    dilation_interval: list[float] | None | UnsetType = UNSET
    profiler_calibration: ManifestCalibration | UnsetType = UNSET
    tokens_generated: list[list[int]] | None | UnsetType = UNSET
    nvtx: str | None | UnsetType = UNSET
    inject_sync_count: dict[str, int] | UnsetType = UNSET
    rank_pids: dict[str, int] | UnsetType = UNSET
    marker_steps: dict[str, int] | UnsetType = UNSET
    files: dict[str, ManifestFilesValue] | UnsetType = UNSET
    command: str | None | UnsetType = UNSET
    notes: list[str] | UnsetType = UNSET
    #: the reader's, never written by tracekit: the keys of a manifest (from another tool, a user's
    #: script, a later tracekit) that this Struct does not know, as they were
    #: (`tracekit.read.manifests`); `to_json` puts them back at the top level
    unknown_fields: dict[str, object] | UnsetType = UNSET

    def to_json(self) -> dict[str, object]:
        """The manifest as plain JSON values: its fields, then the unknown keys it was read with."""
        out = super().to_json()
        out.pop("unknown_fields", None)
        out.update(given(self.unknown_fields) or {})
        return out
