"""How long one xdist worker idles at the end of the suite (the tail), from a measured run: the
per-test seconds of a junit.xml (`--junitxml`, setup + call + teardown) replayed through
pytest-xdist 3.x's `--dist loadfile` rule (a worker is sent its next file when it has <= 2 tests
left) over N workers, files in the collection order (`pytest --collect-only -q` output: the order
tests/conftest.py's HEAVY_FILES gives), against the same rule with the files by measured seconds.

    python scripts/xdist_tail.py JUNIT.xml COLLECT_ONLY.txt [--workers 2]

For planning the suite's order, not a benchmark; the per-test seconds are those of the measured
run (a session capture's cost lands on the file that first asked for it).
"""

from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET


def per_file(junit: str) -> dict[str, list[float]]:
    tests: dict[str, list[float]] = {}
    for tc in ET.parse(junit).getroot().iter("testcase"):
        name = str(tc.get("classname")).split(".")[-1] + ".py"
        tests.setdefault(name, []).append(float(tc.get("time") or 0))
    return tests


def collection_order(path: str, tests: dict[str, list[float]]) -> list[str]:
    order: list[str] = []
    with open(path) as f:
        for line in f:
            if "::" in line:
                name = line.split("::", 1)[0].rsplit("/", 1)[-1]
                if name in tests and name not in order:
                    order.append(name)
    return order + [f for f in tests if f not in order]


def replay(order: list[str], tests: dict[str, list[float]], workers: int) -> list[tuple[float, list[str]]]:
    """Each worker's end (seconds) and files under the loadfile rule."""
    queue = list(order)
    nodes = [{"t": 0.0, "pending": collections.deque(), "files": []} for _ in range(workers)]

    def assign(nd: dict) -> None:
        f = queue.pop(0)
        nd["files"].append(f)
        nd["pending"].extend(tests[f])

    for nd in nodes:
        if queue:
            assign(nd)
    for nd in nodes:
        if queue and len(nd["pending"]) <= 2:
            assign(nd)
    while any(nd["pending"] for nd in nodes):
        nd = min((x for x in nodes if x["pending"]), key=lambda x: x["t"] + x["pending"][0])
        nd["t"] += nd["pending"].popleft()
        if queue and len(nd["pending"]) <= 2:
            assign(nd)
    return [(nd["t"], nd["files"]) for nd in nodes]


def main(argv: list[str]) -> int:
    workers = 2
    if "--workers" in argv:
        i = argv.index("--workers")
        workers = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    tests = per_file(argv[0])
    total = sum(map(sum, tests.values()))
    print(
        f"{len(tests)} files, {sum(map(len, tests.values()))} tests, {total:.1f} test-s; even split {total / workers:.1f} s"
    )
    by_seconds = sorted(tests, key=lambda f: -sum(tests[f]))
    for label, order in (
        ("collection order", collection_order(argv[1], tests)),
        ("by measured s", by_seconds),
    ):
        ends = replay(order, tests, workers)
        last = max(ends)[1][-3:]
        print(
            f"{label:17s} worker ends {' / '.join(f'{t:.1f}' for t, _ in ends)} s; "
            f"tail {max(t for t, _ in ends) - min(t for t, _ in ends):.1f} s; last files {', '.join(last)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
