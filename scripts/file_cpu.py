"""CPU seconds (user + sys, children included) and wall seconds of each test file, run one at a time
as the clone runs it: without ../shared (unless --with-shared), one parse cache for the whole call.

    python scripts/file_cpu.py tests/test_diff.py tests/test_whatif.py [--with-shared] [-- PYTEST ARGS]

CPU seconds are what the suite's wall on 2 cores is made of (README's command: -n auto, --dist
loadfile): they move less than wall seconds when other work shares the cores. For planning the
suite's time, not a benchmark of tracekit.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    with_shared = "--with-shared" in argv
    files = [a for a in argv if a != "--with-shared"]
    if not files:
        print(__doc__, file=sys.stderr)
        return 2
    env = dict(os.environ)
    if not with_shared:
        env["TRACEKIT_SHARED_TRACES"] = "/nonexistent/shared/traces"
    cache = tempfile.mkdtemp(prefix="tk-filecpu-")
    env.setdefault("TRACEKIT_CACHE_DIR", cache)
    total_cpu = total_wall = 0.0
    rc_all = 0
    print(f"{'cpu_s':>8} {'wall_s':>8}  rc  file")
    for f in files:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        rc = subprocess.call(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", f, *extra],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        total_cpu += cpu
        total_wall += wall
        rc_all = rc_all or rc
        print(f"{cpu:8.1f} {wall:8.1f} {rc:3d}  {f}", flush=True)
    print(
        f"{total_cpu:8.1f} {total_wall:8.1f} {rc_all:3d}  total (load average now {os.getloadavg()[0]:.1f})"
    )
    return rc_all


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
