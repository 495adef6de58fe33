"""Rendering of analysis results: one view per result, built from its typed document
(`tracekit.model.documents`), and the writers (text, Markdown, CSV, JSON) they all go through.

- `shortfall`, `breakdown`, `diff`, `whatif`, `roofline`, `predict`, `links` (compare-links): `table(doc, width, color)`
  (and `markdown(doc)` where the command writes Markdown), each from the command's document;
- `study`: `text(result, ...)`, what `tracekit study` prints when it is done; `dilation`:
  `table(rows, threshold, color)`, the dilation command's table; `advise`: `text(doc)`; `rho`: `table(doc)`; `links.topology_text`:
  `probe --op links`; `probe`: `format_table(rows)` (nccl-tests' layout) and `rows_to_csv`;
- `writers`: the recording console, Markdown tables, CSV, JSON text;
- the verdict and diagnosis sentences are analysis output (they are in the JSON), so they live in
  `tracekit.analyse.prose`; the views print them.

Layer: above `analyse` (it reads `analyse.prose` and the kernel-name shortener), below `report`
and `cli` (docs/ARCHITECTURE.md)."""
