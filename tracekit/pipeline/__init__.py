"""Orchestration above the stages: jobs that run several of capture, probe, read, analyse and
report in order (`study.py`: capture each TP degree -> breakdown -> shortfall -> link comparison
-> report). Nothing below imports this package; the CLI commands call it."""
