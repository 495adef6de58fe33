"""The collectives room: one collective across ranks. Selecting one interval per rank per call
and matching the calls across ranks (`matching`), the clocks (`clocks`), the message sizes
(`bandwidth`: nccl-tests' formulas; `sizes`: bytes from the capture manifest), the checks on a
matched run (`checks`) and the exact wait / transfer split of the exposed collective time
(`exposed`). Imports the timeline room only (docs/ARCHITECTURE.md)."""
