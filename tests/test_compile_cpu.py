"""`--compile` on the CPU (tracekit's plumbing, not inductor's code generation): the decoder's static
decode step goes through `torch.compile(..., dynamic=False)` and decodes the same greedy tokens as the
eager forward.

The backend here is `aot_eager`: TorchDynamo traces the static step into an FX graph and AOTAutograd
functionalises it, exactly as for inductor, but the graph then runs op by op instead of being
compiled to C++ (inductor's CPU code generation took ~75 CPU-s of the suite for this one check).
What tracekit controls is all here: the step that is compiled, `dynamic=False`, one graph with no
graph break, and no recompilation from one decode position to the next (the static shapes). The
default backend (inductor) is checked on the 16-core GPU host, on the CPU and on CUDA, by
`scripts/compile_check.py` (`scripts/gpu_session.sh compile`).
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.slow
def test_compile_on_cpu_decodes_the_same_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from torch._dynamo.backends.debugging import aot_eager
    from torch._dynamo.utils import counters

    from tracekit.capture.config import workload
    from tracekit.capture.decoder import Comm, TPDecoder, make_prompt, preset
    from tracekit.capture.runner import CaptureConfig, Resolved

    graphs: list[Any] = []  # every FX graph TorchDynamo hands the backend
    asked: list[tuple[Any, dict[str, Any]]] = []  # what tracekit asked torch.compile for

    def backend(gm: Any, example_inputs: Any) -> Any:
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    real_compile = torch.compile

    def compile_with_aot_eager(fn: Any, **kw: Any) -> Any:
        asked.append((fn, kw))
        return real_compile(fn, backend=backend, **kw)

    monkeypatch.setattr(torch, "compile", compile_with_aot_eager)
    torch.set_num_threads(1)
    torch._dynamo.reset()
    counters.clear()
    shape = preset("tiny", 1)
    prompt = make_prompt(shape.vocab, 1, 4, 0)
    tokens = 5  # the prefill's token, then 4 decode steps at 4 positions: a recompile would show
    eager, _ = TPDecoder(shape, Comm(), max_len=16).generate(prompt, tokens)
    assert asked == [] and graphs == []  # the eager decoder compiles nothing
    dec = TPDecoder(shape, Comm(), max_len=16, compile=True)
    compiled, _ = dec.generate(prompt, tokens)
    assert eager.shape == (1, tokens) and torch.equal(eager, compiled)
    # the static decode step is what was compiled, on static shapes
    assert len(asked) == 1
    fn, kw = asked[0]
    assert getattr(fn, "__func__", None) is TPDecoder._decode_static and fn.__self__ is dec
    assert kw == {"dynamic": False}
    # one graph for every decode position, with no graph break: the whole step, traced once
    assert len(graphs) == 1 and not counters["graph_break"]
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert targets.count(torch._C._nn.scaled_dot_product_attention) == shape.layers
    doc = workload(CaptureConfig(compile=True), Resolved("cpu", "none", "float32", "cpu"), 1)
    assert doc.compile is True and doc.cuda_graphs is False
