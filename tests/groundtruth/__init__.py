"""Ground-truth simulator of tensor-parallel decode ranks (issue 23): `sim` (the model and the
truth), `kineto` (faithful Kineto traces + the capture manifest), `cases` (the named cases),
`truth` (every figure of a case from the simulation alone), `harness` (tracekit run on the
written traces, figure by figure). README.md in this folder documents the API."""
