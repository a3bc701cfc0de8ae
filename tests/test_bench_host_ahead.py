"""paddle_rt/bench/host_ahead.py: the bench area of issue 45 (host waiting vs running ahead): its synthetic log and
its figures (speed is not asserted; the verdicts of the targets that hold by construction are)."""
from paddle_rt.bench import host_ahead
from paddle_rt.tools import replay


def test_synthetic_log_is_a_well_formed_log(tmp_path):
    path = host_ahead.synthetic_log(str(tmp_path / "s.csv"), events=400, seed=3)
    is_alloc, sizes, slots, nslots, peak = replay.load_trace(path)
    assert is_alloc.sum() * 2 == len(is_alloc) and len(is_alloc) >= 400        # everything freed at the end
    assert sizes[is_alloc == 1].min() >= 256 and sizes.max() <= 8 << 20 and peak > 0
    assert open(path).read() == open(host_ahead.synthetic_log(str(tmp_path / "t.csv"), 400, 3)).read()


def test_measure_gives_both_figures_side_by_side():
    rows = host_ahead.measure(quick=True)
    names = [r["name"] for r in rows]
    assert names[0].startswith("replay, caching allocator") and names[1].startswith("replay, stream-ordered pool")
    by = {r["name"]: r for r in rows}
    assert by["loader: batches with a wrong result (both APIs, both modes)"]["value"] == 0
    assert by["loader, pool, free_async on the compute stream: ahead / waiting"]["verdict"] == "met"
    assert by["loader, caching allocator + record_stream: ahead / waiting"]["target"] is None
    assert all(r["area"] == "host_ahead" and r["unit"] in ("x", "") for r in rows)
