"""The cached allocation pair with expandable segments on and off (issue 34: "no slower than today in either
mode"). rt_cpu:0 runs with ``expandable_segments:1``, rt_cpu:1 with ``:0`` (today's chunk policy); each repetition
times, alternating the two devices:

- the Python pair ``paddle_rt.malloc(n, device=d).free()`` over the power-of-two sizes 256 B .. 1 MiB;
- the nogil pair through the public Cython API (``core_malloc``/``core_free``, paddle_rt.bench._alloc_kernels) over
  the same sizes.

Every size is allocated once first, so each pair is a cache hit in both modes (the case the target is about).
Prints the medians and the on/off ratio of each repetition.

    python bench/expandable_pairs.py [--reps 15] [--json]
"""
import argparse
import json
import statistics
import time

import _checkout  # noqa: F401  (a checkout's in-place build when paddle_rt is not installed)
import numpy as np

import paddle_rt
from paddle_rt.bench import _alloc_kernels as K

SIZES = [256 << i for i in range(13)]            # 256 B .. 1 MiB
MODES = (("rt_cpu:0", "expandable_segments:1"), ("rt_cpu:1", "expandable_segments:0"))


def python_pairs(dev, rounds):
    m = paddle_rt.malloc
    t0 = time.perf_counter_ns()
    for _ in range(rounds):
        for n in SIZES:
            m(n, device=dev).free()
    return (time.perf_counter_ns() - t0) / (rounds * len(SIZES))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    for dev, conf in MODES:
        key, value = conf.split(":")
        paddle_rt.set_allocator_config(dev, **{key: value})
        held = [paddle_rt.malloc(n, device=dev) for n in SIZES]      # warm: every size cached
        del held
    active = {dev: paddle_rt.memory.allocator_config(dev)["expandable_active"] for dev, _ in MODES}
    assert active == {"rt_cpu:0": True, "rt_cpu:1": False}, active
    sizes = np.array(SIZES, dtype=np.int64)
    py = {dev: [] for dev, _ in MODES}
    core = {dev: [] for dev, _ in MODES}
    for _ in range(args.reps):
        for dev, _ in MODES:
            py[dev].append(python_pairs(dev, 2000))
            core[dev].append(K.core_pairs(dev, sizes, 20000))
    out = {}
    for name, d in (("Python pair", py), ("nogil pair", core)):
        on, off = d["rt_cpu:0"], d["rt_cpu:1"]
        ratios = [a / b for a, b in zip(on, off)]
        out[name] = {"on_ns": statistics.median(on), "off_ns": statistics.median(off),
                     "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"cached pairs, 256 B .. 1 MiB, medians of {args.reps} alternating repetitions")
    for name, r in out.items():
        print(f"  {name:12s} on {r['on_ns']:7.1f} ns  off {r['off_ns']:7.1f} ns  on/off {r['ratio_median']:.3f} "
              f"({r['ratio_min']:.3f} .. {r['ratio_max']:.3f})")


if __name__ == "__main__":
    main()
