"""The vocabulary of parts: the names every layer uses for the pieces of a step and of the
shortfall, in their one order, and the words that say what each shortfall term is.

docs/METHOD.md section Steps and the partition (the six parts of a step window, in priority order)
and section Shortfall attribution (the terms; coordination is collective wait + sync + idle)."""

from __future__ import annotations

#: Parts of a step window, in the partition's priority order, then idle (they sum to the window).
PARTS: tuple[str, ...] = ("compute", "memory", "collective", "unknown", "sync", "idle")
#: The leaf parts of a step window once the collective part is split into transfer and wait.
LEAF_PARTS: tuple[str, ...] = ("compute", "memory", "transfer", "wait", "unknown", "sync", "idle")
#: The leaf parts that make up the coordination term.
COORDINATION: tuple[str, ...] = ("wait", "sync", "idle")
#: Terms of the shortfall, in report order (unknown only on runs with unclassified kernels).
TERMS: tuple[str, ...] = ("compute", "memory", "transfer", "coordination", "unknown")
#: The terms a report always shows (TERMS without unknown, which it shows only when present).
MAIN_TERMS: tuple[str, ...] = TERMS[:4]
#: The critical path's parts per rank (the shortfall's `critical_path.by_rank[r]`, without `_ns`).
PATH_PARTS: tuple[str, ...] = ("compute", "memory", "transfer", "host", "sync", "unknown")

#: What each shortfall term is, in words (on a run without a GPU timeline the transfer is
#: CPU_TRANSFER_WORDS: `term_words`).
TERM_WORDS: dict[str, str] = {
    "compute": "compute that did not shrink N-fold",
    "memory": "memory copies and sets that did not shrink N-fold",
    "transfer": "bytes on the link (collective transfer)",
    "coordination": "ranks waiting for each other and host gaps",
    "unknown": "unclassified kernels",
}
#: The transfer term on a run without a GPU timeline (gloo on CPU): never a link.
CPU_TRANSFER_WORDS = (
    "gloo's exchange after the last rank arrives (host scheduler delay included, not a GPU link)"
)


def term_words(timeline: str | None) -> dict[str, str]:
    """What each term is for a run of this timeline (a link only on a GPU timeline)."""
    words = dict(TERM_WORDS)
    if timeline != "gpu":
        words["transfer"] = CPU_TRANSFER_WORDS
    return words
