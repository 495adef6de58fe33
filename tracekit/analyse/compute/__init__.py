"""The compute room: the kernels of a run. The top kernels per class (`kernels`), the compute
term split by kernel across TP degrees (`kernel_scaling`) and the roofline of a decode step
(`roofline`). Imports the timeline room only (docs/ARCHITECTURE.md)."""
