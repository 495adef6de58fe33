"""The links room: the link verdict, pure functions of a decode trace and a compare-links JSON.
The probe's curves at a message size (`curves`), what the trace sent and realised (`trace`) and
the verdict (`verdict`). Above the attribution (docs/ARCHITECTURE.md)."""
