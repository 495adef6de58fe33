"""The report's sections, built from the typed analysis documents (`tracekit.report.data` assembles them)."""
