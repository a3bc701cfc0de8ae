"""The memory viewer on a large input: a 1-million-event allocation log (generated here, seeded) through
``paddle-rt view``, the page's size, and the time a headless Chromium takes to open it (from navigation to the
page's own script having drawn the timeline, the segment maps and the tables), against the same Chromium opening a
page of plotly.js alone with one two-point chart (what any plotly page costs), alternating, each load in a fresh
browser (no code cache), medians.

    python bench/bench_view.py [--events 1000000] [--repeat 5] [--keep DIR]

Needs the ``view`` extra and Debian's chromium + chromium-driver. Prints a Markdown table for bench/RESULTS.md.
"""
import argparse
import gzip
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def generate_log(path, events, seed=38):
    """A training-like allocation log of exactly ``events`` events: weights live throughout, each step allocates
    activations layer by layer (kept for backward), temporaries freed at once, gradients, then frees everything of
    the step in reverse; sizes vary per step (variable batch); two streams."""
    rng = random.Random(seed)
    lines = ["Thread,Time,Action,Pointer,Size,Stream"]
    live = {}
    nxt = [0x10000]
    t = [0.0]

    def alloc(size, stream=0):
        p = nxt[0]
        nxt[0] += 1
        live[p] = size
        t[0] += 1e-6
        lines.append(f"0,{t[0]:.6f},allocate,{p:#x},{size},{stream}")
        return p

    def free(p, stream=0):
        live.pop(p)
        t[0] += 1e-6
        lines.append(f"0,{t[0]:.6f},free,{p:#x},{0},{stream}")

    weights = [alloc(rng.choice((1, 2, 4, 8)) * (1 << 20) + rng.randrange(0, 4096) * 256) for _ in range(40)]
    del weights
    while len(lines) - 1 < events - 4:
        batch = rng.randint(1, 8)
        acts = []
        for layer in range(24):
            if len(lines) - 1 >= events - 4:
                break
            acts.append(alloc(batch * rng.randint(16, 160) * 1024))
            tmp = [alloc(rng.randint(1, 4096) * 64, stream=layer % 2) for _ in range(rng.randint(1, 6))]
            for p in reversed(tmp):
                if len(lines) - 1 < events - len(acts) - 2:
                    free(p, stream=layer % 2)
        for p in reversed(acts):
            if len(lines) - 1 < events:
                free(p)
    # fix the free sizes (RMM logs carry the allocation's size on its free)
    sizes = {}
    out = [lines[0]]
    for ln in lines[1:]:
        th, tm, act, ptr, size, st = ln.split(",")
        if act == "allocate":
            sizes[ptr] = size
        else:
            size = sizes.pop(ptr)
        out.append(",".join((th, tm, act, ptr, size, st)))
    out = out[:events + 1]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(out) + "\n")
    return len(out) - 1


def open_time(page):
    """Seconds from navigation to the page being ready (its own script's ``data-ready``; a plotly-only page marks the
    same at its end), in a fresh headless Chromium."""
    from test_view import chromium_driver
    d = chromium_driver()
    try:
        d.get("file://" + os.path.abspath(page))
        for _ in range(1200):
            if d.execute_script("return document.body && document.body.dataset.ready") == "1":
                break
            time.sleep(0.05)
        ms = d.execute_script("return document.body.dataset.readyMs")
        errors = [e for e in d.get_log("browser") if e.get("level") == "SEVERE"]
        if errors:
            raise SystemExit(f"{page}: JavaScript errors: {errors}")
        return float(ms) / 1000.0
    finally:
        d.quit()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--keep", default=None, help="keep the log and the pages in this folder")
    ap.add_argument("--reuse", action="store_true",
                    help="with --keep: time the pages already in that folder (no new log, no new build)")
    args = ap.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="bench_view_")
    os.makedirs(work, exist_ok=True)
    log = os.path.join(work, f"synthetic_{args.events}.csv.gz")
    n = args.events if args.reuse and os.path.exists(log) else generate_log(log, args.events)
    cmd = [sys.executable, "-m", "paddle_rt", "view"]
    rows = []
    pages = {}
    for name, extra in (("one replay", []), ("replay + Paddle and PyTorch baselines", ["--baselines"])):
        page = os.path.join(work, f"view_{len(pages)}.html")
        if args.reuse and os.path.exists(page):
            pages[name] = (page, float("nan"))
            continue
        t0 = time.perf_counter()
        r = subprocess.run(cmd + [log, "-o", page] + extra, capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(r.stderr)
        pages[name] = (page, time.perf_counter() - t0)
    import plotly.graph_objects as go
    base = os.path.join(work, "plotly_only.html")
    go.Figure(go.Scatter(x=[0, 1], y=[0, 1])).write_html(base, include_plotlyjs=True)
    with open(base, "a") as f:
        f.write("<script>document.body.dataset.readyMs=performance.now().toFixed(0);"
                "document.body.dataset.ready='1';</script>")
    samples = {name: [] for name in pages}
    samples["plotly.js alone"] = []
    for _ in range(args.repeat):           # alternating
        samples["plotly.js alone"].append(open_time(base))
        for name, (page, _) in pages.items():
            samples[name].append(open_time(page))
    b = statistics.median(samples["plotly.js alone"])
    print(f"\n{n:,} events; load average {os.getloadavg()[0]:.1f}; {args.repeat} loads each, fresh Chromium each\n")
    print("| page | file size | build (s) | open (s), median | spread | vs plotly.js alone |")
    print("|---|---|---|---|---|---|")
    print(f"| plotly.js alone | {os.path.getsize(base) / 2**20:.1f} MiB | - | {b:.2f} | "
          f"{min(samples['plotly.js alone']):.2f}-{max(samples['plotly.js alone']):.2f} | 1.00x |")
    for name, (page, build) in pages.items():
        m = statistics.median(samples[name])
        print(f"| {name} | {os.path.getsize(page) / 2**20:.1f} MiB | {build:.0f} | {m:.2f} | "
              f"{min(samples[name]):.2f}-{max(samples[name]):.2f} | {m / b:.2f}x |")
    if not args.keep:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
