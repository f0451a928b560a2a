"""The summary of a scaling benchmark report: its size labels and its final table (the
terminal's, the HTML page's). Shared by bench/scaling.py and bench/plots.py."""
from __future__ import annotations

from pathlib import Path


def size_label(n: int) -> str:
    """``10**7`` -> "1e7", ``250000`` -> "25e4", ``123`` -> "123" (exact, no rounding)."""
    k = 0
    while n and n % 10 == 0:
        n //= 10
        k += 1
    return f"{n}e{k}" if k else str(n)


def _ms(s: float | None) -> str:
    if s is None:
        return ""
    return f"{s * 1e3:.2f} ms" if s < 10 else f"{s:.2f} s"


def _mib(b: float) -> str:
    return f"{b / 2**20:.1f}"


def _exp(k: float | None) -> str:
    return "" if k is None else f"{k:+.2f}"


def summary_rows(report: dict) -> list[list[str]]:
    """Per path/phase: the largest case (size, then world size) with time, floor, ratio,
    peak MiB on rank 0 and the largest on the other ranks, and both fits' exponents
    beside their floors'. Also the fields of the final table and the HTML page."""
    rows = []
    by_group: dict[str, list[dict]] = {}
    for b in report["benchmarks"]:
        by_group.setdefault(b["group"], []).append(b)
    for group, s in report["scaling"].items():
        bs = by_group.get(group, [])
        if not bs:
            continue
        big = max(bs, key=lambda b: (b["extra_info"]["state_elements"], b["extra_info"]["world_size"]))
        e = big["extra_info"]
        peaks = e["peak_bytes"]
        ss, ws = s["state_size"], s["world_size"]
        rows.append([group, f"{size_label(e['state_elements'])} ws{e['world_size']}",
                     _ms(big["stats"]["min"]), _ms(e["floor_min_s"]),
                     "" if e["ratio"] is None else f"{e['ratio']:.1f}",
                     _mib(peaks[0]), _mib(max(peaks[1:])) if len(peaks) > 1 else "",
                     f"{_exp(ss['exponent'])} ({_exp(ss['floor_exponent'])})",
                     f"{_exp(ws['exponent'])} ({_exp(ws['floor_exponent'])})"])
    return rows


SUMMARY_HEADER = ("path/phase", "largest case", "time (min)", "floor", "x floor",
                  "peak MiB r0", "peak MiB others", "size exp (floor)", "ws exp (floor)")


def print_summary(report: dict, files: dict[str, Path], console=None) -> None:
    """The final table on stdout, then failures and the files written."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=160)
    table = Table(title=f"bench scaling: {len(report['benchmarks'])} benchmarks, "
                        f"{len(report['failed'])} failed, {report['wall_time_s']:.0f} s")
    for col in SUMMARY_HEADER:
        table.add_column(col, justify="left" if col == "path/phase" else "right")
    for row in summary_rows(report):
        table.add_row(*row)
    console.print(table)
    for f in report["failed"]:
        console.print(f"[red]FAILED[/red] {f['name']}: {f['error'].splitlines()[0]}")
    for path in files.values():
        console.print(f"wrote {path}")
