"""The Dask executor: the plans of `tracekit.analyse.plans` with each rank's work where its
events are (issues 19, 27; docs/SCALE.md).

Per rank file, one task (`read_rank_file`) reads it, classifies its events and computes its
SHA-256 (the manifest check), and holds the classified table in that worker's memory: the file
is read once for every plan of the call. The client gets only the file's metadata, assembles the
run's (`tracekit.read.assemble_run` on empty tables: ranks numbered, Nsight clocks aligned, the
run-level notes) and runs the caller's check (the shortfall's pair checks) before any plan. Then
per file one task (`prepare_file`) puts its table in the run's frame (ranks renumbered, clock
shifted, row labels of the run's table) as per-rank `RankInput`s, and every rank stage of every
plan is one task per file on that state (`rank_stage`): the stage's per-rank results are small
and go to the client, which runs the plan's combine; a `Reduce` (the critical path) gathers what
the ranks kept on one worker (`reduce_task`), not on the client; a Reduce not waited for
(`Reduce.wait=False`: the run's graph prepared for the correction) is submitted with the next
one, the two placed on different workers, so neither holds the other up. The per-rank code and the
combines are the plan's, the same the local engine runs: the JSON is the same, to the byte.

The tasks themselves are in `tracekit.engine.dask_tasks`. Every task is a pure function of its inputs, named by a stable key and retried (`retries`): a
task that fails, or whose worker is lost, is run again (with what it depends on) and changes
nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tracekit.analyse.plans import (
    Fan,
    Later,
    PerRank,
    Plan,
    RankStage,
    Reduce,
    arg_for,
)
from tracekit.engine.config import Engine, EngineError
from tracekit.engine.dask_tasks import (
    FileMeta,
    RankFile,
    client_settings,
    fan_task,
    file_meta,
    kept_values,
    metadata_of,
    prepare_file,
    rank_stage,
    read_rank_file,
    reduce_results,
    reduce_task,
    stage_results,
)
from tracekit.engine.jobs import Check, Job, JobResult, TaskRecord
from tracekit.errors import RankError
from tracekit.model.events import Run
from tracekit.read import find_trace_files
from tracekit.read.run import reading_bar

__all__ = ["DaskExecutor", "FileMeta", "RankFile", "open_client", "prepare_file", "read_rank_file"]


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise EngineError(
            "--engine dask needs Dask: pip install 'tracekit[dask]' (or pip install 'dask[distributed]')"
        ) from None
    return distributed


# ------------------------------------------------------------------------------------------
# the client side


@contextlib.contextmanager
def open_client(engine: Engine) -> Iterator[Any]:
    """A dask.distributed Client: on `engine.scheduler`, else on a new LocalCluster."""
    distributed = _import_distributed()
    if engine.scheduler:
        try:
            client = distributed.Client(engine.scheduler, timeout="30s")
        except (OSError, TimeoutError) as exc:
            raise EngineError(f"cannot reach the Dask scheduler at {engine.scheduler}: {exc}") from None
        with client:
            yield client
        return
    n = engine.workers or os.cpu_count() or 1
    cluster = distributed.LocalCluster(
        n_workers=n,
        threads_per_worker=engine.threads_per_worker,
        processes=engine.processes,
        dashboard_address=":0",
        silence_logs=40,  # logging.ERROR: no worker chatter on the terminal
        # no per-worker cap (Dask's default, a 1/n share of the host's memory, pauses a worker at
        # 80% of it): the worker of a run's Reduces holds the whole dependency graph (docs/SCALE.md)
        memory_limit=0,
    )
    with cluster, distributed.Client(cluster) as client:
        yield client


#: the priority of the tasks that only hand a small part on (a stage's per-rank results, a file's
#: metadata, what a rank kept for a Reduce): a worker runs them before any other ready task, so a
#: barrier never waits for them behind another run's long task (a baseline's Reduce)
_SMALL = 100


def _file_key(job_index: int, path: Path) -> str:
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    return f"run{job_index}-{path.name.replace('.', '_')}-{digest}"


class DaskExecutor:
    """Plans on a Dask cluster (`engine.scheduler`, else a LocalCluster of `engine.workers`)."""

    def __init__(self, engine: Engine, client: Any = None) -> None:
        self.engine = engine
        self.client = client

    def run(self, jobs: Sequence[Job], check: Check | None = None) -> tuple[list[JobResult], Any]:
        _import_distributed()
        expanded = []
        for job in jobs:
            files, manifest = find_trace_files(list(job.paths))  # on the client: checked before any task
            if job.rank is not None and len(files) > 1:
                raise RankError(f"--rank applies to one trace file, but {len(files)} were given")
            expanded.append((files, manifest))
        if self.client is not None:
            return _Run(self.client, self.engine, jobs, expanded).go(check)
        with open_client(self.engine) as own:
            return _Run(own, self.engine, jobs, expanded).go(check)


class _Runner:
    """One plan on one job's files: submits its stages in turn, combining on the client."""

    def __init__(self, run: _Run, j: int, p: int, plan: Plan, meta: Run) -> None:
        self.run, self.j, self.p, self.plan, self.meta = run, j, p, plan, meta
        self.stage = 0
        self.round = 0  # of a rank stage run again (`RankStage.again`)
        self.state: Any = None
        self.arg: Any = None
        self.futs: list[Any] = []
        self.small: list[Any] = []
        self.reduced: dict[str, Any] = {}  # what the plan's Reduces kept: their tasks' futures
        self.beside: dict[str, list[Any]] = {}  # the kept values a Reduce not waited for took
        self.prekept: dict[str, list[Any]] = {}  # per key, the files' kept values (`RankStage.keeps`)
        self.deferred: list[Any] = []  # the combines' `Later` work, not run yet
        self.result: Any = None
        self.done = False
        #: a stage not submitted yet while the largest run's rank stages are in flight (`hold`)
        self.held = False

    def hold(self, st: RankStage | Reduce | Fan) -> bool:
        """Whether this stage waits for the end of the largest run's rank stages
        (`_Run.rank_work`): on a cluster of four workers or more every stage of a run of at most
        a quarter of its ranks (a one-GPU baseline: its whole plan then runs beside the largest
        run's Reduces, on the workers they leave idle, and none of its tasks holds up a worker's
        share of a rank stage or a Reduce of the largest run); else, and for any other smaller
        run, the Reduces with none of its own rank stages next (its graph, path and correction:
        on two workers the baseline's rank stages fill the sharded run's barriers, and its
        Reduces, after the sharded run's rank stages, do not hold up its attribution stage)."""
        r = self.run
        if r.priority(self.j) or isinstance(st, Fan):
            return False
        # the whole plan held: a small run, and workers to spare beside the graph's and the path's
        whole = _small(r.sizes[self.j], max(r.sizes)) and len(r.worker_list()) >= 4
        if not whole and isinstance(st, RankStage):
            return False
        own_next = self.plan.stages[self.stage + 1 : self.stage + 3]
        if not whole and any(isinstance(x, RankStage) for x in own_next):
            return False
        return r.rank_work()

    def start(self) -> None:
        self.state, self.arg = self.run.client_call(self.j, self.plan.start, self.meta)
        self.submit()

    def submit(self) -> None:
        """Submit the next stage's tasks (or finish)."""
        r = self.run
        if self.stage >= len(self.plan.stages):
            self.catch_up()
            self.result = r.client_call(self.j, self.plan.finish, self.state, self.arg)
            self.done = True
            return
        st = self.plan.stages[self.stage]
        if self.hold(st):
            self.held, self.small, self.futs = True, [], []  # `_Run.go` submits it later
            return
        name = f"{self.plan.name}.{st.name}"
        only = self.plan.only_rank
        states = r.states[self.j]
        tag = f"run{self.j}-p{self.p}-s{self.stage}" + (f"-r{self.round}" if self.round else "")
        if isinstance(st, RankStage):
            self.futs, self.small = [], []
            for n, (fut, ranks) in enumerate(zip(states, r.ranks_of[self.j], strict=True)):
                wanted = [x for x in ranks if (only is None or x == only) and arg_for(self.arg, x)[0]]
                if not wanted:
                    continue
                arg = PerRank({x: self.arg[x] for x in wanted}) if isinstance(self.arg, PerRank) else self.arg
                f = r.task(
                    f"tracekit-{tag}-f{n}", rank_stage, fut, st, arg, only, name, priority=r.priority(self.j)
                )
                self.futs.append((n, f))
                self.small.append(r.task(f"tracekit-{tag}-f{n}-small", stage_results, f, priority=_SMALL))
            if self.futs:  # the stage may change what the ranks keep: values taken before are stale
                self.prekept = {}
            # what this stage keeps for a later Reduce, taken out as each task ends (not after the
            # barrier, behind whatever else the worker started meanwhile)
            new = dict(self.futs)
            for key in st.keeps:
                self.prekept[key] = [
                    r.task(
                        f"tracekit-{tag}-f{n}-kept-{key}",
                        kept_values,
                        new.get(n, fut),
                        key,
                        only,
                        priority=_SMALL,
                    )
                    for n, fut in enumerate(states)
                ]
                r.later.extend(self.prekept[key])
        elif isinstance(st, Fan):  # one task per argument, on what an earlier Reduce kept
            src = self.reduced[st.key]
            self.futs = []
            self.small = [
                r.task(f"tracekit-{tag}-x{i}", fan_task, st, a, src, spread=i, priority=r.priority(self.j))
                for i, a in enumerate(self.arg)
            ]
        else:
            small = self._reduce(st, tag, self.arg, states)
            if not st.wait:  # not gathered now: the next stage is submitted with this one
                self.stage += 1
                self.submit()
                return
            self.small = [small]
            self.futs = []

    def _reduce(self, st: Reduce, tag: str, arg: Any, states: list[Any]) -> Any:
        """Submit a Reduce's task over `states`' kept values (or what a Reduce before it kept, or
        the values a Reduce beside it took); returns the future of its small part."""
        r = self.run
        beside = self.beside.pop(st.key, None)  # a Reduce not waited for took these values
        if st.on_kept:  # on what an earlier Reduce kept: its task's result, on its worker
            parts = [self.reduced[st.key]]
        elif beside is not None:
            parts = beside
        elif st.key in self.prekept:  # taken out when the rank stage that keeps them ended
            parts = self.prekept.pop(st.key)
        else:
            parts = [
                r.task(
                    f"tracekit-{tag}-f{n}-kept",
                    kept_values,
                    fut,
                    st.key,
                    self.plan.only_rank,
                    priority=_SMALL,
                )
                for n, fut in enumerate(states)
            ]
            r.later.extend(parts)
        # a Reduce beside the next one and that next one: on two workers (else the scheduler
        # puts both next to the values they share, one after the other), each job's pair on
        # its own two (`_Run.pair_workers`: the largest run's first, no other run's graph on its)
        spread = None
        if not st.wait or beside is not None:
            spread = r.pair_workers(self.j)[0 if not st.wait else 1]
        full = r.task(
            f"tracekit-{tag}-reduce", reduce_task, st, arg, *parts, spread=spread, priority=r.priority(self.j)
        )
        if st.keeps:
            self.reduced[st.keeps] = full
        small = r.task(f"tracekit-{tag}-reduce-small", reduce_results, full, priority=_SMALL)
        r.later.append(full)
        if not st.wait:
            if not st.on_kept:
                self.beside[st.key] = parts
            r.side.append((self.j, small))
        return small

    def catch_up(self, beside: bool = False) -> None:
        """Run the combines' deferred work (`plans.Later`), in order; `beside`: while tasks run
        (its seconds are also counted in `_Run.beside_s`: client work off the critical path)."""
        while self.deferred:
            t0 = time.perf_counter()
            self.run.client_call(self.j, self.deferred.pop(0))
            if beside:
                self.run.beside_s[self.j] += time.perf_counter() - t0

    def take(self, got: Any) -> Any:
        """A combine's result: the next stage's argument (a `Later`'s work deferred)."""
        if isinstance(got, Later):
            self.deferred.append(got.fn)
            return got.arg
        return got

    def collect(self) -> None:
        """Gather the stage's small results, combine, advance."""
        r = self.run
        st = self.plan.stages[self.stage]
        if self.small:  # a combine with tasks' results to take: the deferred work first
            self.catch_up()
        got = r.client.gather(self.small)
        if isinstance(st, RankStage):
            merged: dict[int, Any] = {}
            for results, rec in got:
                merged.update(results)
                if rec is not None:
                    r.records[self.j].append(rec)
            # the next stage runs on the states this one returned (same worker, same objects)
            for n, f in self.futs:
                r.states[self.j][n] = f
            self.arg = self.take(r.client_call(self.j, st.combine, self.state, merged))
            if st.again is not None and r.client_call(self.j, st.again, self.state):
                r.later.extend(self.small)
                self.round += 1
                self.submit()  # the same stage again, on the new argument
                return
        elif isinstance(st, Fan):
            r.records[self.j].extend(rec for _out, rec in got)
            self.arg = self.take(r.client_call(self.j, st.then, self.state, [out for out, _rec in got]))
        else:
            out, rec = got[0]
            r.records[self.j].append(rec)
            self.arg = self.take(r.client_call(self.j, st.then, self.state, out))
        r.later.extend(self.small)
        self.stage += 1
        self.round = 0
        self.submit()


class _Run:
    def __init__(self, client: Any, engine: Engine, jobs: Sequence[Job], expanded: list[Any]) -> None:
        self.client, self.engine, self.jobs, self.expanded = client, engine, jobs, expanded
        # task keys are global to the scheduler: one token per call keeps two analyses on one
        # cluster (two users, two runs) from taking each other's tasks
        self.token = uuid.uuid4().hex[:12]
        self.states: list[list[Any]] = []
        self.ranks_of: list[list[list[int]]] = []
        self.records: list[list[TaskRecord]] = [[] for _ in jobs]
        self.client_s = [0.0 for _ in jobs]
        self.beside_s = [0.0 for _ in jobs]  # of it, run while the workers ran tasks (`catch_up`)
        self.later: list[Any] = []
        self.side: list[tuple[int, Any]] = []  # (job, small result) of the Reduces not waited for
        self.runners: list[_Runner] = []
        self.workers: list[str] | None = None  # the cluster's workers (a Fan's calls spread over them)
        self.sizes: list[int] = [0 for _ in jobs]  # each job's run's rank count (`pair_workers`)
        self.failed: set[int] = set()  # the jobs of the runners that raised

    def task(
        self,
        key: str,
        fn: Any,
        *args: Any,
        spread: int | None = None,
        priority: int = 0,
        on: str | None = None,
    ) -> Any:
        """A task; with `spread` (a Fan's i-th call) placed on the i-th worker (round robin,
        others allowed): the scheduler would otherwise keep every call next to the large value
        they share (the run's graph) and run them one after the other there; with `on`, on that
        worker (others allowed). Of the tasks ready on a worker the one of highest `priority`
        runs first (`_SMALL`, `priority`)."""
        kw: dict[str, Any] = {"priority": priority}
        if spread is not None and self.worker_list():
            workers = self.worker_list()
            kw.update(workers=[workers[spread % len(workers)]], allow_other_workers=True)
        elif on is not None:
            kw.update(workers=[on], allow_other_workers=True)
        return self.client.submit(
            fn, *args, key=f"{key}-{self.token}", retries=self.engine.retries, pure=False, **kw
        )

    def rank_work(self) -> bool:
        """Whether a runner of the largest run (`priority`) has a rank stage in flight or next: a
        smaller run's Reduce waits for the end of those (`_Runner.held`). A rank stage's tasks
        run where their file's events are, so a long Reduce of the baseline on one of those
        workers would hold up that worker's share of the stage and the stage's barrier; from the
        largest run's first Reduces on (its graph and path on two workers) the others are idle."""
        for rn in self.runners:
            if rn.done or rn.j in self.failed or self.priority(rn.j) == 0:
                continue
            if any(isinstance(st, RankStage) for st in rn.plan.stages[rn.stage : rn.stage + 2]):
                return True
        return False

    def priority(self, j: int) -> int:
        """Job `j`'s tasks' priority: 1 for the run of most ranks (the first of them), whose stages
        and Reduces are the serial chain, 0 for the others (the baseline's), which fill the
        workers it leaves idle."""
        return int(j == min(range(len(self.sizes)), key=lambda i: (-self.sizes[i], i)))

    def worker_list(self) -> list[str]:
        """The cluster's workers' addresses, sorted (read once, when a stage first places a task)."""
        if self.workers is None:
            self.workers = self.workers_now()
        return self.workers

    def workers_now(self) -> list[str]:
        """The cluster's workers' addresses now, sorted (an adaptive cluster's grow)."""
        return sorted(self.client.scheduler_info().get("workers", {}))

    def pair_workers(self, j: int) -> tuple[int, int]:
        """The workers (indices into the sorted list) of job `j`'s graph Reduce and the path's
        beside it. The runs by rank count, largest first (ties in job order): the k-th run's pair
        on workers 2k and 2k + 1, wrapped round the cluster, a smaller run's never on the largest
        run's graph worker when there are two workers or more. That graph's worker runs the
        serial chain after the rank stages (the graph assembled, then the correction on it); a
        smaller run's Reduces (the baseline's) run beside it, on the other workers."""
        n = max(len(self.worker_list()), 1)
        order = sorted(range(len(self.sizes)), key=lambda i: (-self.sizes[i], i))
        k = order.index(j)
        graph, path = (2 * k) % n, (2 * k + 1) % n
        if k and graph == 0 and n > 1:  # not on the largest run's graph worker
            graph, path = path, graph
        if k and path == 0:  # its path beside its own graph rather (both small)
            path = graph
        return graph, path

    def client_call(self, j: int, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.client_s[j] += time.perf_counter() - t0

    def go(self, check: Check | None) -> tuple[list[JobResult], Any]:
        distributed = _import_distributed()
        settings = client_settings()
        reads: list[list[Any]] = []
        sizes: dict[Any, int] = {}
        homes = small_run_homes([len(files) for files, _m in self.expanded], self.workers_now())
        for j, (job, (files, _manifest)) in enumerate(zip(self.jobs, self.expanded, strict=True)):
            futs = []
            for f in files:
                fut = self.task(
                    f"tracekit-read-{_file_key(j, f)}",
                    read_rank_file,
                    str(f),
                    job.rank,
                    job.cache,
                    settings,
                    on=homes.get(j),
                )
                sizes[fut.key] = f.stat().st_size
                futs.append(fut)
            reads.append(futs)
        all_reads = [f for futs in reads for f in futs]
        try:
            if self.engine.progress:
                _show_progress(distributed, all_reads, sizes)
            metas_f = [
                [self.task(f"{f.key}-meta", file_meta, f, priority=_SMALL) for f in futs] for futs in reads
            ]
            # a bad rank file is reported as the local engine reports it: the first failing file in
            # file order, not whichever worker failed first
            distributed.wait([f for fs in metas_f for f in fs])
            for fut in all_reads:
                if fut.status == "error":
                    raise fut.exception()
            file_metas: list[list[FileMeta]] = [self.client.gather(fs) for fs in metas_f]
            self.later.extend(f for fs in metas_f for f in fs)
            runs, views = [], []
            for j, (job, (_files, manifest)) in enumerate(zip(self.jobs, self.expanded, strict=True)):
                meta, v = self.client_call(j, metadata_of, file_metas[j], manifest, list(job.paths))
                self.sizes[j] = len(meta.ranks)
                runs.append(meta)
                views.append(v)
            checked = check(runs) if check is not None else None
            for j in range(len(self.jobs)):
                self.states.append(
                    [
                        self.task(f"tracekit-prep-{_file_key(j, Path(m.path))}", prepare_file, f, v)
                        for f, m, v in zip(reads[j], file_metas[j], views[j], strict=True)
                    ]
                )
                self.ranks_of.append([sorted(v.rank_map.values()) for v in views[j]])
            runners = self.runners = [
                _Runner(self, j, p, plan, runs[j])
                for j, job in enumerate(self.jobs)
                for p, plan in enumerate(job.plans)
            ]
            errors: dict[int, BaseException] = {}

            def attempt(i: int, step: Any) -> bool:
                """`step()` of runner `i`; an error is kept (raised below, in the local engine's
                order: the first runner's) and the runner's job marked failed."""
                try:
                    step()
                except Exception as exc:  # noqa: BLE001
                    errors[i] = exc
                    self.failed.add(runners[i].j)
                    return False
                return True

            for i, rn in enumerate(runners):
                attempt(i, rn.start)
            while True:
                active = [i for i, rn in enumerate(runners) if not rn.done and i not in errors]
                if not active or (errors and min(errors) < min(active)):
                    break
                # each plan advances as soon as its stage is done, not in step with the others:
                # the baseline's stages and combines run beside the sharded run's, not between
                # them, and its Reduces once the sharded run's rank stages are over (`rank_work`)
                held = [i for i in active if runners[i].held]
                if held and not self.rank_work():
                    for i in held:
                        runners[i].held = False
                        attempt(i, runners[i].submit)
                    continue
                ready = [i for i in active if not runners[i].held and all(f.done() for f in runners[i].small)]
                if not ready:
                    # the client's deferred work while the workers run the tasks submitted
                    raised = False
                    for i in active:
                        raised |= not attempt(i, lambda rn=runners[i]: rn.catch_up(beside=True))
                    waiting = [f for i in active for f in runners[i].small if not f.done()]
                    if waiting and not raised:
                        distributed.wait(waiting, return_when="FIRST_COMPLETED")
                    continue
                for i in ready:
                    attempt(i, runners[i].collect)
            if errors:
                raise errors[min(errors)]
            for (j, _small), (_out, rec) in zip(
                self.side, self.client.gather([f for _j, f in self.side]), strict=True
            ):
                self.records[j].append(rec)
            self.later.extend(f for _j, f in self.side)
            out = []
            for j in range(len(self.jobs)):
                recs = [
                    TaskRecord("read", m.path, sorted(m.sources), m.seconds, m.peak_rss_bytes)
                    for m in file_metas[j]
                ]
                out.append(
                    JobResult(
                        meta=runs[j],
                        results=[rn.result for rn in runners if rn.j == j],
                        tasks=recs + self.records[j],
                        client_s=self.client_s[j],
                        client_beside_s=self.beside_s[j],
                        n_events=sum(m.n_events for m in file_metas[j]),
                        files=len(file_metas[j]),
                    )
                )
            return out, checked
        finally:
            for fut in [*self.later, *[f for s in self.states for f in s], *all_reads]:
                fut.release()
            for rn in self.runners:
                for _n, f in rn.futs:
                    f.release()


def small_run_homes(files: Sequence[int], workers: Sequence[str]) -> dict[int, str]:
    """The worker each small run's files are read on (job index -> address), by file count: a run
    of at most a quarter of the largest run's files (a one-GPU baseline) on the last worker, on
    three workers or more. Its rank stages then run there (where its events are held), never on
    the first worker, the largest run's graph worker (`_Run.pair_workers`), where they would wait
    behind that run's serial graph and correction Reduces (the 8-worker stream of 2026-12-03:
    the baseline's chain ran after them, 0.65 s of tail). Unpinned (the scheduler's choice) on
    fewer workers, or when the cluster has none yet (an adaptive one)."""
    if len(workers) < 3 or not files:
        return {}
    big = max(files)
    return {j: workers[-1] for j, n in enumerate(files) if _small(n, big)}


def _small(n: int, largest: int) -> bool:
    """A run of at most a quarter of the largest run's ranks or files (a one-GPU baseline beside
    a sharded run): the executor holds its plan (`_Runner.hold`) and homes its files apart."""
    return 4 * n <= largest


def _show_progress(distributed: Any, reads: list[Any], sizes: dict[Any, int]) -> None:
    """A rich bar on stderr: bytes of rank files read and classified on all workers. Errors are
    left for the caller to raise."""
    with reading_bar(transient=not sys.stderr.isatty()) as bar:
        task = bar.add_task(f"dask: reading {len(reads)} rank file(s)", total=sum(sizes.values()))
        for fut in distributed.as_completed(reads):
            bar.advance(task, sizes.get(fut.key, 0))
