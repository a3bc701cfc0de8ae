"""The memory viewer's page (paddle_rt/tools/view_page.py): hover texts, timeline traces, the peak and sites tables,
the segment map, the page's text and its embedded data, each checked against the run the test builds."""
import json

import numpy as np
import pytest

from paddle_rt.tools import view_data


plotly = pytest.importorskip("plotly", reason="the view extra (plotly) is not installed: pip install '.[view]'")
from paddle_rt.tools import view_page  # noqa: E402
from test_view_data import MB, FRAMES_A, _snapdoc, _tr, two_pool_run  # noqa: E402


def test_fmt_bytes_units():
    """Byte counts as the tables and hovers print them: binary units, one decimal, a sign for differences."""
    f = view_page.fmt_bytes
    assert [f(3 << 30), f(1536 << 20), f(5 * MB), f(1536), f(1024), f(1023), f(0), f(None)] == [
        "3.0 GiB", "1.5 GiB", "5.0 MiB", "1.5 KiB", "1.0 KiB", "1,023 B", "0 B", "-"]
    assert [f(-(2 << 30)), f(-3 * MB), f(-2048), f(-5)] == ["-2.0 GiB", "-3.0 MiB", "-2.0 KiB", "-5 B"]
    assert f(2048 << 30) == "2,048.0 GiB"


def _hist_run(label, trace, segments=(), **kw):
    return view_data.build_run(view_data.events_from_history(
        _snapdoc({"d": {"segments": list(segments), "trace": trace}}))["d"], label=label, **kw)


def no_growth_run(label="B"):
    """A run without growth marks: a 2 MiB segment from before the history, a 1 MiB one freed at 3 ms, an oom at
    2 ms and empty_cache at 4 ms (reserved: 3 MiB until 3 ms, then 2 MiB)."""
    trace = [_tr("alloc", 0x100000, 4096, 0, frames=FRAMES_A), _tr("oom", 0, 8 * MB, 2, requested=8 * MB - 1),
             _tr("segment_free", 0xF00000, MB, 3), _tr("empty_cache", 0, MB, 4)]
    return _hist_run(label, trace, [{"address": 0x100000, "total_size": 2 * MB, "segment_type": "small",
                                     "blocks": [{"address": 0x100000, "size": 4096, "state": "active_allocated"}]}])


def test_marker_hover_texts():
    """Hovering a mark: what happened, the run, the time (ms, or the log's event number), the size (released bytes
    for empty_cache, the request for an oom), the stream and the Python stack (escaped, at most 8 frames)."""
    stack = "\n".join(f"f{i}.py:{i} fn<{i}>" for i in range(10))
    run = {"label": "R", "time_unit": "ms", "stacks": ["x.py:1 a", stack]}
    oom = {"kind": "oom", "t": 1234.5, "size": 3 * MB, "req": 3 * MB - 5, "stream": "7", "stack": 1}
    want_stack = "<br>".join(f"f{i}.py:{i} fn&lt;{i}&gt;" for i in range(8))
    assert view_page._marker_text(run, oom).split("<br>") == [
        "<b>out of memory</b>", "R", "t = 1,234.500 ms", "size 3.0 MiB", "requested 3.0 MiB", "stream 7", "stack:",
        *want_stack.split("<br>")]
    grow = {"kind": "growth", "t": 2.0, "size": 2 * MB, "stream": "0", "stack": -1, "seg": 0}
    assert view_page._marker_text({**run, "time_unit": "event"}, grow).split("<br>") == [
        "<b>growth (new segment)</b>", "R", "t = event 2", "size 2.0 MiB", "stream 0", "no Python stack recorded"]
    empty = {"kind": "empty_cache", "t": 3.0, "size": 5 * MB, "req": 5, "stream": "1", "stack": 0}
    assert view_page._marker_text(run, empty).split("<br>") == [
        "<b>empty_cache</b>", "R", "t = 3.000 ms", "size 5.0 MiB released", "stream 1", "stack:", "x.py:1 a"]
    assert "requested" not in view_page._marker_text(run, {**oom, "req": -1})
    assert "requested" not in view_page._marker_text(run, {**oom, "req": None})
    # a run's label (a file name, a labels= entry) is text, as in the series' hover and the tables
    assert view_page._marker_text({**run, "label": "a<b>.csv"}, grow).split("<br>")[1] == "a&lt;b&gt;.csv"


def test_timeline_traces():
    """The timeline: per run its colour, allocated dotted and reserved solid (both shown), pools and streams dashed
    behind the legend; a trace per kind of mark at the reserved level of its moment, hovering its text."""
    _, go = view_page.require_plotly()
    from paddle_rt.tools.view_levels import minmax_levels
    runs = [two_pool_run(label="A"), no_growth_run("B")]
    levels = [minmax_levels(r["t"], r["series"]) for r in runs]
    fig = view_page._timeline(go, runs, levels)
    lines = [tr for tr in fig.data if tr.mode == "lines"]
    assert [tr.name for tr in lines] == [f"{r['label']}: {k}" for r in runs for k in r["series"]]
    for tr in lines:
        i, name = tr.meta["run"], tr.meta["series"]
        assert tr.line.color == view_page.RUN_COLORS[i] and tr.line.shape == "hv"
        assert tr.line.dash == {"reserved": "solid", "allocated": "dot"}.get(name, "dash")
        assert tr.line.width == (2 if name in ("allocated", "reserved") else 1)
        assert tr.visible is (True if name in ("allocated", "reserved") else "legendonly") or \
            tr.visible == (True if name in ("allocated", "reserved") else "legendonly")
        assert list(tr.x) == list(runs[i]["t"]) and list(tr.y) == list(runs[i]["series"][name])
        assert tr.hovertemplate.startswith(f"{runs[i]['label']}: {name}<br>")
    marks = {(tr.meta["run"], tr.meta["markers"]): tr for tr in fig.data if tr.mode == "markers"}
    assert sorted(marks) == [(0, "empty_cache"), (0, "growth"), (0, "oom"), (1, "empty_cache"), (1, "oom")]
    assert marks[(0, "growth")].name == "A: growth" and marks[(1, "empty_cache")].name == "B: empty cache"
    assert marks[(0, "growth")].visible == "legendonly" and marks[(1, "oom")].visible is True
    assert marks[(0, "growth")].marker.color == view_page.RUN_COLORS[0]
    assert marks[(1, "oom")].marker.symbol == "x" and marks[(1, "empty_cache")].marker.symbol == "triangle-down"
    assert list(marks[(1, "oom")].x) == [2.0] and list(marks[(1, "oom")].y) == [3 * MB]
    assert list(marks[(1, "empty_cache")].x) == [4.0] and list(marks[(1, "empty_cache")].y) == [2 * MB]
    assert list(marks[(0, "oom")].x) == [6.0] and list(marks[(0, "oom")].y) == [5 * MB]
    oom_text = marks[(1, "oom")].text[0]
    assert oom_text.startswith("<b>out of memory</b><br>B<br>t = 2.000 ms<br>size 8.0 MiB") and \
        "requested 8.0 MiB" in oom_text
    assert marks[(0, "growth")].text[0].startswith("<b>growth (new segment)</b><br>A<br>t = 0.000 ms<br>size 4.0 MiB")
    assert all(tr.hovertemplate == "%{text}<extra></extra>" for tr in marks.values())
    assert fig.layout.title.text == "Memory over time (click to choose the moment of the segment maps)"
    assert fig.layout.xaxis.title.text == "time (ms)" and fig.layout.yaxis.title.text == "bytes"
    log_run = {**no_growth_run("L"), "time_unit": "event"}
    fig = view_page._timeline(go, [log_run], [minmax_levels(log_run["t"], log_run["series"])])
    assert fig.layout.xaxis.title.text == "log event"
    assert [tr.text[0].split("<br>")[2] for tr in fig.data if tr.mode == "markers"] == ["t = event 4", "t = event 2"]


def test_peak_table_rows():
    """The peaks table: each run's peaks and when, and its difference from the first run (bytes and percent); a
    model run (no allocated bytes) shows '-' there."""
    import re
    runs = [{"label": "A<1>", "time_unit": "ms", "peak": {"allocated": 2 * MB, "t": 1.5, "reserved": 4 * MB,
                                                        "t_reserved": 2.25}},
            {"label": "B", "time_unit": "event", "peak": {"allocated": 3 * MB, "t": 12345.0, "reserved": 3 * MB,
                                                          "t_reserved": 7.0}},
            {"label": "C", "time_unit": "event", "peak": {"allocated": None, "t": 0.0, "reserved": 6 * MB,
                                                          "t_reserved": 3.0}}]
    text = view_page._peak_table(runs)
    assert text.startswith('<table class="peaks" id="peaks"><tr><th>run</th><th>peak allocated</th><th>at</th>'
                           '<th>peak reserved</th><th>at</th><th>reserved vs first run</th>'
                           '<th>allocated vs first run</th></tr>')
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in text.split("</tr>")[1:-1]]
    assert rows == [["A&lt;1&gt;", "2.0 MiB", "1.500 ms", "4.0 MiB", "2.250 ms", "0 B (+0.0%)", "0 B (+0.0%)"],
                    ["B", "3.0 MiB", "event 12,345", "3.0 MiB", "event 7", "-1.0 MiB (-25.0%)", "1.0 MiB (+50.0%)"],
                    ["C", "-", "-", "6.0 MiB", "event 3", "2.0 MiB (+50.0%)", "-"]]
    zero = [{"label": "Z", "time_unit": "ms", "peak": {"allocated": 0, "t": 0.0, "reserved": 0, "t_reserved": 0.0}},
            runs[0]]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in view_page._peak_table(zero).split("</tr>")[1:-1]]
    assert rows[1][5:] == ["4.0 MiB", "2.0 MiB"]                 # no percent of nothing


def test_sites_table_rows():
    """The top sites: bytes, requested bytes, blocks and the stack (innermost 4 frames, escaped, '...' when there
    are more) or the stream of blocks without one; the heading gives the peak's time and bytes."""
    import re
    run = two_pool_run()
    text = view_page._sites_table(run, 3)
    assert text.startswith("<h3>Top allocation sites at the peak (3.000 ms, 3.0 MiB allocated)</h3>"
                           '<table class="sites" id="sites-3">')
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in text.split("</tr>")[1:-1]]
    assert rows == [["2.0 MiB", "1.9 MiB", "1", "model.py:7 forward"],
                    ["1.0 MiB", "976.6 KiB", "2", "train.py:10 step<br>main.py:3 &lt;module&gt;"],
                    ["4.0 KiB", "3.9 KiB", "1", "<i>no Python stack recorded</i> (stream 1)"]]
    long = {"sites": [{"stack": 0, "stream": "0", "bytes": 10, "requested": 0, "blocks": 1}],
            "stacks": ["\n".join(f"f{i}" for i in range(5))], "peak": {"t": 4.0, "allocated": 10},
            "time_unit": "event"}
    text = view_page._sites_table(long, 0)
    assert "(event 4, 10 B allocated)" in text and "f0<br>f1<br>f2<br>f3 ...</td>" in text and "f4" not in text
    four = {**long, "stacks": ["f0\nf1\nf2\nf3"]}
    assert "f0<br>f1<br>f2<br>f3</td>" in view_page._sites_table(four, 0)         # all of it: no '...'
    assert view_page._sites_table({**long, "sites": []}, 0) == ""


def test_unmapped_ranges_from_any_offset():
    """Unmapped parts of an expandable segment, wherever its mapping starts; overlapping ranges merged."""
    u = view_page._unmapped_ranges
    assert u({"size": 4 * MB, "mapped_ranges": [[MB, MB]]}) == [[0, MB], [2 * MB, 2 * MB]]
    assert u({"size": 4 * MB, "mapped_ranges": [[2 * MB, MB], [0, MB], [MB // 2, MB]]}) == [[3 * MB // 2, MB // 2],
                                                                                             [3 * MB, MB]]
    assert u({"size": 4 * MB, "page_size": MB, "mapped_pages": [0, 1, 0, 0]}) == [[0, MB], [2 * MB, 2 * MB]]
    assert u({"size": 4 * MB, "page_size": MB, "mapped_pages": [1, 1, 1, 1]}) == []
    assert u({"size": 4 * MB, "mapped_size": 3 * MB}) == [[3 * MB, MB]]
    assert u({"size": 4 * MB, "mapped_pages": [1, 0]}) is None                # pages without a page size


def test_segment_map_data():
    """The segment map's data: segments (hex address, size, pool, lifetime, unmapped part) and blocks by segment
    and offset in it."""
    run = two_pool_run()
    d = view_page._segment_data(run)
    assert d["segments"] == [["0x10000", MB, "small", 0.0, None, None], ["0x200000", 4 * MB, "large", 0.0, None,
                                                                          [[3 * MB, MB]]]]
    order = [b["addr"] for b in run["blocks"]]
    blocks = {a: {k: v[i] for k, v in d["blocks"].items()} for i, a in enumerate(order)}
    assert blocks[0x300000] == {"seg": 1, "off": MB, "size": 2 * MB, "req": 2_000_000, "stream": "1", "ta": 2.0,
                                "tf": 4.0, "stack": 1}
    assert blocks[0x11000]["off"] == 4096 and blocks[0x11000]["tf"] is None and blocks[0x11000]["seg"] == 0
    assert d["stacks"] == run["stacks"] and d["moments"] is None
    outside = view_page._segment_data({**run, "blocks": [{**run["blocks"][0], "seg": None, "addr": 5}]})
    assert outside["blocks"]["seg"] == [-1] and outside["blocks"]["off"] == [0]


def _page_data(text):
    start = text.index('id="prt-data">') + len('id="prt-data">')
    return json.loads(text[start:text.index("</script>", start)])


def test_page_text_and_data(tmp_path):
    """The page: its title, each run's heading in its timeline colour, source, kind and event count, notes, a
    segment map only for runs with segments, the tables; labels escaped everywhere and the embedded data intact."""
    import base64
    hist = two_pool_run(label="hist <b>&</b>", source="a&b.json", kind="history")
    n = 9000
    cnt = view_data.counter_run("gpu:0", np.arange(n) * 0.5, np.arange(n) % 97, np.full(n, 200.0), [],
                                label="trace </script> gpu:0", source="t.json")
    page = view_page.build_page([hist, cnt], title="T <&>")
    text = page.html
    assert "<title>T &lt;&amp;&gt;</title>" in text and "<h1>T &lt;&amp;&gt;</h1>" in text
    assert (f'<h2 style="color:{view_page.RUN_COLORS[0]}">hist &lt;b&gt;&amp;&lt;/b&gt;</h2>'
            '<div class="sub">a&amp;b.json (history, 8 events)</div>') in text
    assert (f'<h2 style="color:{view_page.RUN_COLORS[1]}">trace &lt;/script&gt; gpu:0</h2>'
            '<div class="sub">t.json (chrome_trace, 9,000 events)</div>'
            '<div class="note">a Chrome trace with memory counters only: no segment map</div>') in text
    assert 'id="caption-0"' in text and 'id="segmap-0"' in text and 'id="segmap-1"' not in text
    assert 'id="sites-0"' in text and 'id="sites-1"' not in text
    assert "Long timelines are drawn as the minimum and maximum of each bucket" in text     # 9000 > 2 x 4096
    assert text.count("<script") - text.count("<\\/script") >= 3
    assert '{"displaylogo": false, "responsive": true}' in text             # no link out of the offline page
    data = _page_data(text)
    assert data["maxRows"] == view_page.MAX_SEGMENT_ROWS == 64 and data["start"] == hist["peak"]["t"] == 3.0
    assert [r["label"] for r in data["runs"]] == [hist["label"], cnt["label"]]
    assert [r["time_unit"] for r in data["runs"]] == ["ms", "ms"]
    assert data["runs"][1]["segmap"] is None and data["runs"][0]["segmap"]["segments"][0][0] == "0x10000"
    lv = data["runs"][0]["levels"]
    assert len(lv) == 1 and lv[0]["buckets"] == 0 and sorted(lv[0]["series"]) == sorted(hist["series"])
    assert np.frombuffer(base64.b64decode(lv[0]["t"]), "<f8").tolist() == list(hist["t"])
    assert np.frombuffer(base64.b64decode(lv[0]["series"]["allocated"]), "<f8").tolist() == \
        hist["series"]["allocated"].tolist()
    lv = data["runs"][1]["levels"]
    assert len(base64.b64decode(lv[1]["series"]["allocated"])) == 4 * n          # the finer level: float32
    assert [x["buckets"] for x in lv] == [4096, 0] and np.frombuffer(base64.b64decode(lv[0]["series"]["reserved"]),
                                                                  "<f8").max() == 200.0
    default = view_page.build_page([hist])
    assert "<title>paddle_rt memory view: hist &lt;b&gt;&amp;&lt;/b&gt;</title>" in default.html
    assert "Long timelines" not in default.html
    with pytest.raises(ValueError, match="no runs"):
        view_page.build_page([])
    out = tmp_path / "p.html"
    assert page.save(out) == str(out) and out.read_text(encoding="utf-8") == text
    assert [p.name for p in tmp_path.iterdir()] == ["p.html"]                 # no temporary file left
    assert repr(page) == f"<paddle_rt memory view: 2 run(s), {len(text) / MB:.1f} MiB of HTML>"
    frame = page._repr_html_()
    assert frame.startswith('<iframe srcdoc="') and "&lt;title&gt;T &amp;lt;&amp;amp;&amp;gt;&lt;/title&gt;" in frame
    assert 'sandbox="allow-scripts"' in frame


def test_segment_map_figure_layout():
    """The segment map's frame: offsets as fractions of the segment on x, one row per segment, lowest address on
    top, holes and unmapped pages drawn over the segment's row, the legend (blocks, holes, unmapped) above it."""
    _, go = view_page.require_plotly()
    lay = view_page._segmap_figure(go, 0).layout
    assert tuple(lay.xaxis.range) == (0, 1) and lay.yaxis.type == "category" and lay.yaxis.autorange == "reversed"
    assert lay.barmode == "overlay"
    assert lay.legend.orientation == "h" and lay.legend.yanchor == "bottom" and lay.legend.y == 1.0


# ---------------------------------------------------------------------------------------------------------------------
# segments of expandable ranges

def test_expandable_segments_keep_their_mapping_at_the_end():
    """The mapping an expandable segment reports at the snapshot's end (pages with their size, ranges, mapped size)
    is kept for the segment live at the end, and gives its unmapped part on the map."""
    segments = [{"address": 0x100000, "total_size": 4 * MB, "page_size": MB, "mapped_pages": [1, 0, 1, 0],
                 "blocks": []},
                {"address": 0x800000, "total_size": 2 * MB, "mapped_ranges": [[0, MB]], "blocks": []}]
    trace = [_tr("segment_alloc", 0x800000, 2 * MB, 0), _tr("segment_free", 0x800000, 2 * MB, 1),
             _tr("segment_alloc", 0x800000, 2 * MB, 2)]
    run = _hist_run("x", trace, segments)
    s0, old, new = run["segments"]
    assert (s0["page_size"], s0["mapped_pages"]) == (MB, [1, 0, 1, 0]) and s0.get("before") is True
    assert "mapped_ranges" not in old and old["t_free"] == 1.0 and new["mapped_ranges"] == [[0, MB]]
    assert [s[5] for s in view_page._segment_data(run)["segments"]] == [[[MB, MB], [3 * MB, MB]], None, [[MB, MB]]]
