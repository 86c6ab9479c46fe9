"""`deferfuse_torch.report(path, fn, *args)`: one self-contained HTML page for a step: the
summary, the timeline (drawn as SVG from the trace), the region table, and each region's
graph (Graphviz DOT rendered to SVG when `dot` is installed, else the DOT source with a note
saying so). Nothing is loaded from the network."""

import html
import re
import shutil
import subprocess

from .observe import explain

# Colours of the timeline's kinds of events (the Chromium test looks for them in a screenshot).
COLOURS = {"flush": "#6a8fd8", "plan": "#9bc1ef", "compile": "#e07b39", "run": "#4caf50",
           "wave": "#a5d6a7", "copy": "#b39ddb", "wait": "#d0d0d0", "mark": "#d32f2f"}

_WIDTH = 1100
_ROW = 22
_LABEL = 170


def report(path, fn, *args, **kwargs):
    """Runs `fn(*args, **kwargs)` once under `explain` and writes the page to `path`; returns
    the `Report` (fn's return value is `report.result`)."""
    r = explain(fn, *args, **kwargs)
    with open(path, "w") as f:
        f.write(to_html(r))
    return r


def _e(x):
    return html.escape(str(x))


def _timeline_svg(timeline):
    events = [e for e in timeline["traceEvents"] if e.get("ph") in ("X", "i")]
    names = {e["tid"]: e["args"]["name"] for e in timeline["traceEvents"]
             if e.get("name") == "thread_name"}
    if not events:
        return "<p>No events were recorded.</p>"
    tids = sorted({e["tid"] for e in events})
    row = {t: k for k, t in enumerate(tids)}
    t0 = min(e["ts"] for e in events)
    t1 = max(e["ts"] + e.get("dur", 0) for e in events)
    scale = (_WIDTH - _LABEL) / max(t1 - t0, 1e-3)
    h = _ROW * len(tids) + 24
    out = [f'<svg class="timeline" width="{_WIDTH}" height="{h}" '
           f'xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="11">',
           '<rect width="100%" height="100%" fill="white"/>']
    for t in tids:
        y = row[t] * _ROW
        out.append(f'<text x="2" y="{y + 15}">{_e(names.get(t, t))}</text>'
                   f'<line x1="{_LABEL}" x2="{_WIDTH}" y1="{y + _ROW}" y2="{y + _ROW}" '
                   'stroke="#eee"/>')
    for e in events:
        x = _LABEL + (e["ts"] - t0) * scale
        y = row[e["tid"]] * _ROW + 3
        tip = _e(f'{e["name"]} ({e.get("dur", 0):.1f} us) '
                 + ", ".join(f"{k}={v}" for k, v in e.get("args", {}).items()))
        colour = COLOURS.get(e.get("cat"), "#999")
        if e["ph"] == "X":
            w = max(e["dur"] * scale, 0.5)
            out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{_ROW - 6}" '
                       f'fill="{colour}"><title>{tip}</title></rect>')
        else:
            out.append(f'<rect x="{x - 1:.2f}" y="{y}" width="2" height="{_ROW - 6}" '
                       f'fill="{colour}"><title>{tip}</title></rect>')
    out.append(f'<text x="{_LABEL}" y="{h - 6}">0 us</text>'
               f'<text x="{_WIDTH - 90}" y="{h - 6}">{t1 - t0:.0f} us</text></svg>')
    return "\n".join(out)


def _graph(region):
    dot = region.get("dot")
    if not dot:
        return f'<pre>{_e(region.get("text", ""))}</pre>'
    exe = shutil.which("dot")
    if exe:
        r = subprocess.run([exe, "-Tsvg"], input=dot, capture_output=True, text=True)
        if r.returncode == 0:
            return re.sub(r"^.*?(<svg)", r"\1", r.stdout, flags=re.S)
        return (f'<p class="note">graphviz `dot` failed: {_e(r.stderr)}; the DOT source:</p>'
                f"<pre>{_e(dot)}</pre>")
    return ('<p class="note">Graphviz <code>dot</code> is not installed, so the graph is not '
            "drawn (install graphviz, e.g. <code>apt-get install graphviz</code>, and run the "
            "report again); its DOT source:</p>"
            f"<pre>{_e(dot)}</pre>")


def to_html(r):
    """The page for a `Report`."""
    rows = "".join(
        f'<tr><td><a href="#r{x["fingerprint"]}">{_e(x["label"])}</a></td><td>{x["runs"]}</td>'
        f'<td>{x["ms"]:.3f}</td><td>{x["bytes"]}</td><td>{_e(x["shapes"])}</td></tr>'
        for x in r.regions)
    graphs = "".join(
        f'<section id="r{x["fingerprint"]}"><h3>{_e(x["label"])}</h3>'
        f'<p class="fp">{x["fingerprint"]}</p>{_graph(x)}</section>'
        for x in r.regions)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>deferfuse step report</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 2px 6px; }}
pre {{ background: #f6f6f6; padding: 6px; overflow-x: auto; }}
.note {{ color: #8a4b00; }} .fp {{ color: #777; font-family: monospace; }}
</style></head><body>
<h1>deferfuse step report</h1>
<h2 id="summary">Summary</h2>
<pre>{_e(str(r))}</pre>
<h2 id="timeline">Timeline</h2>
<p>One row per track: each stream's host work (flushes, plan lookups, compiles, waits), its
programs, CPU workers running programs side by side. Hover for details; the trace JSON opens
in ui.perfetto.dev for zooming.</p>
{_timeline_svg(r.timeline)}
<h2 id="regions">Regions</h2>
<table><tr><th>region</th><th>runs</th><th>ms</th><th>bytes</th><th>shapes (in -&gt; out)</th></tr>
{rows}</table>
<h2 id="graphs">Region graphs</h2>
{graphs}
</body></html>
"""
