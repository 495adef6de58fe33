"""Exports of a run for other tools: `perfetto` (a Chrome-trace JSON with tracekit's view added,
for the Perfetto UI and chrome://tracing)."""
