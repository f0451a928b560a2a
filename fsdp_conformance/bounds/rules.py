"""Timing and memory bounds of the API paths: P13 (time, scaling) and P14 (peak memory), as
checked on the run's bounds cases (``Case.bounds``; measured by ``measure.measure_case``).

Rules
- P13 work and time, per bounds case and phase (save, load): pass when both
  ``cpu_s <= a_w * floor_cpu_s + c_w * speed`` (work) and ``time_s <= a * floor_s + c *
  speed`` (wall), where ``cpu_s`` / ``time_s`` are the minimum over repeats of the slowest
  rank's CPU / wall time in the call (timing.py), ``floor_cpu_s`` / ``floor_s`` the floor's
  (floors.py: the raw collective and copy of the same bytes, same run, same group), the
  (a, c) pairs come from the calibration file's "work" and "time" sections for the key
  ``"<path>/<phase>/ws<world size>/<model>"``, and ``speed`` is this machine's speed at the
  paths' own kind of work relative to the calibrating machine's, measured in the same run
  (below). The case passes P13 when both phases pass.
- Portable bounds (``speed``): ``a x floor`` is the part of a path's cost that moves with
  memcpy and the collectives, and the floor is measured in the run, so it follows the
  machine already. ``c`` is the rest: Python and torch dispatch, which on another machine of
  the same kind ran 2.5-4x slower relative to memcpy (the issue that made this rule: 23 P13
  false alarms on a fresh clone). So right after the path and its floor every rank runs the
  two probes of probe.py (pure interpreter work; small torch calls) under the same repeat
  rule, and ``speed = max(1, python_cpu / python_ref, dispatch_cpu / dispatch_ref)``, the
  refs being the medians of the same probes over the calibration runs of the same key. A
  path's non-floor work is a mix of the two kinds of work, so its slowdown on a machine
  lies between the probes': the larger one bounds it. On the calibrating machine speed is
  1 (the max with 1 absorbs probe noise), so a 3x slower path is caught as before; a slower
  or busier machine widens ``c`` by exactly what the probes measured, and the detail says so.
  A faster machine keeps speed 1: bounds never tighten below their calibration.
- Which calibration (``find_calibration``): an explicit file; else this machine's own,
  written by ``bounds calibrate`` to the calibration directory under this machine's
  fingerprint (``machine.fingerprint``: CPU model, cores, architecture, Python); else the
  packaged one, fitted on the machine its ``machine_info`` names. The report says which was
  used, whether it was fitted on this machine, and the speed each case was judged at:
  a bound calibrated elsewhere is never applied silently.
- Why two clocks: on this 2-core machine the wall time of one call moves 1.5-4x between a
  quiet and a loaded machine (the ranks wait for a core), so a wall bound that holds under
  load is loose when the machine is idle: a 3x slower path failed 0-14 of 16 quiet
  measurements. The work (CPU time of the rank's process) moves 1.2-2.1x, so its bound
  catches 3x the work on every path (``bounds stability``'s "3x work fails" column). The
  wall bound stays to catch what is not work: a path that waits (a sleep, a collective
  timeout) or serialises its ranks.
- Calibration of the work bound (``fit_work``), per key, from the N calibration runs'
  (floor_i, t_i, probes_i): the probes' refs are their medians over the runs, speed_i is
  point i's speed against them; ``a = min_i t_i / floor_i`` (the part of the cost that
  moves with the floor, never faster than the fastest observed ratio); ``c = max_i
  (TIME_MARGIN * t_i - a * floor_i) / speed_i + WORK_ALLOWANCE_S`` (every calibration point
  lies TIME_MARGIN times under its own speed-scaled bound, plus 0.05 ms: CPU time does not
  count the scheduler slices a rank waits). Dividing by speed_i keeps a loaded calibration
  run, whose CPU times the probes saw inflated too, from widening ``c`` on a quiet machine:
  the load is paid for by the speed measured when it happens. The
  calibration runs are taken under the machine's ordinary noise, quiet and loaded runs
  both, so their maximum already holds that noise; TIME_MARGIN = 1.5 covers what they
  missed and stays well under 3 (1.3 before the speed scaling: with it, a 4 ms load whose
  probes, 1 ms each, dodged a burst of load reached 0.99 of its bound in 5 stability runs
  beside another job; a 3x path still exceeds 1.5x its calibrated worst).
- Calibration of the wall bound (``fit_wall``): the same ``a``; ``c = WALL_MARGIN * max_i
  t_i + SCHED_ALLOWANCE_S`` (2x the slowest calibrated wall time, plus 2 ms for a scheduler
  slice). It is a coarse net for what is not work: a sleep, a timeout, ranks serialised.
  Its floor cannot carry load: the floors are copies and collectives of a fraction of a
  millisecond to 15 ms that fit between two slices, while a 300 ms load waits for a core
  many times, so a bound that leaned on the floor (``c`` fitted like the work's) failed an
  unchanged ``fsdp1.sharded`` load at 3 ranks under three competing processes (320 ms
  against 225 ms; its work passed).
- Noise only ever adds time while a real slowdown persists, so the runner measures a
  failing bounds case once more and judges the second measurement, and a case still
  failing is measured again (twice if need be) after the rest of the run
  (run/execute.py): noise must hit every one of those to fail a case. (a, c) are
  per world size: with 2 cores, world sizes 3 and 4 oversubscribe the CPUs and per-rank
  overheads of the sharded paths do not follow their copy floors, so one line over all
  world sizes would be loose at the small ones.
- P13 scaling, per (path, phase) over the run's bounds cases of the quick tier's state size
  (``BOUNDS_MODEL``) at 2 or more world sizes (1 rank included: leaving it out shortens the
  span of the fit and made its noise larger here, not smaller): ``exponent`` =
  fit_exponent(world sizes, work), the work being the slowest rank's CPU time; the status is
  "fail" when ``exponent > allowed_exponent`` = the largest exponent seen over the
  calibration runs + SCALING_DELTA (0.5: a quadratic number of collectives adds about +1
  over 1-4 ranks). The floor's exponent is reported beside it, not subtracted: over 8
  calibration runs one path's work exponent moved by 0.23-0.74, its excess over the
  floor's exponent by up to 1.16 (the sharded paths' floors are sub-millisecond copies),
  and the wall-time excess used before by up to 1.28, which failed 2 of 6 stability runs
  of an unchanged torch. The check
  catches growth beyond that, not subtle changes; ``compare`` tracks the exponents over
  time. A failing fit fails P13 of that path's largest-world-size case, detail with both
  exponents.
- P14 memory, per rank and phase: pass when ``peak_bytes[r] <= factor * base_r + fixed``,
  ``peak_bytes[r]`` the smallest of the rank's peaks over ``measure.PEAK_REPEATS`` calls.
  ``base_r`` is the docs/design.md bound: a rank that ends up holding the full dict (rank 0 of a
  full-dict save: ``api_paths.is_full_path``; the run's saves are all rank0_only) holds full
  state + one unit; every other rank (and every rank of a load: its input is already
  resident, it builds its own shard) holds its shard (state / world size) + one unit, "one
  unit" being ``unit_bytes`` (the largest unit's state, unsharded). Calibration, per
  (path, phase, world size, role) with role "rank0" or "other": ``factor = MEM_MARGIN * max_i
  peak_i / base_i``: the path's own calibrated peak, also where it lies far under the DESIGN
  bound (the FSDP2 loads peak at 0.01-0.38 of it; a floor at the DESIGN bound let them grow
  2.6x to 80x unseen). ``fixed``: ``MEM_FIXED_TIGHT_BYTES`` (32 KiB: page rounding and the
  interpreter's heap move an exact peak by a few KiB to tens of KiB) for a key whose
  calibrated peak is ``NEGLIGIBLE_PEAK_RATIO`` (5%) of its base or more; ``MEM_FIXED_BYTES``
  (512 KiB) for one under it, a call that allocates almost nothing (the calibrated keys lie
  at 0-2.5% or at 13% and above of their bases, nothing between). MEM_MARGIN = 1.2: peaks
  are exact (kernel high-water mark), so a path that keeps an extra copy of what it holds
  exceeds its bound wherever that copy is larger than 0.2 x its calibrated peak + the fixed
  part: on the quick tier's 4 MB state, an extra copy of one rank's share (1 MB at 4 ranks)
  on every path (``bounds stability``'s "extra shard fails" column), and a doubled peak on
  every key that allocates (its "2x peak fails" column). The fixed part was 512 KiB for
  every key before: the FSDP2 loads, which peak at 0.4-2.3 MB here, could double unseen
  in 40-48 of 100 measurements. Doubling a peak of 0-100 KiB (``fsdp2.full``'s rank-0 load,
  ``fsdp2.sharded``'s save: they return views, or copy into state that exists) is no
  test, and ``bounds stability`` counts those keys apart: what they can grow by is a copy
  of what they produce, and that is what the self-tests plant.
- A key missing from the calibration file is an error naming the file, the key and the
  command that writes it (``fsdp-conformance bounds calibrate``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..cases import Case
from .probe import PROBES
from .timing import fit_exponent

SCHEMA = "fsdp-conformance/bounds-calibration/3"
PHASES = ("save", "load")
TIME_MARGIN = 1.5
WALL_MARGIN = 2.0
MEM_MARGIN = 1.2
MEM_FIXED_BYTES = 1 << 19
MEM_FIXED_TIGHT_BYTES = 1 << 15
NEGLIGIBLE_PEAK_RATIO = 0.05
SCALING_DELTA = 0.5
SCHED_ALLOWANCE_S = 0.002
WORK_ALLOWANCE_S = 0.00005
BOUNDS_REPEATS = 5
BOUNDS_SIZE = 500_000  # params of the quick tier's bounds model: 4 MB of fp32 Adam state
BOUNDS_MODEL = f"scaled{BOUNDS_SIZE}"
DEFAULT_CALIBRATION = Path(__file__).resolve().parents[1] / "data" / "bounds.json"
"""The packaged calibration, fitted on the machine its ``machine_info`` names."""
CALIBRATE_COMMAND = "fsdp-conformance bounds calibrate"


class CalibrationError(ValueError):
    """A calibration file that cannot be used: unreadable, another schema, a key missing."""


def time_key(api: str, phase: str, world_size: int, model: str) -> str:
    return f"{api}/{phase}/ws{world_size}/{model}"


def mem_key(api: str, phase: str, rank: int, world_size: int) -> str:
    return f"{api}/{phase}/ws{world_size}/{'rank0' if rank == 0 else 'other'}"


@dataclass(frozen=True)
class TimeBound:
    """``time <= a * floor + c * speed`` (seconds; module rules)."""

    a: float
    """Seconds of the path per second of its floor."""
    c: float
    """Seconds of the path that do not move with its floor, on the calibrating machine."""
    probes: dict[str, float] = field(default_factory=dict)
    """The probes' CPU seconds on the calibrating machine (median over its runs), by probe
    name (probe.PROBES); empty: the bound is not scaled (speed 1)."""

    def bound(self, floor_s: float, speed: float = 1.0) -> float:
        return self.a * floor_s + self.c * speed

    def speed(self, probes_now: dict[str, float] | None) -> tuple[float, str]:
        """(speed, what it is made of) of a measurement whose probes took ``probes_now``
        CPU seconds (module rules: max(1, each probe's now / calibrated))."""
        if not self.probes or not probes_now:
            return 1.0, "not scaled (no probe " + ("calibrated" if not self.probes else "measured") + ")"
        ratios = {k: probes_now[k] / ref for k, ref in sorted(self.probes.items())
                  if ref > 0 and k in probes_now}
        speed = max([1.0, *ratios.values()])
        parts = ", ".join(f"{k} {ms_text(probes_now[k])} / {ms_text(self.probes[k])} = "
                          f"{r:.2f}" for k, r in ratios.items())
        return speed, f"speed {speed:.2f} = max(1, {parts})"


@dataclass(frozen=True)
class MemBound:
    """``peak <= factor * base + fixed_bytes`` (bytes)."""

    factor: float
    fixed_bytes: int

    def bound(self, base_bytes: int) -> int:
        return int(self.factor * base_bytes + self.fixed_bytes)


@dataclass(frozen=True)
class Calibration:
    """A calibration file's bounds (module rules)."""

    source: str
    """The file, named in messages."""
    time: dict[str, TimeBound]
    """Wall-clock bounds by key (``time_key``)."""
    memory: dict[str, MemBound]
    """Peak-memory bounds by key (``mem_key``)."""
    allowed_exponent: dict[str, float]
    """Largest allowed work exponent against world size, by "<path>/<phase>"."""
    work: dict[str, TimeBound]
    """CPU-time bounds by key (``time_key``)."""
    machine_info: dict = field(default_factory=dict)
    """The calibrating machine (report/io.py ``machine_info``), fingerprint included."""

    def time_bound(self, key: str) -> TimeBound:
        return self._get(self.time, key, "time")

    def work_bound(self, key: str) -> TimeBound:
        return self._get(self.work, key, "work")

    def mem_bound(self, key: str) -> MemBound:
        return self._get(self.memory, key, "memory")

    def _get(self, table: dict, key: str, section: str) -> Any:
        try:
            return table[key]
        except KeyError:
            raise CalibrationError(
                f"{self.source}: no {section} calibration for {key!r} (it has "
                f"{len(table)} {section} keys); run `{CALIBRATE_COMMAND}` for the tier whose "
                f"bounds cases you run") from None


def _num(d: Any, key: str, where: str) -> float:
    v = d.get(key) if isinstance(d, dict) else None
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v or v < 0:
        raise CalibrationError(f"{where}: {key!r} must be a non-negative number, got {v!r}")
    return float(v)


def _time_bounds(data: dict, section: str, source: str) -> dict[str, TimeBound]:
    """The ``(a, c, probes)`` bounds of one section ("time" or "work") of a calibration
    file."""
    out = {}
    for k, v in data[section].items():
        where = f"{source}: {section}[{k!r}]"
        probes = v.get("probes") if isinstance(v, dict) else None
        if not isinstance(probes, dict) or set(probes) != set(PROBES):
            raise CalibrationError(f"{where}: 'probes' must give the calibrating machine's "
                                   f"{list(PROBES)} probe times, got {probes!r}; measure again "
                                   f"with `{CALIBRATE_COMMAND}`")
        out[k] = TimeBound(_num(v, "a", where), _num(v, "c", where),
                           {p: _num(probes, p, where) for p in PROBES})
    return out


def parse_calibration(data: Any, source: str) -> Calibration:
    """A :class:`Calibration` from a calibration file's JSON; CalibrationError naming the
    source and the bad key otherwise."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise CalibrationError(f"{source}: not a bounds calibration: expected schema "
                               f"{SCHEMA!r}, got {got!r}")
    for section in ("time", "work", "memory", "scaling"):
        if not isinstance(data.get(section), dict):
            raise CalibrationError(f"{source}: {section!r} must be an object of keys")
    time, work = (_time_bounds(data, section, source) for section in ("time", "work"))
    memory = {}
    for k, v in data["memory"].items():
        where = f"{source}: memory[{k!r}]"
        memory[k] = MemBound(_num(v, "factor", where), int(_num(v, "fixed_bytes", where)))
    allowed = {k: float(v["allowed_exponent"]) for k, v in data["scaling"].items()
               if isinstance(v, dict) and isinstance(v.get("allowed_exponent"), (int, float))}
    if len(allowed) != len(data["scaling"]):
        raise CalibrationError(f"{source}: every scaling entry needs a numeric "
                               f"'allowed_exponent'")
    return Calibration(source, time, memory, allowed, work,
                       data.get("machine_info") if isinstance(data.get("machine_info"), dict)
                       else {})


@lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> Calibration:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CalibrationError(f"{path}: cannot read the bounds calibration ({e}); write it "
                               f"with `{CALIBRATE_COMMAND}`") from None
    return parse_calibration(data, path)


CALIBRATION_DIR_ENV = "FSDPC_CALIBRATION_DIR"


def calibration_dir() -> Path:
    """Where ``bounds calibrate`` writes this machine's calibration and the run looks for
    it: ``$FSDPC_CALIBRATION_DIR``, else ``$XDG_CACHE_HOME/fsdp-conformance/bounds``, else
    ``~/.cache/fsdp-conformance/bounds``. Never inside the installed package."""
    env = os.environ.get(CALIBRATION_DIR_ENV, "").strip()
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(cache) / "fsdp-conformance" / "bounds"


def machine_calibration() -> Path:
    """This machine's own calibration file: ``calibration_dir() / "<fingerprint>.json"``."""
    from .machine import machine_fingerprint

    return calibration_dir() / f"{machine_fingerprint()}.json"


def find_calibration(path: str | os.PathLike | None = None) -> tuple[Path, str]:
    """(the calibration file to judge by, why that one) (module rules: an explicit file; else
    this machine's own; else the packaged one)."""
    if path is not None:
        return Path(path), "given"
    own = machine_calibration()
    if own.is_file():
        return own, "this machine's own (found by its fingerprint)"
    return DEFAULT_CALIBRATION, "the packaged one"


def calibration_facts(path: str | os.PathLike | None = None) -> dict:
    """What a report says of the calibration its bounds were judged by: the file, why it,
    the machine that fitted it, and whether that machine is this one (by fingerprint)."""
    from .machine import machine_fingerprint

    p, why = find_calibration(path)
    here = machine_fingerprint()
    out: dict[str, Any] = {"source": str(p), "chosen": why, "this_fingerprint": here}
    try:
        cal = load_calibration(p)
    except CalibrationError as e:
        return {**out, "error": str(e)}
    m = cal.machine_info
    out.update(fitted_on=m, fitted_fingerprint=m.get("fingerprint"),
               same_machine=m.get("fingerprint") == here)
    return out


def load_calibration(path: str | os.PathLike | None = None) -> Calibration:
    """The calibration at ``path`` (default: ``find_calibration``'s choice)."""
    p = Path(path) if path is not None else find_calibration()[0]
    try:
        mtime = p.stat().st_mtime
    except OSError as e:
        raise CalibrationError(f"{p}: cannot read the bounds calibration ({e.strerror}); write "
                               f"it with `{CALIBRATE_COMMAND}`") from None
    return _load(str(p), mtime)


# --- the fits (calibration) -------------------------------------------------------------

def _probe_refs(points: Sequence[Sequence]) -> dict[str, float]:
    """The median of each probe's CPU time over calibration points ``(floor, time,
    {probe: s})`` (module rules); {} when the points carry none."""
    import statistics

    probes = [p[2] for p in points if len(p) > 2 and isinstance(p[2], dict)]
    return {k: statistics.median(p[k] for p in probes) for k in PROBES
            if probes and all(k in p for p in probes)}


def fit_work(points: Sequence[Sequence], margin: float = TIME_MARGIN,
             allowance_s: float = WORK_ALLOWANCE_S) -> TimeBound:
    """(a, c, probes) of the work bound from calibration points (floor CPU s, CPU s[,
    {probe: CPU s}]) (module rules)."""
    good = [p for p in points if p[0] > 0 and p[1] > 0]
    if not good:
        raise ValueError(f"need positive (floor, time) points to fit a time bound, got {list(points)}")
    refs = _probe_refs(good)
    unscaled = TimeBound(0.0, 0.0, refs)
    pts = [(p[0], p[1], unscaled.speed(p[2] if len(p) > 2 else None)[0]) for p in good]
    a = min(t / f for f, t, _ in pts)
    c = max(0.0, max((margin * t - a * f) / sp for f, t, sp in pts)) + allowance_s
    return TimeBound(a, c, refs)


def fit_wall(points: Sequence[Sequence], margin: float = WALL_MARGIN,
             probes_from: Sequence[Sequence] | None = None) -> TimeBound:
    """(a, c, probes) of the wall bound from calibration points (floor_s, time_s[, {probe:
    CPU s}]) (module rules); the probe refs are the CPU-time probes (``probes_from``, the
    work points, where given): speed is measured on the CPU clock for both bounds."""
    a = fit_work(points).a
    return TimeBound(a, margin * max(p[1] for p in points) + SCHED_ALLOWANCE_S,
                     _probe_refs(probes_from if probes_from is not None else points))


def fit_memory(ratios: Iterable[float], margin: float = MEM_MARGIN) -> MemBound:
    """(factor, fixed) from observed peak / base ratios (module rules)."""
    top = max(ratios, default=0.0)
    return MemBound(margin * top, MEM_FIXED_BYTES if negligible(top) else MEM_FIXED_TIGHT_BYTES)


def negligible(peak_ratio: float) -> bool:
    """Whether a calibrated peak of ``peak_ratio`` x its base is a call that allocates almost
    nothing (module rules)."""
    return peak_ratio < NEGLIGIBLE_PEAK_RATIO


# --- P14 bases ----------------------------------------------------------------------------

def holds_full(api: str, phase: str, rank: int) -> bool:
    """Whether ``rank`` ends the call holding the full dict (rank 0 of a full-dict save)."""
    from ..api_paths import is_full_path

    return phase == "save" and rank == 0 and is_full_path(api)


def mem_base(api: str, phase: str, rank: int, m: dict) -> tuple[int, str]:
    """The DESIGN bound of ``rank`` for measurement ``m`` and what it is made of."""
    state, unit, ws = int(m["state_bytes"]), int(m["unit_bytes"]), int(m["world_size"])
    if holds_full(api, phase, rank):
        return state + unit, f"full state {mb_text(state)} + one unit {mb_text(unit)}"
    shard = -(-state // ws)
    return shard + unit, f"shard {mb_text(shard)} (state / {ws}) + one unit {mb_text(unit)}"


def mb_text(b: float) -> str:
    return f"{b / 1e6:.2f} MB"


def ms_text(s: float) -> str:
    return f"{s * 1e3:.2f} ms"


# --- the verdicts -------------------------------------------------------------------------

def annotate(case: Case, meas: dict, cal: Calibration) -> dict:
    """``meas`` ({phase: measurement}) with ratio, time_bound_s, work_bound_s and
    mem_bound_bytes added (contract of report/diff.py); raises CalibrationError for a
    missing key."""
    out = {}
    for phase in PHASES:
        m = dict(meas[phase])
        key = time_key(case.api, phase, case.world_size, case.model)
        tb = cal.time_bound(key)
        wb = cal.work_bound(key)
        speed, speed_text = wb.speed(m.get("probe_cpu_s"))
        m["speed"], m["speed_detail"] = speed, speed_text
        m["ratio"] = m["time_s"] / m["floor_s"] if m["floor_s"] > 0 else None
        m["time_bound_s"] = tb.bound(m["floor_s"], speed)
        m["time_a"], m["time_c_s"] = tb.a, tb.c
        m["work_bound_s"] = wb.bound(m["floor_cpu_s"], speed)
        m["work_a"], m["work_c_s"] = wb.a, wb.c
        bounds, made_of, quiet = [], [], []
        for r in range(len(m["peak_bytes"])):
            mb = cal.mem_bound(mem_key(case.api, phase, r, case.world_size))
            base, what = mem_base(case.api, phase, r, m)
            bounds.append(mb.bound(base))
            quiet.append(negligible(mb.factor / MEM_MARGIN))
            made_of.append(f"{mb.factor:.2f} x ({what}) + {mb_text(mb.fixed_bytes)}")
        m["mem_bound_bytes"] = bounds
        m["mem_negligible"] = quiet
        m["mem_bound_made_of"] = made_of
        out[phase] = m
    return out


# --- scaling ------------------------------------------------------------------------------

def scaling_points(entries: Iterable[dict]) -> dict[str, tuple[list[int], list[float], list[float]]]:
    """{"<path>/<phase>": (world sizes, work, floor work)} over case entries (report form:
    api, model, world_size, measurements) of BOUNDS_MODEL, sorted by world size: the CPU
    times (``cpu_s``, ``floor_cpu_s``; module rules)."""
    pts: dict[str, dict[int, tuple[float, float]]] = {}
    for c in entries:
        meas = c.get("measurements") or {}
        if c.get("model") != BOUNDS_MODEL or not meas:
            continue
        for phase in PHASES:
            m = meas.get(phase)
            if m:
                pts.setdefault(f"{c['api']}/{phase}", {})[int(m["world_size"])] = (
                    float(m["cpu_s"]), float(m["floor_cpu_s"]))
    return {k: _series(v) for k, v in sorted(pts.items())}


def _series(by_ws: dict[int, tuple[float, float]]) -> tuple[list[int], list[float], list[float]]:
    """(world sizes, times, floors) sorted by world size, from {world size: (time, floor)}."""
    ws = sorted(by_ws)
    return ws, [by_ws[w][0] for w in ws], [by_ws[w][1] for w in ws]


def _add_exponents(exponents: dict[str, list[float]],
                   points: dict[str, tuple[list[int], list[float], list[float]]]) -> None:
    """Append one calibration run's work exponent against world size to ``exponents`` for
    every path/phase of ``points`` (``scaling_points``' form) measured at 2 or more world
    sizes."""
    for key, (ws, times, _) in points.items():
        if len(ws) >= 2:
            exponents.setdefault(key, []).append(fit_exponent(ws, times))


def scaling_block(entries: Iterable[dict], cal: Calibration | None) -> dict[str, dict]:
    """The run report's ``scaling`` block (contract of report/diff.py) from case entries:
    ``times_s`` and ``floor_times_s`` are the work (CPU) of the path and of its floor
    (``clock`` "cpu")."""
    out = {}
    for key, (ws, times, floors) in scaling_points(entries).items():
        s: dict[str, Any] = {"clock": "cpu", "world_sizes": ws, "times_s": times,
                             "floor_times_s": floors}
        if len(ws) < 2:
            out[key] = {**s, "exponent": 0.0, "floor_exponent": 0.0, "status": "n/a",
                        "detail": f"measured at one world size only ({ws})"}
            continue
        exp, fexp = fit_exponent(ws, times), fit_exponent(ws, floors)
        s.update(exponent=exp, floor_exponent=fexp)
        allowed = cal.allowed_exponent.get(key) if cal is not None else None
        if allowed is None:
            src = cal.source if cal is not None else "no calibration"
            s.update(status="error", detail=f"{src}: no scaling calibration for {key!r}; run "
                                            f"`{CALIBRATE_COMMAND}`")
        else:
            ok = exp <= allowed
            s.update(status="pass" if ok else "fail", allowed_exponent=allowed,
                     detail=(f"{key}: work (CPU) grows as ws^{exp:.2f} "
                             f"{'<=' if ok else '>'} allowed ws^{allowed:.2f} (calibrated "
                             f"largest + {SCALING_DELTA}) over world sizes {ws}; its floor "
                             f"grows as ws^{fexp:.2f}"))
        out[key] = s
    return out


def calibration_data(runs: Sequence[Sequence[tuple[Case, dict]]], **facts: Any) -> dict:
    """The calibration file's JSON from N runs of bounds cases, each run a list of (case,
    raw measurements of ``measure.measure_case``): the fits of the module rules, with every
    observed point kept beside its fit. ``facts`` (torch version, machine, command) are
    copied in."""
    time_pts: dict[str, list[tuple[float, float]]] = {}
    work_pts: dict[str, list[tuple[float, float]]] = {}
    ratios: dict[str, list[float]] = {}
    exponents: dict[str, list[float]] = {}
    for run in runs:
        entries = []
        for case, meas in run:
            entries.append({"api": case.api, "model": case.model, "measurements": meas})
            for phase in PHASES:
                m = meas[phase]
                key = time_key(case.api, phase, case.world_size, case.model)
                probes = dict(m.get("probe_cpu_s") or {})
                time_pts.setdefault(key, []).append((m["floor_s"], m["time_s"], probes))
                work_pts.setdefault(key, []).append((m["floor_cpu_s"], m["cpu_s"], probes))
                for r, peak in enumerate(m["peak_bytes"]):
                    base, _ = mem_base(case.api, phase, r, m)
                    ratios.setdefault(mem_key(case.api, phase, r, case.world_size),
                                      []).append(peak / base)
        _add_exponents(exponents, scaling_points(entries))
    return {"schema": SCHEMA, **facts, "runs": len(runs),
            **_fits(time_pts, work_pts, ratios, exponents)}


def _fits(time_pts: dict[str, list], work_pts: dict[str, list], ratios: dict[str, list[float]],
          exponents: dict[str, list[float]]) -> dict:
    """The rules, time, work, memory and scaling sections fitted from the observations."""
    time, work = {}, {}
    for k, pts in sorted(time_pts.items()):
        tb = fit_wall([tuple(p) for p in pts], probes_from=work_pts.get(k))
        time[k] = {"a": tb.a, "c": tb.c, "probes": tb.probes, "points": [list(p) for p in pts]}
    for k, pts in sorted(work_pts.items()):
        wb = fit_work([tuple(p) for p in pts])
        work[k] = {"a": wb.a, "c": wb.c, "probes": wb.probes, "points": [list(p) for p in pts]}
    memory = {}
    for k, rs in sorted(ratios.items()):
        mb = fit_memory(rs)
        memory[k] = {"factor": mb.factor, "fixed_bytes": mb.fixed_bytes, "max_ratio": max(rs),
                     "ratios": list(rs)}
    scaling = {k: {"max_exponent": max(v), "allowed_exponent": max(v) + SCALING_DELTA,
                   "exponents": list(v)} for k, v in sorted(exponents.items())}
    return {"rules": {"time_margin": TIME_MARGIN, "wall_margin": WALL_MARGIN,
                      "mem_margin": MEM_MARGIN,
                      "mem_fixed_bytes": MEM_FIXED_BYTES,
                      "mem_fixed_tight_bytes": MEM_FIXED_TIGHT_BYTES,
                      "negligible_peak_ratio": NEGLIGIBLE_PEAK_RATIO,
                      "scaling_delta": SCALING_DELTA,
                      "sched_allowance_s": SCHED_ALLOWANCE_S,
                      "work_allowance_s": WORK_ALLOWANCE_S},
            "time": time, "work": work, "memory": memory, "scaling": scaling}


def _exponents_from_points(work_pts: dict[str, list]) -> dict[str, list[float]]:
    """Per "<path>/<phase>", the work exponent of every calibration run, from the work
    points (the i-th point of each world size's key is run i's)."""
    runs: dict[int, dict[str, dict[int, tuple[float, float]]]] = {}
    for key, pts in work_pts.items():
        api, phase, ws, model = key.split("/")
        if model != BOUNDS_MODEL:
            continue
        for i, (f, t, *_) in enumerate(pts):
            runs.setdefault(i, {}).setdefault(f"{api}/{phase}", {})[int(ws[2:])] = (t, f)
    exponents: dict[str, list[float]] = {}
    for i in sorted(runs):
        _add_exponents(exponents, {k: _series(v) for k, v in sorted(runs[i].items())})
    return exponents


def refit(data: dict, source: str = "<calibration>") -> dict:
    """A calibration file's JSON refitted from its own observations (time and work points,
    peak ratios) under this module's rules (the scaling section is derived from the work
    points); the other facts are kept."""
    parse_calibration({**data, "scaling": {}}, source)
    try:
        work_pts = {k: v["points"] for k, v in data["work"].items()}
        obs = ({k: v["points"] for k, v in data["time"].items()}, work_pts,
               {k: v["ratios"] for k, v in data["memory"].items()},
               _exponents_from_points(work_pts))
    except KeyError as e:
        raise CalibrationError(f"{source}: an entry lacks its observations ({e}); measure again "
                               f"with `{CALIBRATE_COMMAND}`") from None
    return {**data, **_fits(*obs)}


def scaling_of(results, calibration=None) -> dict:
    """The scaling block (``scaling_block``) of a run's measured results (``CaseResult``s
    with measurements), under the calibration file (None: the packaged one; an unreadable
    one: no allowance); {} when no result was measured. The run computes it once; the
    report stores the same block."""
    entries = [{"api": r.case.api, "model": r.case.model, "world_size": r.case.world_size,
                "measurements": r.measurements} for r in results if r.measurements]
    if not entries:
        return {}
    try:
        cal = load_calibration(calibration)
    except CalibrationError:
        cal = None
    return scaling_block(entries, cal)
