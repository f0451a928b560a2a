"""A run report (schema ``fsdp-conformance/run/1``) as one self-contained HTML page.

Rules:
- Self-contained: CSS inline, plots inline as ``data:image/png;base64`` (matplotlib, Agg,
  no pyplot state), no scripts, no fonts or images fetched from anywhere; the only
  ``href`` values are the upstream issue links of known limitations (links to follow, never
  resources the page loads).
- Every text taken from the report (ids, details, reasons, links) is HTML-escaped; a
  failure's detail is shown in full in a ``<pre>``.
- Same report dict -> same bytes (plots rendered with matplotlib's default style and no
  PNG metadata beyond the format's own).
- A report without ``measurements`` / ``scaling`` (P13/P14 not measured) renders without
  the plots and says so.
"""
from __future__ import annotations

import base64
import html
import io
import re
from collections import defaultdict
from typing import Any

from ..properties.verdict import STATUSES
from .run_report import (FIXED_UPSTREAM, LEGEND, SYMBOLS, failures, headline,
                         known_limitations, machine_line, rerun_command, summary_rows,
                         verdict_lines)

PHASES = ("save", "load")
_URL = re.compile(r"https?://[^\s<>\"']+")
PAGE_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:1200px;
padding:0 1em;color:#222;line-height:1.4}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
.verdict{font-weight:bold;padding:.4em .8em;border-radius:4px;display:inline-block}
.ok{background:#e3f6e3;color:#135e13}.failed{background:#fde4e4;color:#9b1111}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}
.s-pass{color:#1b7a1b}.s-fail,.s-error{color:#c01010;font-weight:bold}
.s-known{color:#a06800}.s-na{color:#888}
pre{background:#f6f6f6;border:1px solid #e0e0e0;padding:.6em;overflow-x:auto;font-size:.85em;
white-space:pre-wrap;word-break:break-word}
code{background:#f3f3f3;padding:0 .2em}
.failure{border-left:4px solid #c01010;padding-left:.8em;margin:1em 0}
.legend,.note{color:#666;font-size:.85em}
img{max-width:100%;border:1px solid #eee;margin:.4em 0}
"""


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _linkify(text: str) -> str:
    """Escape ``text`` and turn every http(s) URL in it into a link (trailing punctuation
    kept outside the link)."""
    out, pos = [], 0
    for m in _URL.finditer(text):
        url = m.group(0).rstrip(".,;:)")
        out.append(esc(text[pos:m.start()]))
        out.append(f'<a href="{esc(url)}">{esc(url)}</a>')
        pos = m.start() + len(url)
    out.append(esc(text[pos:]))
    return "".join(out)


def _status_class(status: str) -> str:
    return "s-na" if status == "n/a" else f"s-{status}"


def _matrix(report: dict) -> str:
    header, rows = summary_rows(report)
    by_path = report["summary"]["by_path"]
    from ..properties.catalogue import CATALOGUE

    names = {p.id: p.name for p in CATALOGUE}
    out = ["<table class='matrix'><tr>" + "".join(
        f"<th>{esc(h)}<br><small>{esc(names[h])}</small></th>" if h in names
        else f"<th>{esc(h)}</th>" for h in header) + "</tr>"]
    for api, ncases, *_ in rows:
        cells = [f"<td>{esc(api)}</td>", f"<td>{esc(ncases)}</td>"]
        for p in header[2:]:
            counts = by_path[api].get(p, {})
            cells.append("<td>" + " ".join(
                f"<span class='{_status_class(s)}'>{counts[s]}{esc(SYMBOLS[s])}</span>"
                for s in STATUSES if counts.get(s)) + "</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _failures(report: dict) -> list[str]:
    fails = failures(report)
    out = [f"<h2>Failures ({len(fails)})</h2>"]
    if not fails:
        out.append("<p>None.</p>")
    for cid, p, v in fails:
        out += [f"<div class='failure'><h3><code>{esc(cid)}</code> {esc(p)}: "
                f"<span class='{_status_class(v['status'])}'>{esc(v['status'])}</span></h3>",
                f"<pre>{esc(v.get('detail', ''))}</pre>",
                f"<p>Rerun: <code>{esc(rerun_command(cid))}</code></p></div>"]
    return out


def _known(report: dict) -> list[str]:
    out = ["<h2>Known torch limitations</h2>"]
    rows = known_limitations(report)
    if not rows:
        return out + ["<p>None seen in this run.</p>"]
    out.append("<ul>")
    for key, n, props, k in rows:
        item = (f"<li><strong>{esc(key)}</strong>: {n} case{'s' if n != 1 else ''} "
                f"({esc(', '.join(props))})")
        if k is None:
            item += "<br>(no longer recorded in fsdp_conformance/known/entries.py)"
        else:
            item += (f"<br>torch {esc(k.torch_versions)}: {esc(k.reason)}"
                     f"<br>Upstream: {_linkify(k.upstream)}")
        out.append(item + "</li>")
    out.append("</ul>")
    fixed = report["summary"]["fixed_upstream"]
    out.append(f"<h2>Fixed upstream? ({len(fixed)})</h2>")
    if not fixed:
        return out + ["<p>None.</p>"]
    out.append(f"<p>These pass although a known limitation is recorded for them: "
               f"{esc(FIXED_UPSTREAM)}.</p><ul>")
    out += [f"<li><code>{esc(cid)}</code> {esc(p)}: {esc(key)}</li>" for cid, p, key in fixed]
    return out + ["</ul>"]


# --- measurements --------------------------------------------------------------------------

def measured(report: dict) -> dict[str, list[tuple[str, int, dict]]]:
    """{api path: [(phase, world size, measurement)]} over every case with measurements,
    in case order (the world size is the measurement's own, else the phase's side)."""
    out: dict[str, list[tuple[str, int, dict]]] = defaultdict(list)
    for c in report["cases"]:
        for phase in PHASES:
            m = (c.get("measurements") or {}).get(phase)
            if m:
                ws = m.get("world_size") or (c.get("world_size") if phase == "save"
                                             else c.get("load_world_size") or c.get("world_size"))
                out[c["api"]].append((phase, int(ws or 0), m))
    return dict(sorted(out.items()))


def png_img(fig) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _time_plot(api: str, entries: list[tuple[str, int, dict]], scaling: dict) -> str:
    """Per phase: every case's time, floor and bound against world size (log scale), and
    the series the scaling exponent was fitted to (in the colour of its clock: CPU work or
    wall time) when the report has one."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    fig = Figure(figsize=(10, 3.6))
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.14, top=0.9, wspace=0.2)
    for i, phase in enumerate(PHASES):
        ax = fig.add_subplot(1, 2, i + 1)
        pts = [(ws, m) for ph, ws, m in entries if ph == phase]
        for key, label, marker, color in (("cpu_s", "work, CPU (judged)", "s", "C1"),
                                          ("work_bound_s", "P13 work bound", "_", "C1"),
                                          ("time_s", "wall time (min over repeats)", "o", "C0"),
                                          ("floor_s", "floor, wall time", "v", "C2"),
                                          ("time_bound_s", "P13 wall-time bound", "_", "C3")):
            xy = [(ws, m[key] * 1e3) for ws, m in pts if isinstance(m.get(key), (int, float))]
            if xy:
                ax.scatter([x for x, _ in xy], [y for _, y in xy], marker=marker, color=color,
                           s=60 if marker == "_" else 18, label=label, alpha=0.8)
        s = scaling.get(f"{api}/{phase}")
        if s and s.get("world_sizes"):
            # the series the exponent was fitted to, in the colour of its clock: CPU work
            # (C1, what P13's work bound and the scaling check judge) or wall time (C0)
            cpu = s.get("clock") == "cpu"
            what, color = ("work (CPU)", "C1") if cpu else ("wall time", "C0")
            allowed = s.get("allowed_exponent")
            failed = s.get("status") == "fail"
            judged = (f" {'>' if failed else '<='} allowed {allowed:.2f}"
                      if isinstance(allowed, (int, float)) else "") + (" (FAIL)" if failed else "")
            ax.plot(s["world_sizes"], [t * 1e3 for t in s.get("times_s", [])], color=color,
                    label=f"{what} scaling: ws^{s.get('exponent', float('nan')):.2f}{judged}")
            if s.get("floor_times_s"):
                ax.plot(s["world_sizes"], [t * 1e3 for t in s["floor_times_s"]], color="C2",
                        linestyle="--", label=f"floor {what}: "
                                              f"ws^{s.get('floor_exponent', float('nan')):.2f}")
        ax.set_title(f"{api} {phase}")
        ax.set_xlabel("world size")
        ax.set_ylabel("ms")
        if pts:
            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_xticks(sorted({ws for ws, _ in pts}))
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
    return png_img(fig)


def _memory_plot(api: str, entries: list[tuple[str, int, dict]]) -> str | None:
    """Per phase: every case's peak memory per rank (MiB) against its P14 bound."""
    from matplotlib.figure import Figure

    if not any(m.get("peak_bytes") for _, _, m in entries):
        return None
    fig = Figure(figsize=(10, 3.4))
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.15, top=0.9, wspace=0.2)
    for i, phase in enumerate(PHASES):
        ax = fig.add_subplot(1, 2, i + 1)
        peaks, bounds = [], []
        for ph, _, m in entries:
            if ph != phase:
                continue
            peaks += [(r, b / 2**20) for r, b in enumerate(m.get("peak_bytes") or [])]
            bounds += [(r, b / 2**20) for r, b in enumerate(m.get("mem_bound_bytes") or [])]
        if peaks:
            ax.scatter([r for r, _ in peaks], [b for _, b in peaks], s=18, color="C0",
                       label="peak above start", alpha=0.8)
        if bounds:
            ax.scatter([r for r, _ in bounds], [b for _, b in bounds], marker="_", s=200,
                       color="C3", label="P14 bound")
        ax.set_title(f"{api} {phase}: peak memory per rank")
        ax.set_xlabel("rank")
        ax.set_ylabel("MiB")
        if peaks or bounds:
            ax.set_xticks(sorted({r for r, _ in peaks + bounds}))
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
    return png_img(fig)


def _worst(entries: list[tuple[str, int, dict]], phase: str) -> tuple[int, str, str, str]:
    """(cases, worst work/bound, worst time/bound, worst peak/bound) of one path's phase, as
    text: the work (CPU time) is P13's sharp verdict, the wall time its coarse net."""
    ms = [m for ph, _, m in entries if ph == phase]

    def worst(value: str, bound: str) -> str:
        r = [m[value] / m[bound] for m in ms
             if m.get(bound) and isinstance(m.get(value), (int, float))]
        return f"{max(r):.2f}" if r else ""
    mb = [p / b for m in ms for p, b in zip(m.get("peak_bytes") or [], m.get("mem_bound_bytes") or [])
          if b]
    return (len(ms), worst("cpu_s", "work_bound_s"), worst("time_s", "time_bound_s"),
            f"{max(mb):.2f}" if mb else "")


def _timing(report: dict) -> list[str]:
    out = ["<h2>Timing and memory (P13, P14)</h2>"]
    by_api = measured(report)
    scaling = report.get("scaling") or {}
    if not by_api and not scaling:
        return out + ["<p class='note'>No timing or memory measurements in this report "
                      "(P13/P14 were not measured by this run).</p>"]
    import matplotlib.style

    out += ["<table><tr><th>path</th><th>phase</th><th>cases measured</th>"
            "<th>worst work (CPU) / P13 work bound</th><th>worst wall time / P13 time bound"
            "</th><th>worst peak / P14 bound</th></tr>"]
    for api, entries in by_api.items():
        for phase in PHASES:
            n, wb, tb, mb = _worst(entries, phase)
            if n:
                out.append(f"<tr><td>{esc(api)}</td><td>{phase}</td><td>{n}</td><td>{wb}</td>"
                           f"<td>{tb}</td><td>{mb}</td></tr>")
    out.append("</table><p class='note'>A value above 1 exceeds its bound. P13 judges the work "
               "(CPU time) against the sharp bound and the wall time against a coarse one; "
               "the plots show both.</p>")
    if scaling:
        out += ["<h3>Scaling with world size</h3><table><tr><th>path/phase</th><th>world sizes"
                "</th><th>exponent</th><th>floor exponent</th><th>status</th><th>detail</th></tr>"]
        for key, s in sorted(scaling.items()):
            out.append(f"<tr><td>{esc(key)}</td><td>{esc(s.get('world_sizes', ''))}</td>"
                       f"<td>{s.get('exponent', float('nan')):.2f}</td>"
                       f"<td>{s.get('floor_exponent', float('nan')):.2f}</td>"
                       f"<td class='{_status_class(str(s.get('status', '')))}'>"
                       f"{esc(s.get('status', ''))}</td><td>{esc(s.get('detail', ''))}</td></tr>")
        out.append("</table>")
    apis = sorted(set(by_api) | {k.rsplit("/", 1)[0] for k in scaling})
    with matplotlib.style.context("default"):
        for api in apis:
            entries = by_api.get(api, [])
            out.append(f"<h3>{esc(api)}</h3>")
            out.append(f'<img src="{_time_plot(api, entries, scaling)}" '
                       f'alt="{esc(api)}: time against world size">')
            mem = _memory_plot(api, entries)
            if mem:
                out.append(f'<img src="{mem}" alt="{esc(api)}: peak memory per rank">')
    return out


def render_html(report: dict) -> str:
    """The whole page (module docstring's rules): headline and run facts, the matrix,
    failures with their full details and rerun commands, known limitations with upstream
    links, fixed upstream?, timing and memory plots, tolerances."""
    title = (f"fsdp-conformance run: torch {report['torch_version']}, {report['backend']}, "
             f"tier {report['tier']}")
    out = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
           f"<title>{esc(title)}</title><style>{PAGE_CSS}</style></head><body>",
           f"<h1>{esc(title)}</h1>",
           f"<p class='verdict {'ok' if report['ok'] else 'failed'}'>{esc(headline(report))}</p>",
           "<ul>", *(f"<li><b>{esc(line)}</b></li>" for line in verdict_lines(report)),
           f"<li>wall time: {report['wall_time_s']:.1f} s ({esc(report['started'])} -&gt; "
           f"{esc(report['finished'])})</li>",
           f"<li>machine: {esc(machine_line(report))}</li>",
           f"<li>world sizes: {esc(', '.join(map(str, report['world_sizes'])))}; seed "
           f"{esc(report['seed'])}</li>",
           f"<li>selection: {esc(report['selection'] or 'all cases of the tier')}</li>",
           f"<li>command: <code>{esc(' '.join(report['argv']))}</code></li>", "</ul>",
           "<h2>Matrix</h2>", _matrix(report), f"<p class='legend'>Legend: {esc(LEGEND)}.</p>"]
    out += _failures(report)
    out += _known(report)
    out += _timing(report)
    tol = report.get("tolerances") or {}
    out.append("<h2>Tolerances</h2>")
    if tol:
        out.append("<table><tr><th>dtype</th><th>rtol</th><th>atol</th></tr>" + "".join(
            f"<tr><td>{esc(d)}</td><td>{esc(t.get('rtol', ''))}</td><td>{esc(t.get('atol', ''))}</td></tr>"
            for d, t in tol.items()) + "</table>")
    else:
        out.append("<p>None stated for this run.</p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"

