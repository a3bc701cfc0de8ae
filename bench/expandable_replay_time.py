"""Replay time per event with expandable segments on against off (issue 34's "replay time per event <= 1.25x the
mode without segments"), measured the way bench/ measures speed: one process, each log replayed in both modes in
alternating order (on, off, then off, on, ...), after a warm-up replay of each, the median of each mode.

Each replay starts from an empty allocator (``paddle_rt.tools.replay.run_once`` gives everything back at its end), so
the segments mode pays for every physical page it creates and maps within the timed replay; the chunk mode for every
chunk. Also reported: pages created per 1,000 events, the quantity that bounds the ratio on short logs (each page is
one creation and a share of a map call; a chunk is one device_memory_allocate however large).

    python bench/expandable_replay_time.py bench/traces /work/shared/traces [--rounds N] [--only NAME,...]
"""
import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("RT_CPU_MEMORY_BYTES", str(64 << 30))   # an unbounded device, as in the corpus figures

from paddle_rt.tools import corpus, replay  # noqa: E402

MODES = {"on": {"expandable_segments": "1"}, "off": {"expandable_segments": "0"}}


def measure(path, rounds, min_seconds):
    trace = replay.load_trace(path)
    for conf in MODES.values():                                   # warm-up
        replay.run_once(path, None, conf, trace)
    ns = {m: [] for m in MODES}
    pages = events = 0
    t_end = time.perf_counter() + min_seconds
    k = 0
    while k < rounds or (time.perf_counter() < t_end and k < 4 * rounds):
        order = ("on", "off") if k % 2 == 0 else ("off", "on")
        for m in order:
            r = replay.run_once(path, None, MODES[m], trace)
            ns[m].append(r["ns_per_event"])
            if m == "on":
                pages, events = r["device_allocs"], r["events"]
        k += 1
    on, off = statistics.median(ns["on"]), statistics.median(ns["off"])
    return {"trace": corpus.trace_name(path), "events": events, "pages": pages, "on": on, "off": off,
            "ratio": on / off, "rounds": k}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--only", default=None)
    args = ap.parse_args(argv)
    paths = corpus.pick(corpus.corpus_files(args.folders), args.only)
    print("| log | events | pages created / 1,000 events | on: ns/event | off: ns/event | on / off | rounds |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for p in paths:
        r = measure(p, args.rounds, args.min_seconds)
        rows.append(r)
        print(f"| {r['trace']} | {r['events']} | {1000 * r['pages'] / max(1, r['events']):.1f} | {r['on']:.0f} | "
              f"{r['off']:.0f} | {r['ratio']:.2f} | {r['rounds']} |", flush=True)
    if rows:
        ratios = [r["ratio"] for r in rows]
        print()
        print(f"on / off: median {statistics.median(ratios):.2f}, <= 1.25 on {sum(x <= 1.25 for x in ratios)}/"
              f"{len(rows)}, worst {max(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
