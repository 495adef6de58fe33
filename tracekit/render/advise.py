"""The view of `tracekit advise` (shard or replicate) from its document (docs/JSON.md#advise)."""

from __future__ import annotations

from tracekit.analyse.advise import cliff_sentences
from tracekit.model.documents.advise import Advise as AdviseDoc
from tracekit.model.documents.advise import AdviseOption
from tracekit.model.documents.base import given
from tracekit.model.units import GIB, ms


def _model_text(r: AdviseOption) -> str:
    """The batch model of a predicted row, in words (docs/METHOD.md section Batch scaling of a decode)."""
    rng, bm = given(r.per_token_latency_range_ns), given(r.batch_model)
    if rng:
        return f" (roofline band from one run: {ms(rng[0])}-{ms(rng[1])} ms)"
    if bm:
        parts = ", ".join(f"{p.kind} {p.added_ns / 1e3:+,.0f} us" for p in bm.by_kind)
        return f" ({bm.model}: {parts})"
    return ""


def text(doc: AdviseDoc) -> str:
    """The recommendations, the GPUs and memory, a row per (batch, option): latency per token,
    tokens/s, memory per GPU, whether it fits, its status and batch model; the memory cliff, the
    runs read and the notes."""
    lines = [r.text for r in doc.recommendations]
    lines.append("")
    mem = doc.memory_per_gpu_bytes
    memory = (
        f"{mem / GIB:.1f} GiB each ({doc.memory_source}, {(doc.reserve_bytes or 0) / GIB:.1f} GiB kept back)"
        if mem
        else "memory per GPU unknown (give --memory-gib)"
    )
    layers = (
        f", memory for {given(doc.layers)} layers" if given(doc.layers) != given(doc.layers_traced) else ""
    )
    lines.append(
        f"{doc.gpus} GPU(s), {memory}, context {doc.context} tokens, weights {doc.weight_dtype}{layers}"
    )
    head = f"{'batch':>5}  {'option':<38} {'ms/token':>9} {'tokens/s':>10} {'GiB/GPU':>8} {'fits':>5}  status"
    lines += [head, "-" * len(head)]
    for r in doc.options:
        lat = r.per_token_latency_ns
        tps = r.tokens_per_s
        fits = {True: "yes", False: "NO", None: "?"}[r.fits]
        lines.append(
            f"{r.batch:>5}  {r.option:<38} {ms(lat):>9} "
            f"{'-' if tps is None else f'{tps:,.0f}':>10} {r.memory_per_gpu_bytes.total / GIB:>8.2f} "
            f"{fits:>5}  {r.status}" + _model_text(r)
        )
    lines += ["", "Memory cliff (most concurrent sequences whose KV cache fits beside the weights):"]
    lines += [f"  {s}" for s in cliff_sentences(doc)]
    lines += ["", "Runs:"]
    for run in doc.runs:
        lines.append(
            f"  TP={run.tp} batch {run.batch}: {ms(run.per_token_ns, missing='?')} ms per token ({run.per_token_source}), {run.path}"
        )
    for n in doc.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines) + "\n"
