"""Element sizes of the dtypes in torch's Python spelling (a manifest's `workload.dtype`, a
probe's `--dtype`; `fp8` for the e4m3 / e5m2 weights), one table for the probes, the roofline and
the prediction, each of which takes the dtypes it knows from it. The trace reader's C++ spellings
(`Float`, `BFloat16`: record_shapes' types) are `read.kineto_collectives.DTYPE_BYTES`."""

from __future__ import annotations

#: dtype -> bytes per element
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int32": 4,
    "int64": 8,
    "int8": 1,
    "uint8": 1,
    "fp8": 1,
}

#: dtype -> nccl-tests' type name (the collective probes' dtypes)
NCCL_TYPE: dict[str, str] = {
    "float32": "float",
    "float16": "half",
    "bfloat16": "bfloat16",
    "float64": "double",
    "int32": "int32",
    "int64": "int64",
    "int8": "int8",
    "uint8": "uint8",
}

#: dtype -> its short name (rho's and the advice's weight dtypes: `bf16`, `fp16`, `fp32`)
SHORT_NAME: dict[str, str] = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def sizes_of(*dtypes: str) -> dict[str, int]:
    """The sizes of `dtypes`, in that order (a stage's own set of the dtypes it knows)."""
    return {d: DTYPE_BYTES[d] for d in dtypes}
