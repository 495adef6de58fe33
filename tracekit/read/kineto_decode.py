"""The typed msgspec decode of Kineto events: small Structs with only the fields the event table
needs (msgspec skips the rest without building objects), one per phase that becomes a row (X, B,
E), empty ones for every other phase, and the lenient fallback for a chunk with unexpected types."""

from __future__ import annotations

from typing import Any, Union

import msgspec

from tracekit.read.kineto_ints import to_float

_EMPTY_RAW = msgspec.Raw(b"")


class Args(msgspec.Struct, gc=False):
    device: Any = -1
    stream: Any = -1
    correlation: Any = -1
    coll_name: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    in_size: Any = msgspec.field(default=None, name="In msg size")
    out_size: Any = msgspec.field(default=None, name="Out msg size")
    dtype: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    seq: Any = msgspec.field(default=None, name="Seq")
    # record_shapes (`cpu`/`full` modes): kept as raw JSON text, parsed only for collective ops
    in_dims: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Input Dims")
    in_types: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Input type")


class Ev(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event ("ph": "X"), the only kind that becomes a row."""

    cat: str = ""
    name: str = ""
    ts: msgspec.Raw = _EMPTY_RAW
    dur: float = float("nan")
    pid: int | str = -1
    tid: int | str = -1
    args: Args = msgspec.field(default_factory=Args)


class EvB(msgspec.Struct, gc=False, tag_field="ph", tag="B"):
    """A duration event's begin ("ph": "B"): becomes a row once its "E" on the same thread is found."""

    cat: str = ""
    name: str = ""
    ts: msgspec.Raw = _EMPTY_RAW
    pid: int | str = -1
    tid: int | str = -1
    args: Args = msgspec.field(default_factory=Args)


class EvE(msgspec.Struct, gc=False, tag_field="ph", tag="E"):
    """A duration event's end ("ph": "E"): closes the thread's innermost open "B"."""

    ts: msgspec.Raw = _EMPTY_RAW
    pid: int | str = -1
    tid: int | str = -1


# Every other Chrome-trace phase decodes into an empty struct (its fields are skipped unparsed).
_OTHER_PHASES = "iICbneNODstfPMVvRc()"


_OTHER_TYPES: dict[str, type] = {
    ph: msgspec.defstruct(f"_Ph{ord(ph)}", [], tag_field="ph", tag=ph, gc=False) for ph in _OTHER_PHASES
}


_PhUnknown = msgspec.defstruct("_PhUnknown", [], gc=False)


PHASE_OF_TYPE: dict[type, str] = {t: ph for ph, t in _OTHER_TYPES.items()}
PHASE_OF_TYPE[_PhUnknown] = "?"


class _EvLenient(msgspec.Struct, gc=False):
    """Fallback when a chunk has unexpected types (e.g. a string `dur`): slower, accepts anything."""

    ph: Any = ""
    cat: Any = ""
    name: Any = ""
    ts: msgspec.Raw = _EMPTY_RAW
    dur: Any = None
    pid: Any = -1
    tid: Any = -1
    args: Args | Any = None


_EVENT_UNION: Any = Union[(Ev, EvB, EvE, *_OTHER_TYPES.values())]  # noqa: UP007


DECODER = msgspec.json.Decoder(list[_EVENT_UNION])


DECODER_LENIENT = msgspec.json.Decoder(list[_EvLenient])


ANY_DECODER = msgspec.json.Decoder()


def coerce_lenient(evs: list[Any], tally: list[int] | None = None) -> list[Any]:
    """Events decoded leniently, as the typed structs; `tally[0]` counts the complete events that had
    a field of the wrong JSON type (an object pid, args that are not an object, a string dur...)."""
    out: list[Any] = []
    for e in evs:
        if e.ph not in ("X", "B", "E"):
            out.append(_OTHER_TYPES.get(str(e.ph), _PhUnknown)())
            continue
        args = e.args if isinstance(e.args, Args) else Args()
        pid = e.pid if isinstance(e.pid, (int, str)) and not isinstance(e.pid, bool) else -1
        tid = e.tid if isinstance(e.tid, (int, str)) and not isinstance(e.tid, bool) else -1
        if e.ph == "B":
            out.append(EvB(cat=str(e.cat), name=str(e.name), ts=e.ts, pid=pid, tid=tid, args=args))
            continue
        if e.ph == "E":
            out.append(EvE(ts=e.ts, pid=pid, tid=tid))
            continue
        if tally is not None and (
            pid is not e.pid
            or tid is not e.tid
            or (e.args is not None and not isinstance(e.args, (Args, dict)))
            or not isinstance(e.cat, str)
            or not isinstance(e.name, str)
            or not (
                e.dur is None
                or isinstance(e.dur, float)
                or (isinstance(e.dur, int) and not isinstance(e.dur, bool))
            )
        ):
            tally[0] += 1
        out.append(
            Ev(
                cat=str(e.cat),
                name=str(e.name),
                ts=e.ts,
                dur=to_float(e.dur) if e.dur is not None else float("nan"),
                pid=pid,
                tid=tid,
                args=args,
            )
        )
    return out


class _EvLenientArgs(_EvLenient, gc=False):
    """`_EvLenient` whose args are any JSON value, left as decoded (not an `Args`)."""

    args: Any = None


DECODER_LENIENT_ARGS = msgspec.json.Decoder(list[_EvLenientArgs])
