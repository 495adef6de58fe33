"""The Kineto reader's event mapping (tracekit.read.kineto): decoded chunks -> numpy columns of the
event table. Kinds from `cat` (`KIND_OF_CAT`), names interned as categorical codes, timestamps
parsed exactly from the JSON number text into integer ns (`parse_us_to_ns`), pid/tid/device/stream
and the comm args of each complete event, with every skipped event counted by phase in data quality."""

from __future__ import annotations

import operator
import re
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from itertools import filterfalse
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from tracekit.model.events import DataQuality
from tracekit.model.launch import COLLECTIVE_LAUNCH_OP
from tracekit.read.kineto_decode import PHASE_OF_TYPE, Args, Ev, EvB, EvE
from tracekit.read.kineto_ints import INT32_MAX, MAX_DUR_US, int_column

KIND_OF_CAT: dict[str, str] = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "cuda_sync": "sync",
    "cpu_op": "cpu_op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
}
#: other spellings of those categories, matched case-insensitively: PyTorch 1.8's Kineto traces
#: ("Operator", "Runtime", "Kernel", "Memcpy", "Memset", as torch-tb-profiler also reads them) and
#: Kineto's runtimes of other devices (XPU, MTIA, PrivateUse1 backends)
_CAT_ALIASES: dict[str, str] = {
    "operator": "cpu_op",
    "runtime": "runtime",
    "memcpy": "memcpy",
    "memset": "memset",
    "xpu_runtime": "runtime",
    "xpu_driver": "runtime",
    "mtia_runtime": "runtime",
    "privateuse1_runtime": "runtime",
    "privateuse1_driver": "runtime",
}


def kind_of_cat(cat: str) -> str:
    """The event kind of a Kineto `cat` ("other" for categories tracekit does not use)."""
    kind = KIND_OF_CAT.get(cat)
    if kind is None:
        low = cat.lower()
        kind = KIND_OF_CAT.get(low) or _CAT_ALIASES.get(low, "other")
    return kind


_GPU_KINDS = frozenset({"kernel", "memcpy", "memset", "gpu_annotation"})

_HOST_COLL_PREFIX = re.compile(r"^(?:gloo:|nccl:|c10d::)")
#: torch.profiler's step range: an annotation whatever CPU category its writer gave it (PyTorch
#: 1.8's Kineto wrote it as an `Operator`, like every record_function range; today `user_annotation`)
_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
#: a rank label in a string pid, as trace-merging tools write them ("[TP01] 1234", "rank 3 / pid 9")
_PID_RANK_RE = re.compile(r"(?:^|[^A-Za-z])(?:TP|rank|Rank|RANK)[ _-]?(\d{1,6})(?![0-9])")


# ----------------------------------------------------------------------------------------------
# Exact timestamp parsing: JSON number text (microseconds) -> integer nanoseconds


_POW10 = np.array([10**k for k in range(19)], dtype=np.int64)
_DEC_INT64_MIN = Decimal(-(2**63))
_DEC_INT64_MAX = Decimal(2**63 - 1)


def _text_matrix(texts: Sequence[Any], n: int) -> tuple[np.ndarray, bool]:
    """The texts as an (n, width) uint8 matrix, right-padded with NUL (one join, no object per row),
    and whether every text has the same length."""
    lengths = np.fromiter(map(len, texts), np.int64, n)
    w = int(lengths.max())
    flat = np.frombuffer(b"".join(texts), np.uint8)
    if w == 0:
        return np.zeros((n, 1), np.uint8), True
    if int(lengths.min()) == w:
        return flat.reshape(n, w), True
    m = np.zeros((n, w), np.uint8)
    row = np.repeat(np.arange(n), lengths)
    col = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    m[row, col] = flat
    return m, False


def _parse_fixed(m: np.ndarray) -> tuple[np.ndarray, int] | None:
    """Fast path: every row is digits with the point in one column (Kineto's fixed-decimals ts)."""
    n, w = m.shape
    first = bytes(m[0])
    d0 = first.find(b".")
    cols = np.arange(w)
    other = cols != d0
    if not other.any():
        return None
    if d0 >= 0 and not (m[:, d0] == 46).all():
        return None
    if not ((m[:, other] - np.uint8(48)) <= 9).all():  # uint8 wrap-around: non-digits are > 9
        return None
    if d0 < 0:
        d0 = w
    pw = np.where(cols < d0, d0 - cols + 2, d0 - cols + 3)[other]  # power of ten in ns
    if (pw > 18).any():
        return None
    digits = m[:, other]
    if (pw == 18).any() and (digits[:, pw == 18] >= 57).any():  # >= 9e18 ns: may not fit int64
        return None
    keep = pw >= 0
    ns = (digits[:, keep].astype(np.int64) - 48) @ _POW10[pw[keep]]
    sub = int((digits[:, ~keep] != 48).any(axis=1).sum()) if (~keep).any() else 0
    return ns, sub


def parse_us_to_ns(
    texts: Sequence[Any], counts: dict[str, int] | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """Parse JSON number texts (bytes or msgspec.Raw) in microseconds into exact integer ns.

    Returns (ns int64, valid bool, sub_ns) where `valid` is False for empty/non-numeric text and
    `sub_ns` counts values with more than 3 decimals (digits below 1 ns are dropped, truncating).
    Exponent notation (1.5e3) is handled exactly through Decimal for those rows.

    Vectorised over a (rows, characters) byte matrix: each digit's power of ten comes from its
    distance to the row's decimal point, and a row's value is the integer sum of digit x 10**power
    (no float anywhere). When all rows share one layout (the usual case: Kineto writes a fixed
    number of decimals) this is one integer matrix product (`_parse_fixed`).
    """
    n = len(texts)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, bool), 0
    m, same_length = _text_matrix(texts, n)
    if same_length:
        fixed = _parse_fixed(m)
        if fixed is not None:
            return fixed[0], np.ones(n, bool), fixed[1]
    w = m.shape[1]
    isdig = (m >= 48) & (m <= 57)
    isdot = m == 46
    # allowed non-digits: the point, NUL padding, a sign, the quotes of a string value
    odd_rows = ~(isdig | isdot | (m == 0) | (m == 45) | (m == 43) | (m == 34))
    odd = odd_rows.any(axis=1) | (isdot.sum(axis=1) > 1)
    has_dot = isdot.any(axis=1)
    any_dig: np.ndarray = np.asarray(isdig.any(axis=1))
    last_dig = w - 1 - np.argmax(isdig[:, ::-1], axis=1)
    dot = np.where(has_dot, np.argmax(isdot, axis=1), last_dig + 1)
    cols = np.arange(w)
    pw = np.where(
        cols[None, :] < dot[:, None], dot[:, None] - cols[None, :] + 2, dot[:, None] - cols[None, :] + 3
    )
    sub: np.ndarray = np.asarray((isdig & (pw < 0) & (m != 48)).any(axis=1))
    odd = odd | (isdig & ((pw > 18) | ((pw == 18) & (m >= 57)))).any(axis=1)  # may not fit int64
    use = isdig & (pw >= 0) & (pw <= 18)
    ns = np.where(use, (m.astype(np.int64) - 48) * _POW10[np.clip(pw, 0, 18)], 0).sum(axis=1)
    first = m[:, 0]
    if counts is not None:  # numbers written as JSON strings ("123.5"): read, and counted
        counts["strings"] = counts.get("strings", 0) + int(((first == 34) & valid_text(m)).sum())
    neg = (first == 45) | ((first == 34) & (m[:, 1] == 45) if w > 1 else False)
    if neg.any():
        ns = np.where(neg, -ns, ns)
    valid = any_dig.copy()
    if odd.any():
        for i in np.flatnonzero(odd).tolist():
            try:
                raw = bytes(texts[i])
                if len(raw) > 64:  # no timestamp is written with more digits; 1e900000-style texts
                    raise ValueError(raw[:20])
                v = Decimal(raw.decode().strip('"')) * 1000
                # the check before int(): int() of Decimal("1e900000") builds a 900k-digit number
                valid[i] = v.is_finite() and _DEC_INT64_MIN <= v <= _DEC_INT64_MAX
                ns[i] = int(v) if valid[i] else 0
                sub[i] = bool(valid[i]) and v != v.to_integral_value()
            except (InvalidOperation, ValueError, OverflowError, ArithmeticError, UnicodeDecodeError):
                valid[i] = False
                sub[i] = False
    return ns, valid, int(sub.sum())


def valid_text(m: np.ndarray) -> np.ndarray:
    """Rows of a text matrix holding at least one digit."""
    return np.asarray(((m >= 48) & (m <= 57)).any(axis=1))


# ----------------------------------------------------------------------------------------------
# Chunk -> columns


_is_complete = Ev.__instancecheck__
_get_ts = operator.attrgetter("ts")
_get_dur = operator.attrgetter("dur")
_get_cat = operator.attrgetter("cat")
_get_name = operator.attrgetter("name")
_get_args = operator.attrgetter("args")
_get_pid = operator.attrgetter("pid")
_get_tid = operator.attrgetter("tid")
_get_device = operator.attrgetter("device")
_get_stream = operator.attrgetter("stream")
_get_corr = operator.attrgetter("correlation")


class _Interner(dict):  # type: ignore[type-arg]
    """str -> code, a new code on first sight (C-speed lookups through map(d.__getitem__, ...))."""

    def __missing__(self, key: str) -> int:
        code = self[key] = len(self)
        return code


class _CatKinds(dict):  # type: ignore[type-arg]
    """Kineto `cat` -> kind code."""

    def __init__(self, kind_codes: dict[str, int]):
        super().__init__()
        self.kind_codes = kind_codes

    def __missing__(self, key: str) -> int:
        code = self[key] = self.kind_codes[kind_of_cat(key)]
        return code


class Columns:
    """Accumulates per-chunk numpy columns and interned strings."""

    def __init__(self) -> None:
        self.start: list[np.ndarray] = []
        self.dur: list[np.ndarray] = []
        self.kind: list[np.ndarray] = []
        self.name: list[np.ndarray] = []
        self.device: list[np.ndarray] = []
        self.stream: list[np.ndarray] = []
        self.corr: list[np.ndarray] = []
        self.names: dict[str, int] = _Interner()
        self.kind_codes = {k: i for i, k in enumerate(KIND_CATEGORIES)}
        self.cat_codes = _CatKinds(self.kind_codes)
        self.rows = 0
        # sparse collective metadata: global row -> tuple
        self.coll_rows: list[int] = []
        self.coll_vals: list[tuple[Any, ...]] = []
        # record_shapes of host collective ops (gloo:, nccl:, c10d::): global row -> raw JSON texts
        self.shape_rows: list[int] = []
        self.shape_vals: list[tuple[bytes, bytes]] = []
        self._coll_codes: list[int] = []
        self._step_codes: list[int] = []
        self._names_checked = 0
        self.dq = DataQuality()
        self.events_total = 0
        self.begin_end: list[Any] = []  # "B" / "E" events, paired once the whole file is read
        self.pid_rank_labels: set[int] = set()  # ranks named in string pids (merged traces)

    def host_collective_codes(self) -> np.ndarray:
        """Name codes of host collective ops (`gloo:*`, `nccl:*`, `c10d::*`, and engines' collective
        ops such as `sglang::outplace_all_reduce`: `tracekit.model.launch.COLLECTIVE_LAUNCH_OP`),
        names seen so far."""
        if self._names_checked < len(self.names):
            new = list(self.names)[self._names_checked :]
            self._coll_codes.extend(
                self.names[n] for n in new if _HOST_COLL_PREFIX.match(n) or COLLECTIVE_LAUNCH_OP.search(n)
            )
            self._step_codes.extend(self.names[n] for n in new if _PROFILER_STEP.match(n))
            self._names_checked = len(self.names)
        return np.asarray(self._coll_codes, np.int32)

    def _steps_as_annotations(self, kind: np.ndarray, name: np.ndarray) -> None:
        """`ProfilerStep#N` written as a CPU op (PyTorch 1.8/1.9-era traces: `cat` "Operator") is
        the step annotation it is in every later generation: kind `annotation` (in place)."""
        self.host_collective_codes()  # brings the name scan up to date
        if self._step_codes:
            hit = (kind == self.kind_codes["cpu_op"]) & np.isin(name, np.asarray(self._step_codes, np.int32))
            kind[hit] = self.kind_codes["annotation"]

    def add(self, evs: list[Any]) -> None:
        self.events_total += len(evs)
        xs: list[Ev] = list(filter(_is_complete, evs))
        if len(xs) != len(evs):
            for t, cnt in Counter(map(type, filterfalse(_is_complete, evs))).items():
                if t is EvB or t is EvE:
                    continue
                self.dq.add(_PHASE_KEY.get(PHASE_OF_TYPE.get(t, "?"), "skipped_other_phase_events"), cnt)
            self.begin_end.extend(e for e in evs if type(e) is EvB or type(e) is EvE)
        self._add_complete(xs)

    def finish_begin_end(self) -> None:
        """Pair the duration events ("B" / "E") of each thread, as the Chrome trace format defines
        them: an "E" ends the innermost open "B" of its (pid, tid), in time order (file order among
        equal times); each pair becomes a complete event with the B's name, category and args."""
        be, self.begin_end = self.begin_end, []
        if not be:
            return
        ts_counts: dict[str, int] = {}
        ts_ns, ts_ok, _sub = parse_us_to_ns([e.ts for e in be], ts_counts)
        threads: dict[tuple[Any, Any], list[int]] = {}
        for i, e in enumerate(be):
            if ts_ok[i]:
                threads.setdefault((e.pid, e.tid), []).append(i)
        bad_ts = int((~ts_ok).sum())
        unmatched = 0
        xs: list[Ev] = []
        for idx in threads.values():
            order = sorted(idx, key=lambda i: (int(ts_ns[i]), i))
            open_: list[int] = []
            for i in order:
                if type(be[i]) is EvB:
                    open_.append(i)
                elif open_:
                    bi = open_.pop()
                    b = be[bi]
                    xs.append(
                        Ev(
                            cat=b.cat,
                            name=b.name,
                            ts=b.ts,
                            dur=(int(ts_ns[i]) - int(ts_ns[bi])) / 1000.0,
                            pid=b.pid,
                            tid=b.tid,
                            args=b.args,
                        )
                    )
                else:
                    unmatched += 1
            unmatched += len(open_)
        if unmatched or bad_ts:
            self.dq.add(
                "begin_end_unmatched",
                unmatched + bad_ts,
                "duration events (B/E) without their other half on the same thread, or without a usable "
                "ts, were skipped",
            )
        self._add_complete(xs)

    def _note_rank_labels(self, xs: list[Ev]) -> None:
        """Remember rank labels in string pids ("[TP01] 1234", "rank 3"): several ranks merged
        into one file by a trace-merging tool, which one rank's analysis would mix up."""
        for v in {e.pid for e in xs if isinstance(e.pid, str)}:
            if m := _PID_RANK_RE.search(v):
                self.pid_rank_labels.add(int(m.group(1)))

    def note_merged_ranks(self, file_name: str) -> None:
        labels = sorted(self.pid_rank_labels)
        if len(labels) >= 2:
            shown = ", ".join(map(str, labels[:8])) + (" ..." if len(labels) > 8 else "")
            self.dq.add(
                "merged_ranks_in_one_file",
                len(labels),
                f"{file_name}: its process ids carry {len(labels)} rank labels (ranks {shown}): several "
                "ranks' traces merged into one file; tracekit reads a Kineto file as one rank, so its "
                "steps and parts mix those ranks: pass the per-rank trace files instead",
            )

    def _add_complete(self, xs: list[Ev]) -> None:
        if not xs:
            return
        n = len(xs)
        ts_counts: dict[str, int] = {}
        ts_ns, ts_ok, sub_ns = parse_us_to_ns(list(map(_get_ts, xs)), ts_counts)
        if ts_counts.get("strings"):
            self.dq.add(
                "ts_as_string",
                ts_counts["strings"],
                "timestamps written as JSON strings were read as the numbers they spell",
            )
        if sub_ns:
            self.dq.add(
                "ts_sub_ns_digits_dropped", sub_ns, "some timestamps had digits below 1 ns; they were dropped"
            )
        dur_us = np.fromiter(map(_get_dur, xs), np.float64, n)
        dur_ok = np.isfinite(dur_us)
        huge_dur = dur_ok & (np.abs(dur_us) >= MAX_DUR_US)
        if huge_dur.any():  # would not fit int64 ns (or spans centuries): unusable
            dur_ok &= ~huge_dur
            self.dq.add_rows(
                "events_huge_dur",
                huge_dur,
                f"events with a dur of {MAX_DUR_US:.0e} us or more (beyond int64 ns) were skipped",
            )
        dur_ns = np.zeros(n, np.int64)
        dur_ns[dur_ok] = np.rint(dur_us[dur_ok] * 1000.0).astype(np.int64)
        neg = dur_ok & (dur_ns < 0)
        keep = ts_ok & dur_ok & ~neg
        if not keep.all():
            self.dq.add(
                "events_without_ts",
                int((~ts_ok).sum()),
                "complete (X) events without a usable ts were skipped",
            )
            self.dq.add(
                "events_without_dur",
                int((ts_ok & ~dur_ok & ~huge_dur).sum()),
                "complete (X) events without a usable dur were skipped",
            )
            self.dq.add(
                "events_negative_dur", int((ts_ok & neg).sum()), "events with a negative dur were skipped"
            )
            idx = np.flatnonzero(keep)
            xs = [xs[i] for i in idx]
            ts_ns = ts_ns[idx]
            dur_ns = dur_ns[idx]
            n = len(xs)
            if not xs:
                return
        # kinds and names: interned through dicts (codes assigned on first sight)
        kind = np.fromiter(map(self.cat_codes.__getitem__, map(_get_cat, xs)), np.int8, n)
        name = np.fromiter(map(self.names.__getitem__, map(_get_name, xs)), np.int32, n)
        self._steps_as_annotations(kind, name)
        # device / stream / correlation
        args: list[Args] = list(map(_get_args, xs))
        is_gpu = np.isin(kind, self._gpu_codes)
        dq = self.dq
        dev_arg = int_column(_get_device, args, n, dq, "args.device")
        pid = int_column(_get_pid, xs, n, dq, "pid")
        if (pid == -1).any():  # a pid that is no integer reads as -1: only then look at the strings
            self._note_rank_labels(xs)
        device = np.where(is_gpu, np.where(dev_arg >= 0, dev_arg, pid), -1)
        device = np.where(device <= INT32_MAX, device, -1)  # the device column is int32
        str_arg = int_column(_get_stream, args, n, dq, "args.stream")
        tid = int_column(_get_tid, xs, n, dq, "tid")
        stream = np.where(is_gpu & (str_arg >= 0), str_arg, tid)
        corr = int_column(_get_corr, args, n, dq, "args.correlation")
        # collective metadata (sparse)
        base = self.rows
        for i, a in enumerate(args):
            if a.coll_name is not None or a.in_nelems is not None or a.in_size is not None:
                self.coll_rows.append(base + i)
                self.coll_vals.append(
                    (
                        a.coll_name,
                        a.in_nelems if a.in_nelems is not None else a.in_size,
                        a.out_nelems if a.out_nelems is not None else a.out_size,
                        a.dtype,
                        a.group_size,
                        a.pg_name,
                        a.pg_ranks,
                        a.seq,
                    )
                )
        # record_shapes of host collective ops (their byte counts when the op has no comm args)
        codes = self.host_collective_codes()
        if codes.size:
            for i in np.flatnonzero(np.isin(name, codes)).tolist():
                a = args[i]
                if len(a.in_dims):
                    self.shape_rows.append(base + i)
                    self.shape_vals.append((bytes(a.in_dims), bytes(a.in_types)))
        self.start.append(ts_ns)
        self.dur.append(dur_ns)
        self.kind.append(kind)
        self.name.append(name)
        self.device.append(device.astype(np.int32))
        self.stream.append(stream)
        self.corr.append(corr)
        self.rows += n

    @property
    def _gpu_codes(self) -> list[int]:
        return [self.kind_codes[k] for k in _GPU_KINDS]


KIND_CATEGORIES: tuple[str, ...] = (
    "kernel",
    "memcpy",
    "memset",
    "runtime",
    "sync",
    "cpu_op",
    "annotation",
    "gpu_annotation",
    "other",
)

_PHASE_KEY = {
    "M": "skipped_metadata_events",
    "s": "skipped_flow_events",
    "t": "skipped_flow_events",
    "f": "skipped_flow_events",
    "i": "skipped_instant_events",
    "I": "skipped_instant_events",
    "C": "skipped_counter_events",
    "B": "skipped_begin_end_events",
    "E": "skipped_begin_end_events",
    "b": "skipped_async_events",
    "e": "skipped_async_events",
    "n": "skipped_async_events",
}


def categorical(codes: np.ndarray, categories: list[str]) -> pd.Categorical:
    return pd.Categorical.from_codes(codes, categories=pd.Index(categories, dtype=str))


def str_or_empty(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    return msgspec.json.encode(v).decode()
