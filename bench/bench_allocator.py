"""Allocator benchmarks: a thin wrapper over paddle_rt.bench.allocator (the same code
``python -m paddle_rt bench --only allocator`` runs; that module says what is measured). Every ratio is measured
within one run, the two sides interleaved, and reported as the median over --reps repetitions (default 7).

  python bench/bench_allocator.py [--reps N] [--json]
"""
import argparse
import json
import sys

import _checkout  # noqa: F401  (first: a checkout's in-place build when paddle_rt is not installed)
import paddle_rt
from paddle_rt.bench import allocator as alloc_bench


def main(argv=None):
    ap = argparse.ArgumentParser(description=alloc_bench.__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.reps < 5:
        ap.error("--reps must be >= 5")
    dev = paddle_rt.device(args.device) if args.device else paddle_rt.get_device()
    res = alloc_bench.run(dev, args.reps)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    p, g, m = res["python"], res["nogil"], res["many_live"]

    def ok(b):
        return "ok" if b else "MISSED"

    print(f"allocator benchmarks on {dev}, medians of {args.reps} repetitions")
    print(f"{'measure':58s} {'figure':>12s} {'target':>10s}")
    print(f"{'python floor: create+drop a trivial cdef object (ns)':58s} {p['ns_per_pair']['floor']:12.1f}")
    for k, label in (("allocation", "malloc(256).free()"), ("allocation_device", "malloc(256, d).free()"),
                     ("raw", "raw_free(raw_malloc(256))"),
                     ("raw_device", "raw_free(raw_malloc(256, d), d)")):
        ns = p["ns_per_pair"][k]
        r = p["ratio_to_floor"][k]
        print(f"{'python pair ' + label + ' (ns)':58s} {ns:12.1f} {'<= 100':>10s} {ok(ns <= 100)}")
        print(f"{'  ratio to the floor':58s} {r:12.2f} {'<= 3x':>10s} {ok(r <= 3)}")
        print(f"{'  net of the empty loop (ns; floor net ' + format(p['net_ns_per_pair']['floor'], '.1f') + ')':58s}"
              f" {p['net_ns_per_pair'][k]:12.1f}")
    print(f"{'nogil pair, core API, 256 B..1 MiB (ns)':58s} {g['core_ns']:12.1f}")
    print(f"{'nogil pair, glibc malloc/free, same sizes (ns)':58s} {g['glibc_ns']:12.1f}")
    print(f"{'  ratio (stretch)':58s} {g['ratio']:12.2f} {'<= 2x':>10s} {ok(g['ratio'] <= 2)}")
    print(f"{'nogil pair with 100,000 live blocks (ns)':58s} {m['live_100k_ns']:12.1f}")
    print(f"{'nogil pair with 10 live blocks (ns)':58s} {m['live_10_ns']:12.1f}")
    print(f"{'  ratio':58s} {m['ratio']:12.2f} {'<= 2x':>10s} {ok(m['ratio'] <= 2)}")
    print(f"{'nogil pair, 100,000 live + 33,000 free fragments (ns)':58s} {m['live_100k_with_holes_ns']:12.1f}")
    print(f"{'  ratio to 10 live (harsher than the target asks)':58s} {m['ratio_with_holes']:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
