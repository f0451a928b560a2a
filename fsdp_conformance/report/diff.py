"""Compare two reports of the same kind, BASE and NEW (``fsdp-conformance compare``): what
changed, and whether any of it is a regression. This is what gates a torch upgrade: BASE is
the current torch's report, NEW the candidate's; different torch versions, backends, tiers
and machines are expected and named in the header, never refused.

Two kinds are compared: run reports (schema ``fsdp-conformance/run/1``) and benchmark
reports (``fsdp-conformance/bench/1``, pytest-benchmark's JSON plus that schema). Any other
file, or a run report against a benchmark report, is a :class:`ReportFormatError` naming the
file and what was expected (a usage error, exit code 2).

Verdicts (run reports), per (case id, property), BASE status -> NEW status:

================================  ==================  ===========
transition                        label               regression?
================================  ==================  ===========
pass / known / n/a -> fail/error  newly failing       yes
pass -> known                     newly known         yes
known(key A) -> known(key B)      newly known         yes
pass -> n/a                       no longer checked   yes
case or property only in BASE     missing in NEW      yes
fail / error -> pass              newly passing       no
known -> pass                     known fixed         no
n/a -> pass / known               newly checked       no
fail <-> error, fail/error ->     changed             no
known / n/a, known -> n/a
case or property only in NEW      added in NEW        no
================================  ==================  ===========

A newly known limitation is a regression: "known" means torch fails there and the suite
recognises the failure; for an upgrade gate a torch that starts failing a case the current
torch passes is a new torch failure whether or not it has an entry in ``known.py``. Likewise
a check that stops being made (pass -> n/a, a case missing) can no longer vouch for the
candidate, so it cannot pass the gate silently. A failure in BASE that changes shape in NEW
was never a guarantee and is listed for information only.

Timings (run measurements per case and phase; benchmarks by name). The statistic is the
minimum over repeats (timing.py: machine noise only ever adds time) divided by its floor, the
raw collective(s) and copy of the same bytes timed in the same run, so that a slower or busier
machine moves both and the ratio stays put. Noise: each side's ratio has a band
``[lo, hi]``: lo = min(time) / median(floor), hi = median(time) / min(floor) (for a
benchmark: stats.min and stats.median over extra_info.floor_min_s and floor_median_s). NEW
is *slower* only when its band lies wholly above BASE's band times ``max_slowdown``
(``new.lo > base.hi * max_slowdown``), i.e. the change exceeds the spread of both runs'
repeats, AND its raw time grew too (``new.min > base.median * max_slowdown``), AND the excess
time ``new.time - base.ratio * new.floor`` is above ``MIN_TIME_DELTA_S``. The raw-time test
is there because a floor is itself a measurement: a floor of a few microseconds that one run
caught 100x slower (a busy 2-core machine: a scheduler slice in every repeat) would
otherwise make an unchanged path look 100x slower or faster in the other. A path that really
got slower is slower in both. (The cost: a NEW machine more than ``max_slowdown`` times
faster than BASE's hides a regression of that size; gate on reports from the same machine
kind, as ``gate`` does.) Without a floor on either side the raw times are compared by the
same rule. *Faster* (improvement) is the same test with the roles swapped.

Scaling (run reports' top-level ``scaling``, per path/phase): a status that goes from pass to
fail is a regression, and so is an excess exponent (time's minus its floor's) that grew by
more than ``MIN_SCALING_EXPONENT_DELTA`` and by enough that over the measured world sizes it
multiplies the time at the largest one by more than ``max_slowdown``
(``(ws_max / ws_min) ** delta > max_slowdown``). Except where both entries carry the
calibrated ``allowed_excess`` of the bounds (bounds.py): the calibration measured how far
the excess moves between identical runs (up to ~1.9 on a 2-core machine), so there the
status (pass -> fail: beyond the calibrated worst + 0.5) decides and a move within it is
"scaling changed", information. (Two gate runs of the same code flagged +0.4 moves as
regressions before this rule.)

Memory (per rank ``peak_bytes``): NEW uses *more memory* on a rank when
``new > base * max_memory_growth`` and ``new - base`` is above ``MIN_MEMORY_DELTA_BYTES``
and above ``MIN_MEMORY_SHARE`` of the rank's share of the state (``state_bytes /
world_size``, when the measurement records them).

Constants:
- ``MIN_TIME_DELTA_S`` = 2 ms: one scheduler time slice on Linux is 1-4 ms, so on a busy
  2-core machine a sub-millisecond call can lose a whole slice in every repeat; below 2 ms of
  excess a ratio is scheduling, not work.
- ``MIN_MEMORY_DELTA_BYTES`` = 4 MiB: the peaks are exact (kernel high-water mark with
  glibc's mmap threshold pinned at 64 KiB, timing.py), but whether a call's buffers land on
  pages the process already has (gloo's, the allocator's freed ones) is chance: between two
  identical benchmark runs here rank 1's peak in ``fsdp1.full/save/ws2/1e6`` was 0.02 MiB in
  one and 3.5 MiB in the other. A real extra copy of optimizer state is larger than that
  from about 1e6 state elements (8 MB in fp32 Adam) up.
- ``MIN_MEMORY_SHARE`` = 0.25: at larger states a rank's peak moved by up to 3 MiB (12% of
  its 27 MB share) between identical runs; an extra copy of anything the path holds is at
  least a whole share, four times this.
- ``MIN_SCALING_EXPONENT_DELTA`` = 0.2: a fit over 3-4 world sizes whose times carry the
  shared machine's noise (tens of percent for millisecond calls) moves its exponent by about
  0.1 between identical runs; twice that is a change.

Output order is deterministic: regressions, then improvements, known fixed, information;
within each, by subject and item.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from ..properties.verdict import STATUSES
from .run_report import FAILING, ReportFormatError, check_schema, machine_line, prop_key

COMPARE_SCHEMA = "fsdp-conformance/compare/1"
RUN_SCHEMA = "fsdp-conformance/run/1"
BENCH_SCHEMA = "fsdp-conformance/bench/1"

MIN_TIME_DELTA_S = 0.002
MIN_MEMORY_DELTA_BYTES = 4 << 20
MIN_MEMORY_SHARE = 0.25
MIN_SCALING_EXPONENT_DELTA = 0.2
PHASES = ("save", "load")

# label -> category; categories in output order.
CATEGORIES = ("regression", "improvement", "known fixed", "info")
LABELS: dict[str, str] = {
    "newly failing": "regression",
    "newly known": "regression",
    "no longer checked": "regression",
    "missing in NEW": "regression",
    "slower": "regression",
    "more memory": "regression",
    "scaling worse": "regression",
    "newly passing": "improvement",
    "faster": "improvement",
    "less memory": "improvement",
    "scaling better": "improvement",
    "known fixed": "known fixed",
    "newly checked": "info",
    "changed": "info",
    "scaling changed": "info",
    "added in NEW": "info",
}


@dataclass(frozen=True)
class Thresholds:
    """Ratios NEW / BASE beyond which a timing or a peak is a regression (each >= 1)."""

    max_slowdown: float = 1.5
    max_memory_growth: float = 1.2

    def __post_init__(self) -> None:
        for name in ("max_slowdown", "max_memory_growth"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 1.0):
                raise ValueError(f"{name} must be a finite number >= 1.0, got {v!r}")


@dataclass(frozen=True)
class Change:
    """One difference between BASE and NEW. ``subject``: a case id, a benchmark name or a
    scaling key ("path/phase"); ``item``: a property ("P3"), "save time", "load memory", ...
    or "" for the whole subject."""

    label: str
    subject: str
    item: str
    base: str
    new: str
    detail: str = ""

    @property
    def category(self) -> str:
        return LABELS[self.label]

    @property
    def regression(self) -> bool:
        return self.category == "regression"


@dataclass(frozen=True)
class Comparison:
    """The outcome of comparing two reports of one ``kind`` ("run" or "bench")."""

    kind: str
    base_path: str
    new_path: str
    base_facts: dict
    new_facts: dict
    thresholds: Thresholds
    changes: tuple[Change, ...]
    notes: tuple[str, ...] = ()

    @property
    def regressions(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.regression)

    @property
    def regressed(self) -> bool:
        return bool(self.regressions)

    def counts(self) -> dict[str, int]:
        """Changes per label, labels in LABELS order (non-zero only)."""
        n = Counter(c.label for c in self.changes)
        return {label: n[label] for label in LABELS if n[label]}

    def verdict_line(self) -> str:
        """"REGRESSION: ..." or "OK: ..." with the counts, or "OK: no changes"."""
        if not self.changes:
            return "OK: no changes"
        counts = ", ".join(f"{n} {label}" for label, n in self.counts().items())
        nreg = len(self.regressions)
        head = (f"REGRESSION: {nreg} regression{'s' if nreg != 1 else ''}" if nreg
                else "OK: no regressions")
        return f"{head} ({counts})"

    def to_json(self) -> dict:
        return {
            "schema": COMPARE_SCHEMA,
            "kind": self.kind,
            "base": {"path": self.base_path, **self.base_facts},
            "new": {"path": self.new_path, **self.new_facts},
            "thresholds": {**asdict(self.thresholds), "min_time_delta_s": MIN_TIME_DELTA_S,
                           "min_memory_delta_bytes": MIN_MEMORY_DELTA_BYTES,
                           "min_scaling_exponent_delta": MIN_SCALING_EXPONENT_DELTA},
            "regression": self.regressed,
            "verdict": self.verdict_line(),
            "counts": self.counts(),
            "notes": list(self.notes),
            "changes": [{"category": c.category, **asdict(c)} for c in self.changes],
        }


# --- reading -------------------------------------------------------------------------------

def _schema_kind(schema: Any) -> str | None:
    """"run" / "bench" for major version 1 of either schema (``.../1`` or ``.../1.x``)."""
    if not isinstance(schema, str):
        return None
    prefix, _, version = schema.rpartition("/")
    if version.split(".", 1)[0] != "1":
        return None
    return {"fsdp-conformance/run": "run", "fsdp-conformance/bench": "bench"}.get(prefix)


def load_any(path: str | os.PathLike) -> tuple[str, dict]:
    """("run" | "bench", the report) read from ``path``; ReportFormatError naming the file
    when it cannot be read, is not JSON, has another schema or lacks a required field."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ReportFormatError(f"{path}: cannot read the report: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportFormatError(f"{path}: not valid JSON ({e}); expected a run report "
                                f"({RUN_SCHEMA!r}) or a benchmark report ({BENCH_SCHEMA!r})") from None
    got = data.get("schema") if isinstance(data, dict) else None
    kind = _schema_kind(got)
    if kind is None:
        what = f"schema {got!r}" if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        hint = (" (a benchmark file from before the bench schema: rerun its "
                "`fsdp-conformance bench` to get a comparable one)"
                if isinstance(got, str) and got.startswith("fsdp-conformance/bench") else "")
        raise ReportFormatError(f"{path}: expected a run report (schema {RUN_SCHEMA!r}) or a "
                                f"benchmark report (schema {BENCH_SCHEMA!r}), got {what}{hint}")
    if kind == "run":
        check_schema(data, path)
        _check_run(data, path)
    else:
        _check_bench(data, path)
    return kind, data


def _need(obj: Any, key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise ReportFormatError(f"{where}: missing key {key!r}")
    v, types = obj[key], typ if isinstance(typ, tuple) else (typ,)
    if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
        names = "/".join(t.__name__ for t in types)
        raise ReportFormatError(f"{where}: {key!r} must be {names}, got {type(v).__name__}")
    return v


def _check_run(data: dict, path: Any) -> None:
    """The fields the comparison and the renderings read, with their types."""
    for key in ("torch_version", "backend", "tier"):
        _need(data, key, str, f"{path}")
    _need(_need(data, "summary", dict, f"{path}"), "by_path", dict, f"{path}: summary")
    seen: set[str] = set()
    for i, c in enumerate(_need(data, "cases", list, f"{path}")):
        where = f"{path}: cases[{i}]"
        cid = _need(c, "id", str, where)
        where = f"{path}: case {cid!r}"
        _need(c, "api", str, where)
        if cid in seen:
            raise ReportFormatError(f"{where}: appears twice")
        seen.add(cid)
        for prop, v in _need(c, "properties", dict, where).items():
            status = _need(v, "status", str, f"{where}: {prop}")
            if status not in STATUSES:
                raise ReportFormatError(f"{where}: {prop}: status {status!r} is not one of "
                                        f"{', '.join(STATUSES)}")
        for phase, m in (c.get("measurements") or {}).items():
            _need(m, "time_s", (int, float), f"{where}: measurements.{phase}")
    for key, s in (data.get("scaling") or {}).items():
        _need(s, "exponent", (int, float), f"{path}: scaling[{key!r}]")


def _check_bench(data: dict, path: Any) -> None:
    seen: set[str] = set()
    for i, b in enumerate(_need(data, "benchmarks", list, f"{path}")):
        name = _need(b, "name", str, f"{path}: benchmarks[{i}]")
        where = f"{path}: benchmark {name!r}"
        if name in seen:
            raise ReportFormatError(f"{where}: appears twice (benchmarks are matched by name)")
        seen.add(name)
        stats = _need(b, "stats", dict, where)
        for key in ("min", "median"):
            _need(stats, key, (int, float), f"{where}: stats")


def run_facts(report: dict) -> dict:
    """What the header says about a run report."""
    commit = (report.get("machine_info") or {}).get("commit_info") or {}
    return {"torch": report.get("torch_version"), "backend": report.get("backend"),
            "tier": report.get("tier"), "selection": report.get("selection"),
            "world_sizes": report.get("world_sizes"), "cases": len(report["cases"]),
            "ok": report.get("ok"), "machine": machine_line(report),
            "commit": commit.get("id"), "finished": report.get("finished")}


def bench_facts(report: dict) -> dict:
    """What the header says about a benchmark report."""
    m = report.get("machine_info") or {}
    commit = report.get("commit_info") or m.get("commit_info") or {}
    return {"torch": m.get("torch_version"), "benchmarks": len(report["benchmarks"]),
            "machine": machine_line(report), "commit": commit.get("id"),
            "datetime": report.get("datetime")}


# --- verdicts ------------------------------------------------------------------------------

def classify_status(base: dict, new: dict) -> str | None:
    """The label of one property's verdict change (module docstring's table), or None when
    nothing changed. ``base``/``new`` are verdict JSON objects ({"status", "known"?})."""
    b, n = base["status"], new["status"]
    if b == n and (b != "known" or base.get("known") == new.get("known")):
        return None
    if n in FAILING:
        return "changed" if b in FAILING else "newly failing"
    if b in FAILING:
        return "newly passing" if n == "pass" else "changed"
    if b == "known":
        return {"pass": "known fixed", "known": "newly known"}.get(n, "changed")
    if b == "pass":
        return "newly known" if n == "known" else "no longer checked"
    return "newly checked"  # n/a -> pass / known


def _status_text(v: dict) -> str:
    return f"known ({v['known']})" if v["status"] == "known" and v.get("known") else v["status"]


def _first_line(text: str, limit: int = 200) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _verdict_changes(base: dict, new: dict) -> list[Change]:
    out: list[Change] = []
    bcases = {c["id"]: c for c in base["cases"]}
    ncases = {c["id"]: c for c in new["cases"]}
    for cid in sorted(bcases.keys() | ncases.keys()):
        if cid not in ncases:
            st = Counter(v["status"] for v in bcases[cid]["properties"].values())
            out.append(Change("missing in NEW", cid, "", "present", "absent",
                              f"{sum(st.values())} verdicts in BASE ("
                              + ", ".join(f"{st[s]} {s}" for s in STATUSES if st[s])
                              + ") not checked by NEW"))
            continue
        if cid not in bcases:
            out.append(Change("added in NEW", cid, "", "absent", "present"))
            continue
        bp, np_ = bcases[cid]["properties"], ncases[cid]["properties"]
        for prop in sorted(bp.keys() | np_.keys(), key=prop_key):
            if prop not in np_:
                out.append(Change("missing in NEW", cid, prop, _status_text(bp[prop]), "absent"))
            elif prop not in bp:
                out.append(Change("added in NEW", cid, prop, "absent", _status_text(np_[prop])))
            else:
                label = classify_status(bp[prop], np_[prop])
                if label:
                    detail = np_[prop].get("detail", "") if np_[prop]["status"] != "pass" else ""
                    out.append(Change(label, cid, prop, _status_text(bp[prop]),
                                      _status_text(np_[prop]), _first_line(detail)))
    return out


# --- timings and memory --------------------------------------------------------------------

@dataclass(frozen=True)
class Timing:
    """One timed thing in one report: ``time_s`` the estimate (minimum over repeats),
    ``time_hi_s`` a typical repeat (median; == time_s without repeats), and the same for its
    floor (None: no floor)."""

    time_s: float
    time_hi_s: float
    floor_s: float | None = None
    floor_hi_s: float | None = None

    def normalised(self, use_floor: bool) -> tuple[float, float, float]:
        """(estimate, lo, hi) of time / floor (module docstring), or of the raw time."""
        if not use_floor:
            return self.time_s, self.time_s, max(self.time_s, self.time_hi_s)
        f_lo, f_hi = self.floor_s, max(self.floor_s, self.floor_hi_s or self.floor_s)
        return (self.time_s / f_lo, self.time_s / f_hi,
                max(self.time_s, self.time_hi_s) / f_lo)


def _median(xs: Any, default: float) -> float:
    vals = [float(x) for x in xs or () if isinstance(x, (int, float))]
    return statistics.median(vals) if vals else default


def timing_of_measurement(m: dict) -> Timing:
    """A run measurement (contract 1: time_s, times_s, floor_s, floor_times_s)."""
    t = float(m["time_s"])
    floor = m.get("floor_s")
    floor = float(floor) if isinstance(floor, (int, float)) and floor > 0 else None
    return Timing(t, _median(m.get("times_s"), t), floor,
                  _median(m.get("floor_times_s"), floor) if floor else None)


def _positive(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and x > 0 else None


def timing_of_benchmark(b: dict) -> Timing:
    """A benchmark (contract 2): stats.min / stats.median over extra_info.floor_min_s /
    floor_median_s (a report with only floor_median_s: that figure for both)."""
    s, extra = b["stats"], b.get("extra_info") or {}
    f_med = _positive(extra.get("floor_median_s"))
    f_min = _positive(extra.get("floor_min_s")) or f_med
    return Timing(float(s["min"]), float(s["median"]), f_min, f_med if f_min else None)


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 10 else f"{s:.2f} s"


def compare_timing(base: Timing, new: Timing, max_slowdown: float) -> tuple[str, str] | None:
    """("slower" | "faster", detail) when the change exceeds the threshold, the noise and
    MIN_TIME_DELTA_S (module docstring), else None."""
    use_floor = base.floor_s is not None and new.floor_s is not None
    b, b_lo, b_hi = base.normalised(use_floor)
    n, n_lo, n_hi = new.normalised(use_floor)
    if b <= 0 or n <= 0:
        return None
    # the raw times must move too (module docstring: a floor that got faster by chance is
    # not a slower path)
    raw_slower = new.time_s > max(base.time_s, base.time_hi_s) * max_slowdown
    raw_faster = base.time_s > max(new.time_s, new.time_hi_s) * max_slowdown
    if n_lo > b_hi * max_slowdown and raw_slower:
        label = "slower"
        excess = new.time_s - b * new.floor_s if use_floor else new.time_s - base.time_s
    elif b_lo > n_hi * max_slowdown and raw_faster:
        label = "faster"
        excess = base.time_s - n * base.floor_s if use_floor else base.time_s - new.time_s
    else:
        return None
    if excess <= MIN_TIME_DELTA_S:
        return None
    what = "time / floor" if use_floor else "time (no floor on both sides)"
    detail = (f"{what} {b:.3g} -> {n:.3g} (x{n / b:.2f}, threshold x{max_slowdown:g}; "
              f"noise bands {b_lo:.3g}-{b_hi:.3g} -> {n_lo:.3g}-{n_hi:.3g}); "
              f"time {_ms(base.time_s)} -> {_ms(new.time_s)}")
    if use_floor:
        detail += f"; floor {_ms(base.floor_s)} -> {_ms(new.floor_s)}"
    return label, detail


def _mib(b: float) -> str:
    return f"{b / (1 << 20):.2f} MiB"


def min_memory_delta(obj: dict) -> int:
    """The smallest per-rank peak change that counts (module docstring): 1 MiB, or a quarter
    of one rank's share of the state (``state_bytes / world_size``) when the measurement
    says how big the state is."""
    state, ws = obj.get("state_bytes"), obj.get("world_size")
    share = (state / ws) if (isinstance(state, (int, float)) and isinstance(ws, int)
                            and ws > 0) else 0
    return int(max(MIN_MEMORY_DELTA_BYTES, MIN_MEMORY_SHARE * share))


def compare_peaks(base: Sequence[int], new: Sequence[int], max_growth: float,
                  min_delta: int = MIN_MEMORY_DELTA_BYTES) -> list[tuple[str, str]]:
    """[("more memory" | "less memory", detail)] over the ranks both list (module
    docstring's rule); one entry per direction, naming every rank that moved."""
    more, less = [], []
    for rank, (b, n) in enumerate(zip(base, new)):
        ratio = f"x{n / b:.2f}" if b > 0 else "from 0"
        line = f"rank {rank}: {_mib(b)} -> {_mib(n)} ({ratio})"
        if n > b * max_growth and n - b > min_delta:
            more.append(line)
        elif b > n * max_growth and b - n > min_delta:
            less.append(line)
    out = []
    if more:
        out.append(("more memory", f"threshold x{max_growth:g} and +{_mib(min_delta)}; "
                                   + "; ".join(more)))
    if less:
        out.append(("less memory", "; ".join(less)))
    if len(base) != len(new):
        out.append(("changed", f"peaks for {len(base)} rank(s) in BASE, {len(new)} in NEW; "
                               f"compared the first {min(len(base), len(new))}"))
    return out


def _peaks(obj: dict, where: str) -> list[int] | None:
    peaks = obj.get("peak_bytes")
    if peaks is None:
        return None
    if not isinstance(peaks, list) or not all(isinstance(p, (int, float)) for p in peaks):
        raise ReportFormatError(f"{where}: 'peak_bytes' must be a list of numbers (one per rank)")
    return [int(p) for p in peaks]


def _measurement_changes(base: dict, new: dict, th: Thresholds,
                         bpath: str, npath: str) -> tuple[list[Change], list[str]]:
    out: list[Change] = []
    bcases = {c["id"]: c for c in base["cases"]}
    compared, one_sided = 0, 0
    for c in new["cases"]:
        cid = c["id"]
        bm = (bcases.get(cid) or {}).get("measurements") or {}
        nm = c.get("measurements") or {}
        if cid in bcases and bool(bm) != bool(nm):
            one_sided += 1
        for phase in sorted(bm.keys() & nm.keys()):
            compared += 1
            t = compare_timing(timing_of_measurement(bm[phase]), timing_of_measurement(nm[phase]),
                               th.max_slowdown)
            if t:
                out.append(Change(t[0], cid, f"{phase} time", f"{bm[phase]['time_s']:.6g} s",
                                  f"{nm[phase]['time_s']:.6g} s", t[1]))
            bp = _peaks(bm[phase], f"{bpath}: case {cid!r}: measurements.{phase}")
            np_ = _peaks(nm[phase], f"{npath}: case {cid!r}: measurements.{phase}")
            if bp is not None and np_ is not None:
                for label, detail in compare_peaks(bp, np_, th.max_memory_growth,
                                                   min_memory_delta(nm[phase])):
                    out.append(Change(label, cid, f"{phase} memory", _mib(max(bp, default=0)),
                                      _mib(max(np_, default=0)), detail))
    notes = [f"timings and peaks compared for {compared} (case, phase) pair(s)"]
    if one_sided:
        notes.append(f"{one_sided} case(s) have measurements in only one report (not compared)")
    return out, notes


def _excess_exponent(s: dict) -> float:
    fe = s.get("floor_exponent")
    return float(s["exponent"]) - (float(fe) if isinstance(fe, (int, float)) else 0.0)


def _scaling_changes(base: dict, new: dict, th: Thresholds) -> list[Change]:
    out: list[Change] = []
    bs, ns = base.get("scaling") or {}, new.get("scaling") or {}
    for key in sorted(bs.keys() | ns.keys()):
        if key not in ns:
            out.append(Change("missing in NEW", key, "scaling", bs[key].get("status", "?"),
                              "absent"))
            continue
        if key not in bs:
            out.append(Change("added in NEW", key, "scaling", "absent", ns[key].get("status", "?")))
            continue
        b, n = bs[key], ns[key]
        db, dn = _excess_exponent(b), _excess_exponent(n)
        ws = [w for w in n.get("world_sizes") or b.get("world_sizes") or [] if w and w > 0]
        span = max(ws) / min(ws) if ws else 1.0
        delta = dn - db
        detail = (f"exponent {b['exponent']:.2f} -> {n['exponent']:.2f}, excess over the floor "
                  f"{db:+.2f} -> {dn:+.2f} over world sizes {ws}")
        if b.get("status") == "pass" and n.get("status") == "fail":
            out.append(Change("scaling worse", key, "scaling", "pass", "fail",
                              f"{detail}; {_first_line(n.get('detail', ''))}"))
        elif abs(delta) > MIN_SCALING_EXPONENT_DELTA and span ** abs(delta) > th.max_slowdown:
            calibrated = "allowed_excess" in b and "allowed_excess" in n
            label = ("scaling changed" if calibrated
                     else "scaling worse" if delta > 0 else "scaling better")
            out.append(Change(label, key, "scaling", f"{db:+.2f}", f"{dn:+.2f}",
                              f"{detail}: x{span ** delta:.2f} at the largest world size "
                              f"(threshold x{th.max_slowdown:g})"))
        elif b.get("status") == "fail" and n.get("status") == "pass":
            out.append(Change("scaling better", key, "scaling", "fail", "pass", detail))
    return out


# --- the two kinds -------------------------------------------------------------------------

_ORDER = {c: i for i, c in enumerate(CATEGORIES)}


def _sorted(changes: list[Change]) -> tuple[Change, ...]:
    return tuple(sorted(changes, key=lambda c: (_ORDER[c.category], c.subject,
                                                prop_key(c.item), c.label)))


def _facts_notes(bf: dict, nf: dict, keys: Sequence[str]) -> list[str]:
    return [f"{k} differs: {bf.get(k)} -> {nf.get(k)} (expected when gating an upgrade; "
            "compared anyway)" for k in keys if bf.get(k) != nf.get(k)]


def compare_runs(base: dict, new: dict, th: Thresholds = Thresholds(), *,
                 base_path: str = "BASE", new_path: str = "NEW") -> Comparison:
    """Compare two run reports (module docstring's rules)."""
    changes = _verdict_changes(base, new)
    mchanges, notes = _measurement_changes(base, new, th, base_path, new_path)
    changes += mchanges + _scaling_changes(base, new, th)
    bf, nf = run_facts(base), run_facts(new)
    notes = _facts_notes(bf, nf, ("torch", "backend", "tier", "selection", "machine")) + notes
    return Comparison("run", base_path, new_path, bf, nf, th, _sorted(changes), tuple(notes))


def compare_benches(base: dict, new: dict, th: Thresholds = Thresholds(), *,
                    base_path: str = "BASE", new_path: str = "NEW") -> Comparison:
    """Compare two benchmark reports: benchmarks matched by name (module docstring)."""
    bb = {b["name"]: b for b in base["benchmarks"]}
    nb = {b["name"]: b for b in new["benchmarks"]}
    changes: list[Change] = []
    for name in sorted(bb.keys() | nb.keys()):
        if name not in nb:
            changes.append(Change("missing in NEW", name, "", "present", "absent"))
            continue
        if name not in bb:
            changes.append(Change("added in NEW", name, "", "absent", "present"))
            continue
        b, n = bb[name], nb[name]
        t = compare_timing(timing_of_benchmark(b), timing_of_benchmark(n), th.max_slowdown)
        if t:
            changes.append(Change(t[0], name, "time", _ms(b["stats"]["min"]),
                                  _ms(n["stats"]["min"]), t[1]))
        bp = _peaks(b.get("extra_info") or {}, f"{base_path}: benchmark {name!r}: extra_info")
        np_ = _peaks(n.get("extra_info") or {}, f"{new_path}: benchmark {name!r}: extra_info")
        if bp is not None and np_ is not None:
            for label, detail in compare_peaks(bp, np_, th.max_memory_growth,
                                               min_memory_delta(n.get("extra_info") or {})):
                changes.append(Change(label, name, "memory", _mib(max(bp, default=0)),
                                      _mib(max(np_, default=0)), detail))
    bf, nf = bench_facts(base), bench_facts(new)
    notes = _facts_notes(bf, nf, ("torch", "machine"))
    notes.append(f"{len(bb.keys() & nb.keys())} benchmark(s) in both reports compared")
    return Comparison("bench", base_path, new_path, bf, nf, th, _sorted(changes), tuple(notes))


def compare_files(base_path: str | os.PathLike, new_path: str | os.PathLike,
                  th: Thresholds = Thresholds()) -> Comparison:
    """Read and compare two reports of the same kind; ReportFormatError (a usage error)
    when either is unreadable or of another schema, or when their kinds differ."""
    bkind, base = load_any(base_path)
    nkind, new = load_any(new_path)
    if bkind != nkind:
        names = {"run": f"a run report ({RUN_SCHEMA})", "bench": f"a benchmark report ({BENCH_SCHEMA})"}
        raise ReportFormatError(f"{new_path}: is {names[nkind]} but BASE {base_path} is "
                                f"{names[bkind]}: compare two run reports or two benchmark reports")
    fn = compare_runs if bkind == "run" else compare_benches
    return fn(base, new, th, base_path=str(base_path), new_path=str(new_path))


# --- rendering -----------------------------------------------------------------------------

def header_lines(cmp: Comparison) -> list[str]:
    """Both sides in one line each, then the notes."""
    def side(name: str, path: str, f: dict) -> str:
        if cmp.kind == "run":
            what = (f"torch {f['torch']}, {f['backend']}, tier {f['tier']}, {f['cases']} cases, "
                    f"{'ok' if f['ok'] else 'FAILED'}")
        else:
            what = f"torch {f['torch']}, {f['benchmarks']} benchmarks"
        return f"{name} {path}: {what}; {f['machine']}"
    return ([side("BASE", cmp.base_path, cmp.base_facts), side("NEW ", cmp.new_path, cmp.new_facts),
             f"thresholds: slowdown x{cmp.thresholds.max_slowdown:g}, memory growth "
             f"x{cmp.thresholds.max_memory_growth:g}"] + [f"note: {n}" for n in cmp.notes])


def sections(cmp: Comparison) -> list[tuple[str, list[Change]]]:
    """(title, changes) per non-empty category, in CATEGORIES order."""
    titles = {"regression": "Regressions", "improvement": "Improvements",
              "known fixed": "Known limitations fixed", "info": "Other changes (information)"}
    return [(f"{titles[cat]} ({len(cs)})", cs) for cat in CATEGORIES
            if (cs := [c for c in cmp.changes if c.category == cat])]


def _change_line(c: Change) -> str:
    item = f"  {c.item}" if c.item else ""
    return f"{c.label}: {c.subject}{item}: {c.base} -> {c.new}"


def render_text(cmp: Comparison) -> str:
    """Plain text for a log or a pipe: header, one section per category, the verdict."""
    out = [f"fsdp-conformance compare ({cmp.kind} reports)", *header_lines(cmp), ""]
    for title, cs in sections(cmp):
        out.append(title + ":")
        for c in cs:
            out.append("  " + _change_line(c))
            if c.detail:
                out.append("      " + c.detail)
        out.append("")
    out.append(cmp.verdict_line())
    return "\n".join(out) + "\n"


def render_rich(cmp: Comparison, console=None) -> None:
    """The same for a terminal: one table per category (regressions red)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    console.print(Text(f"fsdp-conformance compare ({cmp.kind} reports)", style="bold"))
    for line in header_lines(cmp):
        console.print(Text(line, style="dim" if line.startswith(("note", "thresholds")) else ""))
    styles = {"regression": "red", "improvement": "green", "known fixed": "yellow", "info": ""}
    for title, cs in sections(cmp):
        table = Table(title=title, title_justify="left", title_style=f"bold {styles[cs[0].category]}")
        for col in ("change", "subject", "item", "BASE", "NEW", "detail"):
            table.add_column(col, overflow="fold")
        for c in cs:
            table.add_row(Text(c.label, style=styles[c.category]), c.subject, c.item, c.base,
                          c.new, c.detail)
        console.print(table)
    console.print(Text(cmp.verdict_line(), style="bold red" if cmp.regressed else "bold green"))


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(cmp: Comparison) -> str:
    """Markdown: title, verdict, header facts, one table per category."""
    out = [f"# fsdp-conformance compare: {cmp.kind} reports", "", f"**{cmp.verdict_line()}**", ""]
    out += [f"- {_md(line)}" for line in header_lines(cmp)] + [""]
    for title, cs in sections(cmp):
        out += [f"## {title}", "", "| change | subject | item | BASE | NEW | detail |",
                "|---|---|---|---|---|---|"]
        out += [f"| {c.label} | `{_md(c.subject)}` | {_md(c.item)} | {_md(c.base)} | "
                f"{_md(c.new)} | {_md(c.detail)} |" for c in cs] + [""]
    return "\n".join(out)
