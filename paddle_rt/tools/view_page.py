"""The memory viewer's page: one self-contained HTML file (plotly.js written inline by plotly.py, the data embedded;
nothing is fetched when it is opened), built from :mod:`paddle_rt.tools.view_data` runs. Needs plotly (the ``view``
extra: ``pip install "paddle_rt[view]"``), imported only when a page is built.

The page holds: the timeline of every run on one time axis (allocated and reserved bytes of each device; of each
pool and stream behind the legend), out-of-memory, ``empty_cache`` and growth events marked; a table of the peaks
with the difference of each run from the first; per run the segment map at the moment chosen by a click on the
timeline (blocks, free holes, unmapped pages when the snapshot has them) and the top allocation sites live at the
peak. Hovering a block or an event shows its size, requested bytes, stream, time and Python stack.

The page's own script (``_SCRIPT``) only links the charts: it fills the segment maps from the embedded data at the
chosen moment and, when the timeline is zoomed, swaps in the finer min/max level of each series.
"""
import base64
import html
import json
import os

import numpy as np

from paddle_rt.tools.figures import MissingExtraError

__all__ = ["VIEW_EXTRA", "require_plotly", "Page", "build_page", "MAX_SEGMENT_ROWS"]

VIEW_EXTRA = 'pip install "paddle_rt[view]"'
MAX_SEGMENT_ROWS = 64          # segments drawn per map (beyond: the largest), the rest counted in the caption
RUN_COLORS = ("#3b6fb6", "#d9822b", "#5aa469", "#a05195", "#7a7a7a", "#c23b22")
MiB = 1 << 20


def require_plotly():
    """Import plotly (the ``view`` extra) or raise :class:`MissingExtraError` saying how to install it."""
    try:
        import plotly
        import plotly.graph_objects as go
        import plotly.offline
    except ImportError as exc:
        raise MissingExtraError(f"the memory viewer needs plotly, which is not installed: {VIEW_EXTRA}") from exc
    return plotly, go


def fmt_bytes(n):
    if n is None:
        return "-"
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, k in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1024)):
        if n >= k:
            return f"{sign}{n / k:,.1f} {unit}"
    return f"{sign}{n:,.0f} B"


def _fmt_t(t, unit):
    return f"event {t:,.0f}" if unit == "event" else f"{t:,.3f} ms"


def _b64(a, dtype=np.float64):
    """Little-endian binary of ``a`` in base64 (times as float64; byte counts as float32 beyond the first level: a
    relative error of 6e-8, below a pixel; the tables' figures are exact)."""
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()).decode("ascii")


def _num(x):
    """JSON-safe number: infinities become null."""
    return None if x is None or (isinstance(x, float) and not np.isfinite(x)) else x


class Page:
    """A built viewer page: ``html`` (the whole self-contained document), ``save(path)``, and ``_repr_html_`` so that
    Jupyter shows it inline (in an iframe, the page's scripts apart from the notebook's)."""

    def __init__(self, html_text, runs):
        self.html = html_text
        self.runs = runs

    def save(self, path):
        path = os.fspath(path)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(self.html)
        os.replace(tmp, path)
        return path

    def _repr_html_(self):
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" style="width:100%;height:1100px;border:0" '
                f'sandbox="allow-scripts"></iframe>')

    def __repr__(self):
        return f"<paddle_rt memory view: {len(self.runs)} run(s), {len(self.html) / MiB:.1f} MiB of HTML>"


def _segment_data(run):
    """The segment map's data of a run: segments and blocks as columns (addresses as hex strings)."""
    segs = []
    for s in run["segments"]:
        unmapped = _unmapped_ranges(s)
        segs.append([hex(s["addr"]), s["size"], s["pool"], _num(s["t_alloc"]), _num(s["t_free"]), unmapped])
    b = run["blocks"]
    seg_addr = [s["addr"] for s in run["segments"]]
    return {
        "segments": segs,
        "blocks": {
            "seg": [x["seg"] if x["seg"] is not None else -1 for x in b],
            "off": [x["addr"] - seg_addr[x["seg"]] if x["seg"] is not None else 0 for x in b],
            "size": [x["size"] for x in b],
            "req": [x["req"] for x in b],
            "stream": [x["stream"] for x in b],
            "ta": [_num(x["t_alloc"]) for x in b],
            "tf": [_num(x["t_free"]) for x in b],
            "stack": [x["stack"] for x in b],
        },
        "stacks": run["stacks"],
        "moments": run["moments"],
    }


def _unmapped_ranges(seg):
    """[[offset, bytes]] not mapped in an expandable segment (``mapped_ranges`` [[offset, bytes]] or ``mapped_pages``
    booleans with ``page_size``), or None when the segment says nothing about mapping."""
    size = seg["size"]
    mapped = None
    if isinstance(seg.get("mapped_ranges"), list):
        mapped = sorted((int(o), int(n)) for o, n in seg["mapped_ranges"])
    elif isinstance(seg.get("mapped_pages"), list) and seg.get("page_size"):
        ps = int(seg["page_size"])
        mapped = [(i * ps, ps) for i, m in enumerate(seg["mapped_pages"]) if m]
    elif isinstance(seg.get("mapped_size"), int):
        mapped = [(0, seg["mapped_size"])]
    if mapped is None:
        return None
    out, pos = [], 0
    for o, n in mapped:
        if o > pos:
            out.append([pos, o - pos])
        pos = max(pos, o + n)
    if pos < size:
        out.append([pos, size - pos])
    return out


def _marker_text(run, m):
    unit = run["time_unit"]
    what = {"oom": "out of memory", "empty_cache": "empty_cache", "growth": "growth (new segment)"}[m["kind"]]
    lines = [f"<b>{what}</b>", html.escape(run["label"]), f"t = {_fmt_t(m['t'], unit)}",
             f"size {fmt_bytes(m['size'])}" + (" released" if m["kind"] == "empty_cache" else "")]
    if m.get("req", -1) is not None and m.get("req", -1) >= 0 and m["kind"] == "oom":
        lines.append(f"requested {fmt_bytes(m['req'])}")
    lines.append(f"stream {m['stream']}")
    if m["stack"] >= 0:
        lines.append("stack:<br>" + "<br>".join(html.escape(ln) for ln in run["stacks"][m["stack"]].split("\n")[:8]))
    else:
        lines.append("no Python stack recorded")
    return "<br>".join(lines)


def _timeline(go, runs, levels):
    fig = go.Figure()
    unit = runs[0]["time_unit"]
    for i, (run, lv) in enumerate(zip(runs, levels)):
        color = RUN_COLORS[i % len(RUN_COLORS)]
        l0 = lv[0]
        for name in run["series"]:
            main = name in ("allocated", "reserved")
            dash = "solid" if name == "reserved" else ("dot" if name == "allocated" else "dash")
            fig.add_trace(go.Scatter(
                x=l0["t"], y=l0[name], mode="lines", name=f"{run['label']}: {name}",
                line=dict(color=color, width=2 if main else 1, dash=dash, shape="hv"),
                visible=True if main else "legendonly", meta={"run": i, "series": name},
                hovertemplate=f"{html.escape(run['label'])}: {name}<br>%{{y:,.0f}} B<br>t = %{{x}}<extra></extra>"))
        ref_t, ref_y = l0["t"], l0["reserved"]
        for kind, symbol, mcolor, size in (("growth", "diamond", color, 6), ("empty_cache", "triangle-down", "#222", 10),
                                           ("oom", "x", "#d62728", 13)):
            ms = [m for m in run["markers"] if m["kind"] == kind]
            if not ms:
                continue
            xs = np.array([m["t"] for m in ms], dtype=np.float64)
            full_t = run["t"]
            idx = np.clip(np.searchsorted(full_t, xs, side="right") - 1, 0, max(len(full_t) - 1, 0))
            ys = np.asarray(run["series"]["reserved"], dtype=np.float64)[idx] if len(full_t) else np.zeros(len(xs))
            fig.add_trace(go.Scatter(
                x=xs, y=ys, mode="markers", name=f"{run['label']}: {kind.replace('_', ' ')}",
                marker=dict(symbol=symbol, size=size, color=mcolor, line=dict(width=1, color="#fff")),
                text=[_marker_text(run, m) for m in ms], hovertemplate="%{text}<extra></extra>",
                visible=True if kind != "growth" else "legendonly", meta={"run": i, "markers": kind}))
        del ref_t, ref_y
    fig.update_layout(
        title=dict(text="Memory over time (click to choose the moment of the segment maps)", x=0.01),
        xaxis=dict(title="log event" if unit == "event" else "time (ms)"), yaxis=dict(title="bytes", tickformat="~s"),
        hovermode="closest", height=460, margin=dict(l=70, r=20, t=50, b=50),
        legend=dict(orientation="h", y=-0.18), template="plotly_white")
    return fig


def _segmap_figure(go, run_index):
    fig = go.Figure()
    fig.update_layout(
        barmode="overlay", height=420, margin=dict(l=170, r=20, t=40, b=40), template="plotly_white",
        title=dict(text="segment map", x=0.01), hovermode="closest", showlegend=True,
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
        xaxis=dict(title="offset in the segment (fraction of its size)", range=[0, 1]),
        yaxis=dict(autorange="reversed", type="category"))
    return fig


def _peak_table(runs):
    head = ("<tr><th>run</th><th>peak allocated</th><th>at</th><th>peak reserved</th><th>at</th>"
            "<th>reserved vs first run</th><th>allocated vs first run</th></tr>")
    rows = []
    r0 = runs[0]["peak"]
    for run in runs:
        p = run["peak"]
        unit = run["time_unit"]
        d_res = p["reserved"] - r0["reserved"]
        d_res_pct = f" ({100.0 * d_res / r0['reserved']:+.1f}%)" if r0["reserved"] else ""
        if p["allocated"] is not None and r0["allocated"] is not None:
            d_al = p["allocated"] - r0["allocated"]
            d_al_text = fmt_bytes(d_al) + (f" ({100.0 * d_al / r0['allocated']:+.1f}%)" if r0["allocated"] else "")
        else:
            d_al_text = "-"
        rows.append(
            f"<tr><td>{html.escape(run['label'])}</td><td class=n>{fmt_bytes(p['allocated'])}</td>"
            f"<td class=n>{_fmt_t(p['t'], unit) if p['allocated'] is not None else '-'}</td>"
            f"<td class=n>{fmt_bytes(p['reserved'])}</td><td class=n>{_fmt_t(p['t_reserved'], unit)}</td>"
            f"<td class=n>{fmt_bytes(d_res)}{d_res_pct}</td><td class=n>{d_al_text}</td></tr>")
    return f'<table class="peaks" id="peaks">{head}{"".join(rows)}</table>'


def _ahead_table(runs):
    """Host waiting vs running ahead (``run["ahead"]``: replay_async.compare's figures), one row per run and API."""
    head = ("<tr><th>run</th><th>api</th><th>peak reserved, waiting</th><th>peak reserved, ahead</th>"
            "<th>ahead / waiting</th><th>pages mapped / unmapped, waiting</th>"
            "<th>pages mapped / unmapped, ahead</th></tr>")
    rows = []
    for run in runs:
        res = run.get("ahead")
        if not res:
            continue
        for api in ("malloc", "pool"):
            if api not in res:
                continue
            w, a = res[api]["waiting"], res[api]["ahead"]
            rows.append(
                f"<tr><td>{html.escape(run['label'])}</td><td>{api}</td>"
                f"<td class=n>{fmt_bytes(w['peak_reserved'])}</td><td class=n>{fmt_bytes(a['peak_reserved'])}</td>"
                f"<td class=n>{res[api]['ratio']:.3f}</td><td class=n>{w['maps']} / {w['unmaps']}</td>"
                f"<td class=n>{a['maps']} / {a['unmaps']}</td></tr>")
    if not rows:
        return ""
    delay = next(r["ahead"]["delay_us"] for r in runs if r.get("ahead"))
    return (f'<h2>Host waiting vs running ahead</h2><div class="sub">each block written and read on its stream, '
            f'device lag {delay} us per operation; waiting: synchronize() after every event</div>'
            f'<table class="peaks" id="ahead">{head}{"".join(rows)}</table>')


def _sites_table(run, i):
    if not run["sites"]:
        return ""
    rows = []
    for s in run["sites"]:
        if s["stack"] >= 0:
            frames = run["stacks"][s["stack"]].split("\n")
            site = "<br>".join(html.escape(f) for f in frames[:4]) + (" ..." if len(frames) > 4 else "")
        else:
            site = f"<i>no Python stack recorded</i> (stream {html.escape(str(s['stream']))})"
        rows.append(f"<tr><td class=n>{fmt_bytes(s['bytes'])}</td><td class=n>{fmt_bytes(s['requested'])}</td>"
                    f"<td class=n>{s['blocks']}</td><td class=site>{site}</td></tr>")
    return (f'<h3>Top allocation sites at the peak ({_fmt_t(run["peak"]["t"], run["time_unit"])}, '
            f'{fmt_bytes(run["peak"]["allocated"])} allocated)</h3>'
            f'<table class="sites" id="sites-{i}"><tr><th>bytes</th><th>requested</th><th>blocks</th><th>site '
            f'(innermost frame first)</th></tr>{"".join(rows)}</table>')


_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px;color:#222}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:18px 0 6px} h3{font-size:14px;margin:12px 0 4px}
.sub{color:#666;font-size:13px} table{border-collapse:collapse;font-size:13px;margin:4px 0}
td,th{border:1px solid #ddd;padding:3px 8px;vertical-align:top} th{background:#f4f4f4} td.n{text-align:right}
td.site{font-family:ui-monospace,monospace;font-size:12px} .runs{display:flex;flex-wrap:wrap;gap:16px}
.run{flex:1 1 560px;min-width:480px} .caption{font-size:13px;color:#444;margin:4px 0} .note{color:#8a5a00;font-size:13px}
"""

# The page's own script: links the timeline to the segment maps and picks the timeline's level on zoom.
_SCRIPT = r"""
(function(){
document.body.dataset.scriptStartMs=performance.now().toFixed(0);   // the charts' own scripts ran before this
const D = JSON.parse(document.getElementById('prt-data').textContent);
function bytesOf(b){const s=atob(b);const u=new Uint8Array(s.length);for(let i=0;i<s.length;i++)u[i]=s.charCodeAt(i);
  return u.buffer;}
function f64(b){return new Float64Array(bytesOf(b));}
function f32(b){return new Float32Array(bytesOf(b));}
function fmtB(n){if(n==null||n<0)return '-';const a=Math.abs(n);
  for(const [u,k] of [['GiB',1073741824],['MiB',1048576],['KiB',1024]]) if(a>=k) return (n/k).toFixed(1)+' '+u;
  return n+' B';}
function fmtT(t,unit){if(t==null)return 'never';return unit==='event'?('event '+Math.round(t)):(t.toFixed(3)+' ms');}
function esc(s){return String(s).replace(/[&<>]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;'}[c]));}
const levels = D.runs.map(r => r.levels.map((l,j) => {const o={buckets:l.buckets,t:f64(l.t)};
  for(const k in l.series) o[k]=(j===0?f64:f32)(l.series[k]); return o;}));
const TL = document.getElementById('timeline');
function lowerBound(a,x){let lo=0,hi=a.length;while(lo<hi){const m=(lo+hi)>>1;if(a[m]<x)lo=m+1;else hi=m;}return lo;}
function pickLevels(x0,x1){
  const upd={x:[],y:[]}, idx=[];
  TL.data.forEach((tr,k)=>{ if(!tr.meta||tr.meta.series===undefined) return;
    const lv=levels[tr.meta.run]; let L=lv[0], a=0, b=L.t.length;
    if(x0!==null){ for(const cand of lv){ if(!(tr.meta.series in cand)) break; const i0=Math.max(0,lowerBound(cand.t,x0)-2),
          i1=Math.min(cand.t.length,lowerBound(cand.t,x1)+2); L=cand; a=i0; b=i1; if(i1-i0>=6000) break; } }
    upd.x.push(Array.from(L.t.subarray(a,b))); upd.y.push(Array.from(L[tr.meta.series].subarray(a,b))); idx.push(k); });
  if(idx.length) Plotly.restyle(TL, upd, idx);
}
let busy=false;
TL.on('plotly_relayout', ev => { if(busy) return;
  let x0=ev['xaxis.range[0]'], x1=ev['xaxis.range[1]'];
  if(ev['xaxis.range']){x0=ev['xaxis.range'][0];x1=ev['xaxis.range'][1];}
  if(ev['xaxis.autorange']){busy=true;pickLevels(null,null);busy=false;return;}
  if(x0===undefined) return; busy=true; pickLevels(+x0,+x1); busy=false; });

function segmapTraces(r, T){
  const S=r.segmap, B=S.blocks, unit=r.time_unit;
  let t=T;
  if(S.moments){ let best=S.moments[0]; for(const m of S.moments) if(Math.abs(m-T)<Math.abs(best-T)) best=m; t=best; }
  const live=[]; S.segments.forEach((s,i)=>{ if(s[3]<=t && (s[4]===null||t<s[4])) live.push(i); });
  let rows=live.slice(); let hidden=0;
  if(rows.length>D.maxRows){ rows.sort((a,b)=>S.segments[b][1]-S.segments[a][1]); hidden=rows.length-D.maxRows;
    rows=rows.slice(0,D.maxRows); }
  rows.sort((a,b)=>(BigInt(S.segments[a][0])<BigInt(S.segments[b][0])?-1:1));
  const label=i=>{const s=S.segments[i];return s[0]+' '+s[2]+' '+fmtB(s[1]);};
  const rowOf={}; rows.forEach(i=>rowOf[i]=true);
  const per={}; rows.forEach(i=>per[i]=[]);
  for(let k=0;k<B.size.length;k++){ const sg=B.seg[k]; if(!rowOf[sg]) continue;
    const ta=B.ta[k], tf=B.tf[k]; if(ta<=t && (tf===null||t<tf)) per[sg].push(k); }
  const A={x:[],base:[],y:[],hovertext:[],customdata:[]}, H={x:[],base:[],y:[],hovertext:[]}, U={x:[],base:[],y:[],hovertext:[]};
  let nb=0, nh=0;
  rows.forEach(i=>{ const s=S.segments[i], size=s[1], y=label(i);
    const bl=per[i].sort((a,b)=>B.off[a]-B.off[b]); let pos=0;
    const hole=(o,n)=>{ if(n<=0) return; H.x.push(n/size); H.base.push(o/size); H.y.push(y);
      H.hovertext.push('<b>free hole</b> '+fmtB(n)+'<br>segment '+s[0]+' ('+s[2]+' pool)<br>offset '+fmtB(o)); nh++; };
    for(const k of bl){ hole(B.off[k]-pos, B.off[k]-pos);
      A.x.push(B.size[k]/size); A.base.push(B.off[k]/size); A.y.push(y); A.customdata.push(k);
      const fr=B.stack[k]>=0 ? S.stacks[B.stack[k]].split('\n') : null;
      const st=fr ? fr.slice(0,8).map(esc).join('<br>')+(fr.length>8?'<br>(+'+(fr.length-8)+' outer frames)':'')
                  : 'no Python stack recorded';
      A.hovertext.push('<b>block</b> '+fmtB(B.size[k])+'<br>requested '+(B.req[k]>=0?fmtB(B.req[k]):'not recorded')+
        '<br>stream '+esc(B.stream[k])+'<br>allocated at '+fmtT(B.ta[k],unit)+'<br>freed at '+fmtT(B.tf[k],unit)+
        '<br>segment '+s[0]+' ('+s[2]+' pool)<br>stack:<br>'+st); nb++;
      pos=Math.max(pos,B.off[k]+B.size[k]); }
    hole(pos,size-pos);
    if(s[5]) for(const [o,n] of s[5]){ U.x.push(n/size); U.base.push(o/size); U.y.push(y);
      U.hovertext.push('<b>unmapped</b> '+fmtB(n)+' (at the snapshot\'s end)<br>segment '+s[0]); } });
  const bar=(d,name,color,op)=>Object.assign({type:'bar',orientation:'h',name:name,marker:{color:color,
    line:{width:0.5,color:'#fff'}},opacity:op,hovertemplate:'%{hovertext}<extra></extra>',width:0.8,
    textposition:'none'},d);
  const traces=[bar(A,'allocated block','#3b6fb6',1), bar(H,'free hole','#f2b134',1)];
  if(U.x.length) traces.push(bar(U,'unmapped pages','#9a9a9a',0.55));
  return {traces, t, nb, nh, nseg:live.length, hidden, rows:rows.length};
}
function showMoment(T){
  D.runs.forEach((r,i)=>{ if(!r.segmap) return;
    const div=document.getElementById('segmap-'+i); const res=segmapTraces(r,T);
    const h=Math.max(380, 90+26*res.rows);     // room for a hover label with a stack
    Plotly.react(div, res.traces, Object.assign({}, div.layout, {height:h,
      title:{text:'segment map at '+fmtT(res.t,r.time_unit),x:0.01}}));
    div.dataset.blocks=res.nb; div.dataset.holes=res.nh; div.dataset.moment=res.t;
    document.getElementById('caption-'+i).textContent = 'at '+fmtT(res.t,r.time_unit)+': '+res.nb+' blocks, '+
      res.nh+' holes in '+res.nseg+' segments'+(res.hidden?(' ('+res.hidden+' smaller segments not drawn)'):'')+
      (r.segmap.moments?' (a long input: the map is kept at '+r.segmap.moments.length+' moments; the nearest is shown)':'');
  });
  const shapes=[{type:'line',xref:'x',yref:'paper',x0:T,x1:T,y0:0,y1:1,line:{color:'#c23b22',width:1,dash:'dot'}}];
  busy=true; Plotly.relayout(TL,{shapes:shapes}); busy=false;
  document.body.dataset.moment=T;
}
TL.on('plotly_click', ev => { if(ev.points && ev.points.length) showMoment(+ev.points[0].x); });
window.prtShowMoment = showMoment;
showMoment(D.start);
document.body.dataset.readyMs=performance.now().toFixed(0);
document.body.dataset.ready='1';
})();
"""


def build_page(runs, title=None):
    """The :class:`Page` of ``runs`` (from :func:`paddle_rt.tools.view_data.load_source`)."""
    plotly, go = require_plotly()
    from paddle_rt.tools.view_levels import minmax_levels
    if not runs:
        raise ValueError("build_page: no runs")
    levels = [minmax_levels(r["t"], r["series"]) for r in runs]
    tl = _timeline(go, runs, levels)
    config = {"displaylogo": False, "responsive": True}
    parts = [tl.to_html(full_html=False, include_plotlyjs=True, div_id="timeline", config=config)]
    data_runs = []
    run_blocks = []
    for i, (run, lv) in enumerate(zip(runs, levels)):
        entry = {"label": run["label"], "time_unit": run["time_unit"],
                 "levels": [{"buckets": l["buckets"], "t": _b64(l["t"]),
                             "series": {k: _b64(l[k], np.float64 if j == 0 else np.float32)
                                        for k in run["series"] if k in l}} for j, l in enumerate(lv)],
                 "segmap": _segment_data(run) if run["segments"] else None}
        data_runs.append(entry)
        note = run.get("note")
        body = [f'<div class="run" id="run-{i}"><h2 style="color:{RUN_COLORS[i % len(RUN_COLORS)]}">'
                f'{html.escape(run["label"])}</h2>'
                f'<div class="sub">{html.escape(str(run["source"]))} ({html.escape(str(run["kind"]))}, '
                f'{run["events"]:,} events)</div>']
        if note:
            body.append(f'<div class="note">{html.escape(note)}</div>')
        if entry["segmap"] is not None:
            body.append(f'<div class="caption" id="caption-{i}"></div>')
            body.append(_segmap_figure(go, i).to_html(full_html=False, include_plotlyjs=False,
                                                      div_id=f"segmap-{i}", config=config))
        body.append(_sites_table(run, i))
        body.append("</div>")
        run_blocks.append("".join(body))
    data = {"runs": data_runs, "maxRows": MAX_SEGMENT_ROWS, "start": runs[0]["peak"]["t"]}
    title = title or "paddle_rt memory view: " + ", ".join(r["label"] for r in runs)
    reduced = any(lv[0]["buckets"] for lv in levels)
    how = ("" if not reduced else
           '<div class="sub">Long timelines are drawn as the minimum and maximum of each bucket of events (peaks are '
           'kept); zooming in swaps in a finer level.</div>')
    doc = (
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f'<div class="sub">paddle_rt {_version()} · plotly {plotly.__version__} · a self-contained page (works '
        f'offline)</div>{how}'
        + parts[0]
        + "<h2>Peaks</h2>" + _peak_table(runs) + _ahead_table(runs)
        + '<div class="runs">' + "".join(run_blocks) + "</div>"
        + '<script type="application/json" id="prt-data">' + json.dumps(data, separators=(",", ":")).replace(
            "</", "<\\/") + "</script>"
        + f"<script>{_SCRIPT}</script></body></html>")
    return Page(doc, runs)


def _version():
    try:
        from importlib.metadata import version
        return version("paddle_rt")
    except Exception:
        return ""
