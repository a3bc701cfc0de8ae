"""Before/after: ``python -m paddle_rt bench --json`` from two built trees (checkouts with in-place builds), the two
alternating run by run, and the median of each figure per tree with their ratio (issue 25 item 6: nothing else
got slower).

    python bench/compare_trees.py BEFORE_TREE AFTER_TREE [--areas allocator,streams,pool,ccl] [--runs 9] [--quick]

Each run is a fresh process (``PYTHONPATH=TREE python -m paddle_rt bench --only AREAS --json``, started from a
scratch directory so that no other checkout is imported); the order alternates (before, after, after, before, ...)
so that a drift in the machine's load falls on both sides alike. Prints a markdown table: figure, unit, median
before, median after, after / before, and the spread of the per-pair ratios (a ratio whose spread straddles 1 is
noise)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(tree, areas, scratch, quick):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    cmd = [sys.executable, "-m", "paddle_rt", "bench", "--only", areas, "--json"] + (["--quick"] if quick else [])
    out = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, check=True).stdout
    doc = json.loads(out)
    return {(r["area"], r["name"].strip()): (r["value"], r["unit"]) for r in doc["results"]}, \
        doc["machine"]["loadavg_1min"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--areas", default="allocator,streams,pool,ccl")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="pass --quick to the bench (fewer repetitions, smaller)")
    a = ap.parse_args()
    got = {"before": [], "after": []}
    loads = []
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(a.runs):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for side in order:
                rows, load = run(getattr(a, side), a.areas, scratch, a.quick)
                got[side].append(rows)
                loads.append(load)
            print(f"run {i + 1}/{a.runs} done, load {loads[-1]:.1f}", file=sys.stderr)
    print(f"load average (1 min) at the runs' ends: {min(loads):.2f}-{max(loads):.2f}\n")
    print("| area | figure | before | after | after / before | per-pair ratio range |")
    print("|---|---|---:|---:|---:|---|")
    for key in got["before"][0]:
        if not all(key in r for r in got["before"] + got["after"]):
            continue
        b = [r[key][0] for r in got["before"]]
        f = [r[key][0] for r in got["after"]]
        unit = got["before"][0][key][1]
        if not all(isinstance(v, (int, float)) for v in b + f):
            continue
        mb, mf = statistics.median(b), statistics.median(f)
        pairs = [y / x for x, y in zip(b, f) if x]
        ratio = mf / mb if mb else float("nan")
        spread = f"{min(pairs):.2f}-{max(pairs):.2f}" if pairs else ""
        print(f"| {key[0]} | {key[1]} | {mb:.4g} {unit} | {mf:.4g} {unit} | {ratio:.2f} | {spread} |")


if __name__ == "__main__":
    main()
