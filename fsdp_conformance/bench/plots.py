"""Plots and the HTML page of a scaling benchmark report (bench/scaling.py).

Rules:
- Three PNGs, one panel per API path, each path drawn against its floor (same colour,
  dashed): time against state bytes (log-log, at the world size of the path's size fit),
  time against world size (log y, at the size of its world-size fit), and peak memory per
  rank of the path's largest case, beside the full state and one rank's shard (dashed).
- matplotlib's Agg canvas and default style, no pyplot state, no PNG metadata beyond the
  format's own: the same report gives the same bytes (report/html.py's ``png_img``).
- The HTML page is self-contained (report/html.py's CSS, PNGs inlined as base64, no
  scripts, nothing fetched) and every text from the report is escaped.
"""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, Callable

from ..report.html import PAGE_CSS, esc, png_img
from ..report.io import write_bytes_atomic, write_text_atomic
from ..report.run_report import machine_line

PHASE_COLORS = {"save": "C0", "load": "C1"}


def _panels(report: dict, title: str, height: float = 3.0):
    """A figure with one axes per path of the report's grid (4 per row), the paths."""
    from matplotlib.figure import Figure

    paths = report["grid"]["paths"] or ["(none)"]
    cols = min(4, len(paths))
    rows = -(-len(paths) // cols)
    fig = Figure(figsize=(4 * cols, height * rows + 0.4), layout="constrained")
    fig.suptitle(title)
    return fig, [(p, fig.add_subplot(rows, cols, i + 1)) for i, p in enumerate(paths)]


def _empty(ax, text: str = "not measured") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def _time_plot(report: dict, fit: str, title: str, xlabel: str, xs: Callable[[dict], list],
               label: Callable[[dict], str], log_x: bool) -> bytes:
    """Per path, the ``fit`` entry ("state_size" / "world_size") of each phase of the
    report's scaling block: time and floor (dashed) against ``xs(entry)``, log y."""
    from matplotlib.ticker import NullFormatter

    fig, axes = _panels(report, title)
    for path, ax in axes:
        drawn = False
        for phase, color in PHASE_COLORS.items():
            s = (report["scaling"].get(f"{path}/{phase}") or {}).get(fit) or {}
            if not s.get("times_s"):
                continue
            x = xs(s)
            ax.plot(x, [t * 1e3 for t in s["times_s"]], "o-", color=color, ms=4,
                    label=f"{phase} {label(s)} (k={_k(s['exponent'])})")
            ax.plot(x, [t * 1e3 for t in s["floor_times_s"]], "--", color=color, alpha=0.7,
                    label=f"{phase} floor (k={_k(s['floor_exponent'])})")
            if not log_x:
                ax.set_xticks(x)
            drawn = True
        ax.set_title(path, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("ms")
        if not drawn:
            _empty(ax, f"no {fit.replace('_', ' ')} fit")
            continue
        if log_x:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=6)
    return _png_bytes(fig)


def time_vs_bytes(report: dict) -> bytes:
    """PNG: per path, time (min over repeats) and floor against state bytes, log-log, at
    the world size of the path's size fit."""
    return _time_plot(report, "state_size", "time vs optimizer state size (floor dashed)",
                      "state MB", lambda s: [b / 1e6 for b in s["state_bytes"]],
                      lambda s: f"ws{s['world_size']}", log_x=True)


def time_vs_world_size(report: dict) -> bytes:
    """PNG: per path, time and floor against world size (log y), at the size of the
    path's world-size fit."""
    return _time_plot(report, "world_size", "time vs world size (floor dashed)", "world size",
                      lambda s: s["world_sizes"], lambda s: _size(s["state_elements"]),
                      log_x=False)


def largest(report: dict, path: str) -> dict | None:
    """``extra_info`` of each phase of ``path``'s largest case (size, then world size):
    {phase: extra_info}, or None when the path has no benchmark."""
    bs = [b for b in report["benchmarks"] if b["extra_info"]["path"] == path]
    if not bs:
        return None
    key = max((b["extra_info"]["state_elements"], b["extra_info"]["world_size"]) for b in bs)
    return {b["extra_info"]["phase"]: b["extra_info"] for b in bs
            if (b["extra_info"]["state_elements"], b["extra_info"]["world_size"]) == key}


def peak_memory(report: dict) -> bytes:
    """PNG: per path, peak memory per rank (save and load bars) of its largest case, with
    the full state and one shard as dashed references."""
    fig, axes = _panels(report, "peak memory per rank, largest case (full state and one "
                                "shard dashed)", height=2.8)
    for path, ax in axes:
        big = largest(report, path)
        ax.set_title(path, fontsize=10)
        if not big:
            _empty(ax)
            continue
        e = next(iter(big.values()))
        ws = e["world_size"]
        width = 0.38
        for i, (phase, color) in enumerate(PHASE_COLORS.items()):
            if phase in big:
                peaks = big[phase]["peak_bytes"]
                ax.bar([r + (i - 0.5) * width for r in range(len(peaks))],
                       [p / 2**20 for p in peaks], width, color=color, label=phase)
        ax.axhline(e["state_bytes"] / 2**20, color="C3", linestyle="--", lw=1, label="full state")
        ax.axhline(e["state_bytes"] / ws / 2**20, color="C2", linestyle="--", lw=1,
                   label="one shard")
        ax.set_xticks(range(ws))
        ax.set_xlabel(f"rank ({_size(e['state_elements'])} elements, ws{ws})")
        ax.set_ylabel("MiB")
        ax.legend(fontsize=6)
    return _png_bytes(fig)


def _png_bytes(fig) -> bytes:
    return base64.b64decode(png_img(fig).split(",", 1)[1])


def _k(k: float | None) -> str:
    return "n/a" if k is None else f"{k:.2f}"


def _size(n: int) -> str:
    from .summary import size_label

    return size_label(n)


PLOTS = (("time_vs_bytes", time_vs_bytes, "time against state bytes"),
         ("time_vs_world_size", time_vs_world_size, "time against world size"),
         ("peak_memory", peak_memory, "peak memory per rank"))


def _table(header: Any, rows: list[list[str]]) -> str:
    out = ["<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows]
    return "\n".join(out + ["</table>"])


def _benchmark_rows(report: dict) -> list[list[str]]:
    rows = []
    for b in report["benchmarks"]:
        s, e = b["stats"], b["extra_info"]
        rows.append([b["name"], f"{s['min'] * 1e3:.3f}", f"{s['median'] * 1e3:.3f}",
                     str(s["rounds"]), f"{e['floor_min_s'] * 1e3:.3f}",
                     "" if e["ratio"] is None else f"{e['ratio']:.2f}",
                     "" if e["gbps"] is None else f"{e['gbps']:.3f}",
                     f"{e['state_bytes'] / 1e6:.2f}",
                     " / ".join(f"{p / 2**20:.1f}" for p in e["peak_bytes"]), e["floor"]])
    return rows


def render_html(report: dict, pngs: dict[str, bytes]) -> str:
    """The page: facts, the summary table, failures, the three plots, every benchmark."""
    from .summary import SUMMARY_HEADER, summary_rows

    m = report.get("machine_info") or {}
    commit = report.get("commit_info") or {}
    title = f"fsdp-conformance bench scaling: torch {m.get('torch_version', '?')}"
    nfail = len(report["failed"])
    out = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
           f"<title>{esc(title)}</title><style>{PAGE_CSS}</style></head><body>",
           f"<h1>{esc(title)}</h1>",
           f"<p class='verdict {'failed' if nfail else 'ok'}'>{len(report['benchmarks'])} "
           f"benchmarks, {nfail} failed</p>", "<ul>",
           f"<li>machine: {esc(machine_line(report))}</li>",
           f"<li>commit: <code>{esc(commit.get('id'))}</code>"
           f"{' (dirty)' if commit.get('dirty') else ''}; {esc(report['datetime'])}</li>",
           f"<li>backend {esc(report['backend'])}; {'quick' if report['quick'] else 'full'} grid "
           f"of {len(report['grid']['cases'])} cases; wall time {report['wall_time_s']:.0f} s</li>",
           "</ul>",
           "<h2>Summary</h2>",
           "<p class='note'>Per path and phase: its largest case against its floor (the raw "
           "collective(s) and copy of the same bytes, same run), the peak resident memory "
           "above the start of the call on rank 0 and the largest on the other ranks, and the "
           "fitted exponents k (time ~ x<sup>k</sup>) against state size and world size, "
           "each beside its floor's.</p>",
           _table(SUMMARY_HEADER, summary_rows(report))]
    if nfail:
        out.append(f"<h2>Failed ({nfail})</h2>")
        out += [f"<h3><code>{esc(f['name'])}</code></h3><pre>{esc(f['error'])}</pre>"
                for f in report["failed"]]
    out.append("<h2>Plots</h2>")
    for key, _, alt in PLOTS:
        if key in pngs:
            uri = "data:image/png;base64," + base64.b64encode(pngs[key]).decode("ascii")
            out.append(f'<img src="{uri}" alt="{esc(alt)}">')
    out += ["<h2>Every benchmark</h2>",
            _table(("name", "min ms", "median ms", "rounds", "floor ms", "x floor", "GB/s",
                    "state MB", "peak MiB per rank", "floor"), _benchmark_rows(report)),
            "</body></html>"]
    return "\n".join(out) + "\n"


def write_plots_and_html(report: dict, paths: dict[str, Path]) -> dict[str, Path]:
    """Render the PNGs and the page to ``paths`` (keys of ``PLOTS`` and "html"),
    atomically; returns what was written."""
    import matplotlib.style

    with matplotlib.style.context("default"):
        pngs = {key: fn(report) for key, fn, _ in PLOTS}
    written = {key: write_bytes_atomic(paths[key], data) for key, data in pngs.items()}
    written["html"] = write_text_atomic(paths["html"], render_html(report, pngs))
    return written
