"""paddle_rt/tools/replay_async.py: a log replayed with the host waiting and running ahead of a lagging device
(issue 45): the figures of one replay, the corpus table and its verdicts."""
import pytest

import paddle_rt
from paddle_rt.tools import replay, replay_async
from trace_helpers import write_trace

MiB = 1 << 20
LOG = [("allocate", 0x1, 3 * MiB), ("allocate", 0x2, 100), ("free", 0x1, 0), ("allocate", 0x3, 2 * MiB),
       ("free", 0x2, 0), ("allocate", 0x4, 0), ("free", 0x3, 0), ("free", 0x4, 0)]


@pytest.mark.parametrize("api", ["malloc", "pool"])
@pytest.mark.parametrize("wait", [False, True])
def test_run_in_process_gives_the_memory_back(tmp_path, api, wait):
    trace = replay.load_trace(write_trace(tmp_path / "t.csv", LOG))
    dev = paddle_rt.device("rt_cpu:1")
    before = paddle_rt.memory_reserved(dev), paddle_rt.memory_allocated(dev)
    r = replay_async.run(trace, "rt_cpu:1", None, api, wait)
    assert (r["api"], r["mode"], r["events"]) == (api, "waiting" if wait else "ahead", len(LOG))
    assert r["peak_reserved"] >= 3 * MiB and r["maps"] >= r["unmaps"] >= 0
    assert (paddle_rt.memory_reserved(dev), paddle_rt.memory_allocated(dev)) == before


def _fig(peak, maps=1, unmaps=0):
    return {"peak_reserved": peak, "maps": maps, "unmaps": unmaps, "seconds": 0.1}


def _row(name, mw, ma, pw, pa):
    return {"trace": name, "delay_us": 20,
            "malloc": {"waiting": _fig(mw), "ahead": _fig(ma), "ratio": ma / mw},
            "pool": {"waiting": _fig(pw), "ahead": _fig(pa), "ratio": pa / pw}, "pool_vs_malloc": pw / mw}


def test_corpus_verdicts_and_table():
    rows = [_row("a", 100 * MiB, 100 * MiB, 100 * MiB, 101 * MiB), _row("b", 100 * MiB, 110 * MiB, 105 * MiB,
                                                                        105 * MiB)]
    s = replay_async.corpus_summary(rows)
    assert not s["met"] and s["ahead_over"] == [("b", "malloc", pytest.approx(1.1))]
    assert s["pool_over"] == [("b", pytest.approx(1.05))]
    text = replay_async.corpus_summary_text(s)
    assert text.startswith("2 traces, host running ahead vs waiting: worst 1.100 (target <= 1.02); pool vs caching "
                           "allocator (waiting): worst 1.050 (target <= 1.02): targets MISSED")
    assert "ahead over target: b malloc (1.100x)" in text and "pool over target: b (1.050x)" in text
    lines = replay_async.corpus_table(rows).splitlines()
    assert lines[0].endswith("| ahead / waiting | pool / malloc (waiting) |")
    assert lines[2] == "| a | malloc | 100.0 / 1 / 0 | 100.0 / 1 / 0 | 1.000 | |"
    assert lines[5] == "| b | pool | 105.0 / 1 / 0 | 105.0 / 1 / 0 | 1.000 | 1.050 OVER |"
    assert lines[4].startswith("| b | malloc |") and "| 1.100 OVER |" in lines[4]
    assert replay_async.corpus_summary([_row("a", 1, 1, 1, 1)])["met"]


def test_one_api_has_no_pool_column():
    row = _row("a", 10, 10, 10, 10)
    del row["pool"], row["pool_vs_malloc"]
    assert replay_async.corpus_table([row]).splitlines()[0].endswith("| ahead / waiting |")
    assert replay_async.corpus_summary([row])["worst_pool"] is None


def test_api_list_and_ratio():
    assert replay_async.api_list("both") == ("malloc", "pool")
    assert replay_async.api_list("pool") == ("pool",)
    assert replay_async.ratio(0, 0) == 1.0 and replay_async.ratio(3, 2) == 1.5
