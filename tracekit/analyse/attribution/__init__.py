"""Shortfall attribution (docs/METHOD.md sections "Wait and transfer", "Shortfall attribution" and "Dilation").

`pair.shortfall(baseline, sharded)` says where the per-token shortfall S = TN - T1/N of a run sharded
over N ranks goes, against a baseline of the same model on one rank (N_base ranks in general; the
ideal is then T1 * N_base / N).

Per run (`plan.attribute_run`):
1. classify, find the step windows, partition each (rank, step) window exactly
   (`tracekit.analyse.steps`), match the collectives across ranks and split the exposed collective
   part of every window exactly into wait and transfer (`tracekit.analyse.collectives.split_exposed`:
   collective == wait + transfer, integer ns).
2. per step index, the step time is the longest window over ranks (the token is done when its
   last rank is); every rank's window is padded to it with idle, so each rank's leaf parts sum to
   the step time. No part is taken from whichever rank had the longest window.
3. the first `skip_first` steps are warm-up; steps missing on some rank are left out. Per rank, the
   per-token figure of every part is its **mean** over the steady steps, kept as an exact
   fraction; the run's figure is the **mean over ranks** (`run.mean_over_ranks`): symmetric in the
   ranks, and moved by at most d/N when one rank's part moves by d. Means are additive: the parts
   sum exactly to the per-token time, so the terms below sum exactly to S, for the run and for
   every rank (`per_rank`). Medians and p10/p90 over steps are reported beside (`spread_ns`).
4. the per-token critical path across ranks (`tracekit.analyse.path.critical_path`): which rank's
   compute, host gaps, sync and transfer the token waited on; the verdict names it, and the other
   ranks' wait as its consequence.

Terms (f = N_base / N):
    compute      = CN - f C1
    memory       = MN - f M1
    transfer     = XN - f X1
    coordination = (WN - f W1) + (YN - f Y1) + (IN - f I1)       wait + sync + idle
    unknown      = UN - f U1    (only in `terms_ns` when it is not zero)
Integers in the JSON: the per-token figures are rounded, S = sharded - ideal, and the leaf terms
are rounded by largest remainder to sum to S exactly (asserted; `terms.Attribution`).

Dilation (docs/METHOD.md section Dilation): when both runs' manifests carry unprofiled per-token times, T1 and TN come
from the unprofiled pass (the mean over the steady tokens of every unprofiled round), and each
rank's traced parts are reconciled to it (`reconcile.reconcile`, docs/METHOD-NOTES.md), as is the critical
path (`reconcile.reconcile_path`). The dilation stated is the factor applied: traced per-token mean /
unprofiled per-token mean (`reconcile.applied_dilation`, with a bootstrap interval). The trace-only
attribution is kept under `uncorrected`.

The modules: `options.py` (`AttributionOptions`: how a run is attributed, one value from the
entry on), `run.py` (one run's pieces: `RunParts` and the per-rank and run-level stages the plan
runs), `plan.py` (`attribution_plan`: those stages as a plan; `attribute_run`: it in this process;
`plan_of`), `correction_stages.py` (the plan's profiler-correction stages), `terms.py` (`Attribution`: the terms of S, exact and in integers), `reconcile.py` (the
dilation applied, the proportional reconciliation), `corrected.py` (the profiler correction of a
pair: `correct_pair`), `straggler.py` (the straggler test and its last-rank statistic),
`result.py` (`Shortfall`), `document.py` (the JSON pieces beside the terms), `pair.py` (`shortfall`,
`shortfall_of_pair`, `shortfall_from_parts`, `check_pair`: the entry).
"""
