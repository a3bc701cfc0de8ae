"""Search over the allocator's growth policy (issue 15): replay traces in this process through paddle_rt's
allocator under many configurations and score them against the goal

    on every trace: peak reserved <= 1.02 x Paddle's auto-growth figure, and
                    device allocations <= PyTorch's caching allocator's.

The anchors are the replay tool's models of both allocators (``python -m paddle_rt replay --baselines``, which
reproduce the table of /work/shared/traces/README.md), computed here for every trace, real or synthetic. A replay
takes milliseconds (the nogil loop of ``paddle_rt replay``); ``paddle_rt.reset_allocator`` before each one gives the
figures of a fresh process.

    python bench/policy_search.py table [--conf K:V,...]     # the figures of one configuration (default: defaults)
    python bench/policy_search.py search [--top N] [--grid fine]   # the grid below on every trace, best first
    python bench/policy_search.py loo [--synthetic]          # leave-one-out over the six real traces (chosen on
                                                             # five, with --synthetic ties broken by them too)
    python bench/policy_search.py heldout [--json F]         # issue 22: family-held-out validation on the corpus
                                                             # (bench/traces + ../shared/traces), CORPUS_GRID
    python bench/policy_search.py sensitivity                # each parameter of the default at x0.5 and x2
                                                             # (grow_round, consolidate: their other values)
    python bench/policy_search.py ablate                     # issue 34 item 5: does each key still change a
                                                             # result? (other values of each, logs that change)

``--traces DIR...`` (default bench/traces and /work/shared/traces) names the folders of logs (every log in them is
loaded; REAL names the six of issue 15 for table/search/loo); ``--synthetic`` adds the workloads of
bench/synthetic_traces.py (generated in memory) as generalisation checks. A configuration ranks by (real traces
missing the goal, synthetic ones missing it, its worst max(peak / limit, allocations / PyTorch's) on the real traces,
its mean peak / limit over every trace): the goal on the six real traces comes first, the synthetic workloads only
break ties. Run from the checkout (it imports the paddle_rt next to it).
"""
import argparse
import itertools
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
# rt_cpu's default capacity (a few GiB) is below the largest synthetic workloads; its memory is only touched when used
os.environ.setdefault("RT_CPU_MEMORY_BYTES", str(64 << 30))

import paddle_rt                                                        # noqa: E402
from paddle_rt.tools import replay                                      # noqa: E402

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = (os.path.join(HERE, "traces"), "/work/shared/traces")
REAL = ("resnet18_train", "mlp_varbatch", "bert_varlen", "unet_train", "lstm_lm_train", "vit_infer_varbatch")
PEAK_FACTOR = 1.02       # the full goal: peak reserved <= 1.02 x Paddle's (and device allocations <= PyTorch's)
PEAK_LIMIT = 1.15        # the bound on every trace
# The corpus by family (held-out validation leaves one family out at a time). A trace not listed is its own family.
FAMILIES = {
    "cnn_train": ("resnet18_train", "unet_train", "vae_train", "mixed_precision_train", "pointnet_varpoints",
                  "tcn_forecast"),
    "cnn_infer": ("cnn_infer_multires", "detect_varboxes", "diffusion_sample"),
    "transformer_train": ("bert_varlen", "grad_accum_train", "clip_contrastive"),
    "transformer_infer": ("vit_infer_varbatch", "conformer_varlen", "moe_infer_varlen"),
    "generation": ("llama_generate_cat", "llama_generate_static", "seq2seq_beam", "llm_batched_varlen",
                   "llm_paged_kv", "llm_long_context", "llama_example_15m"),
    "dense_sparse": ("mlp_varbatch", "dlrm_embeddings", "gnn_minibatch"),
    "recurrent_rl": ("lstm_lm_train", "rl_rollout_ppo"),
}

# The grid of `search`: the growth rule's parameters (see alloc_config.py) around the values that have a reason.
GRID = {
    "grow_min": ["2M", "4M", "8M"],
    "grow_step": ["16M", "24M", "32M", "48M", "64M"],
    "grow_fraction": ["0", "1/32", "1/16"],
    "grow_ratio": ["0.5", "1", "2"],
    "grow_round": ["nearest", "up", "down", "within"],
    "consolidate": ["fold", "release", "off"],
    "small_size": ["64K", "256K", "1M"],
    "small_chunk": ["2M", "4M"],
}
# A finer grid around the default (`search --grid fine`): the scalars between the coarse grid's points.
FINE_GRID = {
    "grow_min": ["3M", "4M", "5M", "6M"],
    "grow_step": ["28M", "32M", "36M", "40M", "44M", "48M"],
    "grow_fraction": ["1/32"],
    "grow_ratio": ["0.75", "1", "1.25", "1.5"],
    "grow_round": ["up", "within"],
    "consolidate": ["release"],
    "small_size": ["128K", "192K", "256K", "384K"],
    "small_chunk": ["2M", "3M"],
}
# The grid of `heldout` (issue 22, the corpus of bench/traces and ../shared/traces): the growth base (everything held,
# or with chunks made exactly for one request credited for a few requests of the missing size) and the end of the
# growth ramp (settle_after) and the bound in requests of the missing size (grow_requests) with the step parameters
# around round 3's default (grow_exact_credit only matters with grow_base:grown: with reserved it stays
# at its first value, see grid_confs); round 5: a request nearly as large as the step grows exactly (exact_above) and
# small requests borrow the large pool's free blocks before the small pool grows (small_borrow).
CORPUS_GRID = {
    "grow_base": ["reserved", "grown"],
    "grow_exact_credit": ["8", "4", "16"],
    "grow_min": ["3M", "4M"],
    "grow_step": ["10M", "12M", "14M"],
    "grow_fraction": ["1/4"],
    "grow_ratio": ["0.5", "0.625"],
    "grow_round": ["up", "within"],
    "consolidate": ["fold"],
    "small_size": ["64K", "128K"],
    "small_chunk": ["2M"],
    "settle_after": ["2000", "1000", "0"],
    "grow_requests": ["32", "0", "48"],
    "exact_above": ["0", "0.95"],
    "small_borrow": ["0", "1"],
}
# The parameters `sensitivity` scales (x0.5, x2), with their unit for the conf string.
SCALED = ("grow_min", "grow_step", "grow_fraction", "grow_ratio", "small_size", "small_chunk")


def family_of(name):
    for fam, names in FAMILIES.items():
        if name in names:
            return fam
    return name


def load_traces(folders, synthetic=False):
    """{name: (trace in replay.load_trace's form, {"paddle": figures, "torch": figures})} for every log of
    ``folders`` (a folder or a list of them)."""
    from paddle_rt.tools import corpus
    out = {}
    for path in corpus.corpus_files([folders] if isinstance(folders, str) else folders):
        out[corpus.trace_name(path)] = replay.load_trace(path)
    if synthetic:
        import synthetic_traces
        for name in synthetic_traces.WORKLOADS:
            out[name] = synthetic_traces.as_trace(synthetic_traces.generate(name))
    anchors = {}
    for name, t in out.items():
        anchors[name] = {"paddle": replay.run_model(replay.PaddleAutoGrowthModel(256, 0), t),
                         "torch": replay.run_model(replay.TorchCachingModel(), t)}
    return {n: (out[n], anchors[n]) for n in out}


def conf_text(conf):
    return ",".join(f"{k}:{v}" for k, v in conf.items())


def parse_conf(text):
    return replay._conf_dict(text)


def evaluate(conf, traces, device=None):
    """{name: {"peak", "allocs", "limit", "torch_allocs", "peak_ok", "allocs_ok", "badness"}} for one configuration.
    ``badness`` = max(peak / limit, allocs / PyTorch's): the goal holds on the trace when it is <= 1. The chunk
    policy is what is searched: ``expandable_segments:0`` unless ``conf`` names the key (segments are rt_cpu's
    default, and their ranges do not use the growth keys)."""
    conf = {"expandable_segments": "0", **conf}
    alloc = paddle_rt.get_allocator(device)
    res = {}
    try:
        for name, (trace, anchor) in traces.items():
            paddle_rt.reset_allocator(device)
            r = replay.run_once(None, device, conf, trace)
            limit = PEAK_FACTOR * anchor["paddle"]["peak_reserved"]
            t_allocs = anchor["torch"]["device_allocs"]
            peak, n = r["peak_reserved"], r["device_allocs"]
            ratio = peak / anchor["paddle"]["peak_reserved"]
            res[name] = {"peak": peak, "allocs": n, "limit": limit, "torch_allocs": t_allocs,
                         "paddle_peak": anchor["paddle"]["peak_reserved"], "ratio": ratio,
                         "peak_ok": peak <= limit, "allocs_ok": n <= t_allocs,
                         "within_limit": n <= t_allocs and ratio <= PEAK_LIMIT,
                         "badness": max(peak / limit, n / t_allocs)}
    finally:
        alloc.configure(**{k: None for k in conf})
        paddle_rt.reset_allocator(device)
    return res


def score(res, names=None):
    """Smaller is better: (real traces missing the goal, other traces missing it, the worst badness on the real
    traces, the mean peak / limit over every trace). ``names``: the traces that count as real (default: REAL)."""
    real = [n for n in (names or REAL) if n in res]
    other = [n for n in res if n not in real]
    bad = [res[n]["badness"] for n in real]
    return (sum(b > 1 for b in bad), sum(res[n]["badness"] > 1 for n in other), round(max(bad), 6),
            sum(r["peak"] / r["limit"] for r in res.values()) / len(res))


def corpus_score(res, names=None):
    """Smaller is better, for the corpus's targets: (traces beyond the bound: allocations over PyTorch's or peak over
    1.15 x Paddle's, traces missing the full goal, the worst peak / Paddle's of a trace whose allocations hold, the
    mean peak / Paddle's). ``names``: the traces that count (default: all)."""
    names = [n for n in (names or res)]
    rs = [res[n] for n in names]
    worst = max((r["ratio"] if r["allocs_ok"] else 9.0) for r in rs)
    return (sum(not r["within_limit"] for r in rs), sum(r["badness"] > 1 for r in rs), round(worst, 6),
            round(sum(r["ratio"] for r in rs) / len(rs), 6))


def grid_confs(grid=GRID):
    """Every combination of ``grid``'s values, but grow_exact_credit (meaningless under grow_base:reserved) only at
    its first value there."""
    keys = list(grid)
    for vals in itertools.product(*(grid[k] for k in keys)):
        conf = dict(zip(keys, vals))
        if conf.get("grow_base") == "reserved" and conf.get("grow_exact_credit", "") != grid["grow_exact_credit"][0]:
            continue
        yield conf


def search(traces, select=None, grid=GRID, log=None, scorer=None):
    """Every configuration of ``grid``, scored on the traces ``select`` (default: all) by ``scorer`` (default:
    score); best first."""
    scorer = scorer or score
    rows = []
    t0 = time.perf_counter()
    confs = list(grid_confs(grid))
    for i, conf in enumerate(confs):
        res = evaluate(conf, traces)
        rows.append((scorer(res, select), conf, res))
        if log and (i + 1) % 500 == 0:
            log(f"{i + 1}/{len(confs)} configurations, {time.perf_counter() - t0:.0f} s")
    rows.sort(key=lambda r: r[0])
    return rows


def fmt_table(res, title=None):
    lines = []
    if title:
        lines.append(title)
    lines.append("| trace | peak reserved MiB | limit (1.02 x Paddle) MiB | device allocs | PyTorch allocs | goal |")
    lines.append("|---|---:|---:|---:|---:|---|")
    for name, r in res.items():
        verdict = "holds" if r["peak_ok"] and r["allocs_ok"] else "MISSES " + " and ".join(
            w for w, ok in (("peak", r["peak_ok"]), ("allocations", r["allocs_ok"])) if not ok)
        lines.append(f"| {name} | {r['peak'] / MiB:.1f} | {r['limit'] / MiB:.1f} | {r['allocs']} | "
                     f"{r['torch_allocs']} | {verdict} |")
    return "\n".join(lines)


def default_conf():
    """The default values of the searched keys (alloc_config's defaults), as conf strings."""
    from paddle_rt._core import alloc_config as ac
    return {"grow_min": f"{ac.DEFAULT_GROW_MIN // MiB}M", "grow_step": f"{ac.DEFAULT_GROW_STEP // MiB}M",
            "grow_fraction": repr(ac.DEFAULT_GROW_FRACTION), "grow_ratio": repr(ac.DEFAULT_GROW_RATIO),
            "grow_round": ac.DEFAULT_GROW_ROUND, "consolidate": ac.DEFAULT_CONSOLIDATE,
            "small_size": f"{ac.DEFAULT_SMALL_SIZE // 1024}K", "small_chunk": f"{ac.DEFAULT_SMALL_CHUNK // MiB}M",
            "grow_base": ac.DEFAULT_GROW_BASE, "grow_exact_credit": str(ac.DEFAULT_GROW_EXACT_CREDIT),
            "settle_after": str(ac.DEFAULT_SETTLE_AFTER), "grow_requests": str(ac.DEFAULT_GROW_REQUESTS),
            "exact_above": repr(ac.DEFAULT_EXACT_ABOVE), "small_borrow": str(int(ac.DEFAULT_SMALL_BORROW))}


def scale(key, value, factor):
    """``value`` (a conf string) of ``key`` times ``factor``, as a conf string."""
    from paddle_rt._core import alloc_config as ac
    if key in ("grow_fraction", "grow_ratio"):
        v = ac._parse_fraction(key, value, "scale", 4.0) * factor
        return repr(min(v, 1.0 if key == "grow_fraction" else 4.0))
    return str(int(ac.parse_size(key, value) * factor))


# Other values of every key of the chunk policy (`ablate`): a key none of whose values changes a log's figures no
# longer decides anything and can go.
ABLATE = {
    "grow_min": ("x0.5", "x2"), "grow_step": ("x0.5", "x2"), "grow_fraction": ("x0.5", "x2"),
    "grow_ratio": ("x0.5", "x2"), "grow_round": ("nearest", "down", "within", "off"),
    "consolidate": ("release", "off"), "grow_base": ("reserved",), "grow_exact_credit": ("0", "4", "16"),
    "settle_after": ("1000", "5000"), "grow_requests": ("0", "16", "64"), "exact_above": ("0", "0.8", "1"),
    "small_borrow": ("0",), "small_size": ("0", "64K", "256K"), "small_chunk": ("1M", "4M"),
}


def ablate(traces):
    """Print, for each other value of each key (ABLATE), how many logs change their peak or device allocations
    against the default, and how many meet the full goal."""
    base = default_conf()
    ref = evaluate(base, traces)
    met = lambda r: sum(1 for v in r.values() if v["peak_ok"] and v["allocs_ok"])     # noqa: E731
    print(f"default: the full goal on {met(ref)} of {len(ref)} logs")
    print("| key | value | logs changed | full goal |")
    print("|---|---|---:|---:|")
    for key, values in ABLATE.items():
        for v in values:
            conf = dict(base)
            conf[key] = scale(key, base[key], float(v[1:])) if v.startswith("x") else v
            res = evaluate(conf, traces)
            changed = sum(1 for n in ref if (res[n]["peak"], res[n]["allocs"]) != (ref[n]["peak"], ref[n]["allocs"]))
            print(f"| {key} | {conf[key]} | {changed} | {met(res)} |", flush=True)
    return 0


def family_table(res, names):
    """(traces beyond the bound, traces missing the full goal, worst peak / Paddle's, worst allocations / PyTorch's)
    over ``names``."""
    rs = [res[n] for n in names]
    return (sum(not r["within_limit"] for r in rs), sum(r["badness"] > 1 for r in rs), max(r["ratio"] for r in rs),
            max(r["allocs"] / r["torch_allocs"] for r in rs))


def heldout(traces, args, log):
    """Family-held-out validation: every configuration of CORPUS_GRID replayed once on every trace; for each family,
    the configuration that scores best (corpus_score) on the other families, and its figures on the held-out one. The
    default: of those choices, the one whose result on the whole corpus (its worst trace first) is best."""
    rows = search(traces, None, grid=CORPUS_GRID, log=log, scorer=corpus_score)
    fams = {}
    for n in traces:
        fams.setdefault(family_of(n), []).append(n)
    print(f"{len(rows)} configurations x {len(traces)} traces in {len(fams)} families")
    print("\n| held-out family | traces | chosen on the other families | held out: beyond 1.15 / missing 1.02 | "
          "worst peak / Paddle | worst allocs / PyTorch |")
    print("|---|---|---|---:|---:|---:|")
    chosen = []
    for fam, names in fams.items():
        others = [n for n in traces if n not in names]
        sc, conf, res = min(rows, key=lambda r: corpus_score(r[2], others))
        beyond, miss, worst, wa = family_table(res, names)
        chosen.append((conf, res))
        print(f"| {fam} | {', '.join(names)} | {conf_text(conf)} | {beyond} / {miss} | {worst:.3f} | {wa:.2f} |")
    # the default: among the per-family choices, the one whose worst result on a family it was not chosen on (each
    # choice is held out from one family; its worst over all families bounds what it does on an unseen one) is best
    best = min(chosen, key=lambda c: corpus_score(c[1]))
    conf, res = best
    print(f"\ndefault (best worst result of the choices): {conf_text(conf)}; corpus score {corpus_score(res)}")
    print(fmt_corpus(res))
    print("\nits neighbours in the grid (one key changed): corpus score (beyond the bound, missing the full goal, worst "
          "ratio (9: allocations over), mean ratio)")
    for sc, other, _ in rows:
        diff = [k for k in conf if other[k] != conf[k]]
        if len(diff) == 1:
            print(f"  {diff[0]}={other[diff[0]]}: {sc}")
    if args.json:
        json.dump({"chosen": [(c, r) for c, r in chosen], "default": conf,
                   "top": [(sc, c) for sc, c, _ in rows[:50]]}, open(args.json, "w"), indent=1)
    return 0


def fmt_corpus(res):
    lines = ["| trace | family | peak MiB | peak / Paddle | allocs (PyTorch's) | target |", "|---|---|---:|---:|---:|---|"]
    for name in sorted(res, key=lambda n: (family_of(n), n)):
        r = res[name]
        v = "goal" if r["badness"] <= 1 else ("within 1.15" if r["within_limit"] else "MISS")
        lines.append(f"| {name} | {family_of(name)} | {r['peak'] / MiB:.1f} | {r['ratio']:.3f} | {r['allocs']} "
                     f"({r['torch_allocs']}) | {v} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python bench/policy_search.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("table", "search", "loo", "heldout", "sensitivity", "ablate"))
    ap.add_argument("--traces", nargs="+", default=list(CORPUS),
                    help="folders of allocation logs (default: bench/traces and /work/shared/traces)")
    ap.add_argument("--synthetic", action="store_true", help="also the synthetic workloads (bench/synthetic_traces.py)")
    ap.add_argument("--conf", default="", help="table: key:value,... over the defaults")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--grid", choices=("coarse", "fine"), default="coarse",
                    help="search: GRID (default) or FINE_GRID (around the default)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    args = ap.parse_args(argv)
    traces = load_traces(args.traces, args.synthetic)
    log = lambda m: print(m, file=sys.stderr, flush=True)      # noqa: E731

    if args.what == "table":
        conf = parse_conf(args.conf)
        res = evaluate(conf, traces)
        print(fmt_table(res, f"configuration: defaults{' + ' + args.conf if args.conf else ''}"))
        print(f"\nscore {score(res, REAL)} on the real traces")
        if args.json:
            json.dump(res, open(args.json, "w"), indent=1)
        return 0

    if args.what == "search":
        rows = search(traces, REAL, grid=FINE_GRID if args.grid == "fine" else GRID, log=log)
        feasible = sum(1 for r in rows if r[0][0] == 0)
        every = sum(1 for r in rows if r[0][0] == 0 and r[0][1] == 0)
        print(f"{len(rows)} configurations: {feasible} meet the goal on the six real traces, {every} on every trace")
        names = list(traces)
        print("rank | score | " + " | ".join(names) + " | configuration")
        for i, (sc, conf, res) in enumerate(rows[:args.top]):
            cells = " | ".join(f"{res[n]['peak'] / res[n]['limit']:.3f}/{res[n]['allocs']}:{res[n]['torch_allocs']}"
                               for n in names)
            print(f"{i + 1} | {sc[0]} {sc[1]} {sc[2]:.3f} {sc[3]:.3f} | {cells} | {conf_text(conf)}")
        if args.json:
            json.dump([(sc, conf, res) for sc, conf, res in rows], open(args.json, "w"))
        # the default's neighbours in the grid: one key changed
        base = default_conf()
        from paddle_rt._core import alloc_config as ac

        def same(k, a, b):
            if k in ("grow_fraction", "grow_ratio", "exact_above"):
                return abs(ac._parse_fraction(k, a, "", 4.0) - ac._parse_fraction(k, b, "", 4.0)) < 1e-12
            if k in ("grow_round", "consolidate", "grow_base", "grow_exact_credit", "settle_after", "grow_requests",
                     "exact_above", "small_borrow"):
                return str(a) == str(b)
            return ac.parse_size(k, a) == ac.parse_size(k, b)
        print("\nthe default's neighbours in this grid (one key changed) and the traces where the goal then fails:")
        for sc, conf, res in rows:
            diff = [k for k in base if k in conf and not same(k, conf[k], base[k])]
            if len(diff) <= 1:
                miss = [n for n in res if res[n]["badness"] > 1]
                print(f"  {diff[0] + '=' + conf[diff[0]] if diff else '(the default)'}: {', '.join(miss) or 'none'}")
        return 0

    if args.what == "loo":
        rows = search(traces, REAL, log=log)            # every configuration once; select per held-out trace below
        print("| held out | chosen on the other five | held-out peak MiB | limit MiB | allocs | PyTorch | goal |")
        print("|---|---|---:|---:|---:|---:|---|")
        for held in REAL:
            others = [n for n in REAL if n != held]
            seen = [n for n in traces if n != held]       # the five, and with --synthetic the synthetic workloads
            sc, conf, res = min(rows, key=lambda r: score({n: r[2][n] for n in seen}, others))
            r = res[held]
            verdict = "holds" if r["peak_ok"] and r["allocs_ok"] else "MISSES"
            print(f"| {held} | {conf_text(conf)} | {r['peak'] / MiB:.1f} | {r['limit'] / MiB:.1f} | {r['allocs']} | "
                  f"{r['torch_allocs']} | {verdict} |")
        return 0

    if args.what == "heldout":
        return heldout(traces, args, log)

    if args.what == "ablate":
        return ablate(traces)

    if args.what == "sensitivity":
        base = default_conf()
        ref = evaluate(base, traces)
        names = list(traces)
        print("| parameter | value | " + " | ".join(names) + " |")
        print("|---|---|" + "---:|" * len(names))
        print("| (default) | | " + " | ".join(f"{ref[n]['peak'] / MiB:.1f} / {ref[n]['allocs']}" for n in names)
              + " |")
        def deltas(conf):
            """Per trace: peak MiB / allocations against the default, marked where the goal is missed."""
            res = evaluate(conf, traces)
            cells = []
            for n in names:
                dp = (res[n]["peak"] - ref[n]["peak"]) / MiB
                da = res[n]["allocs"] - ref[n]["allocs"]
                mark = "" if res[n]["peak_ok"] and res[n]["allocs_ok"] else " (miss)"
                cells.append(f"{dp:+.1f} / {da:+d}{mark}")
            return cells

        for key in SCALED:
            for factor in (0.5, 2.0):
                conf = dict(base)
                conf[key] = scale(key, base[key], factor)
                print(f"| {key} | x{factor:g} = {conf[key]} | " + " | ".join(deltas(conf)) + " |")
        for key, names_ in (("grow_round", ("nearest", "down", "within", "off")), ("consolidate", ("fold", "off"))):
            for value in names_:
                conf = dict(base)
                conf[key] = value
                print(f"| {key} | {value} | " + " | ".join(deltas(conf)) + " |")
        return 0


if __name__ == "__main__":
    sys.exit(main())
