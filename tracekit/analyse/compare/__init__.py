"""The compare room: two runs side by side. `diff` (the same workload before and after: the change
by part, rank and critical path) and `decompose` (the speedup from TP=1 to TP=N decomposed into
its terms). Above the attribution (docs/ARCHITECTURE.md)."""
