"""What one API path costs on the ranks: time against its floor and peak memory, for its save
and for its load (the measurements behind P13, P14 and ``bench scaling``).

Rules
- A case is measured at one world size (``case.world_size``; its load is at the same size
  and plan as its save): the ranks build the case's model and optimizer through the path's
  own SUT module, train ``case.steps`` steps so the state exists, then for each phase:
    * time: ``timing.timed_repeats`` of the path's call (the save call as a trainer makes
      it; the load call into a fresh optimizer, reading the written checkpoint as the run
      does), ``repeats`` times, every rank starting together, the slowest rank's time per
      repeat; the estimate is the minimum;
    * floor: ``timing.floor_times`` of ``floors.floor_ops`` for the path and phase on the same
      bytes, same group, same repeat rule, measured right after the path;
    * peak memory: ``PEAK_REPEATS`` (3) more calls under ``timing.measure_peak`` (peak
      resident set minus the resident set before the call; glibc's mmap threshold pinned
      first), per rank, the smallest kept: like time, a peak only gains from noise (the
      interpreter's heap growing in one call and not the next moved the FSDP2 loads' peaks
      by up to 5x between calibration runs), and a path that really holds more holds it
      every time.
- ``state_bytes``: the bytes of the per-element (positive-dim) tensor state of the whole
  optimizer: the sum over ranks of each rank's local per-element state (FSDP1 flat padding
  included); ``unit_bytes``: the largest FSDP unit's per-element state, unsharded.
- The save's output is written once, outside the timed region, to the work directory (disk
  time is no path's cost and no floor's; see floors.py); the load reads it back untimed.
- Everything returned is plain numbers (picklable, JSON-ready).
- Injection (``case.inject``, test-only, never set by the matrix; see suites/bounds): the
  measured call of both phases is wrapped: "slow" makes the call 3x as costly on every
  rank: after it, it computes for twice the CPU time the call took (3x the work), then
  sleeps so that the whole is at least 3x the call's wall time; "slow10" the same, 10x
  (a slowdown no machine's noise can hide: the self-tests' fixed point; how often 3x is
  caught is a rate, measured by ``bounds stability``); "copy" keeps a clone of the call's
  output alive until the next call (save: the returned dict; load: the optimizer's state),
  i.e. an extra copy the path should not keep.
"""
from __future__ import annotations

import functools
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..cases import Case
from .floors import describe, floor_ops
from ..harness import get_pool
from .probe import PROBE_REPEATS, PROBES, probe
from .timing import floor_times, measure_peak, pin_malloc, timed_repeats
from ..zoo import build_model, model_spec
from ..sut import roundtrip as sut  # the one round trip's calls, timed one by one
from ..sut.fsdp1 import train

PHASES = ("save", "load")
PEAK_REPEATS = 3


def _local_state_bytes(optim: torch.optim.Optimizer) -> int:
    """This rank's bytes of per-element (positive-dim) tensor state, DTensors as local."""
    total = 0
    for st in optim.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                t = v.to_local() if hasattr(v, "to_local") else v
                total += t.numel() * t.element_size()
    return total


def _sum_over_ranks(x: int, group) -> int:
    t = torch.tensor([x], dtype=torch.int64)
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(t, group=group)
    return int(t.item())


def _unit_bytes(case: Case, optim: torch.optim.Optimizer, state_bytes: int) -> int:
    """The largest unit's per-element state, unsharded: per plan unit, the unwrapped
    params' elements times the per-element bytes of one element of state."""
    model = build_model(case.model, case.seed, torch.float32)  # shapes only
    units = model_spec(case.model).plans[case.plan]
    sizes: dict[str, int] = {u: 0 for u in ("", *units)}
    elements = 0
    for name, p in model.named_parameters():
        owner = max((u for u in units if name.startswith(u + ".")), key=len, default="")
        sizes[owner] += p.numel()
        elements += p.numel()
    per_element = state_bytes / max(1, elements)
    return int(math.ceil(max(sizes.values()) * per_element))


def _phase(group, fn, repeats: int, api: str, phase: str, state_bytes: int,
           world_size: int, reset=None) -> dict:
    """Time, floor and peak of one phase; ``reset()`` drops what the last call produced
    (untimed, before every call)."""
    times = timed_repeats(fn, repeats, group=group, setup=reset)
    ops = floor_ops(api, phase, state_bytes, world_size)
    floors = floor_times(ops, repeats, group=group)
    probes = {k: timed_repeats(functools.partial(probe, k), PROBE_REPEATS, group=group)
              for k in PROBES}
    peaks = []
    for _ in range(PEAK_REPEATS):
        if reset is not None:
            reset()
        peaks.append(measure_peak(fn)[1])
    peak = min(peaks, key=lambda p: p.peak_bytes)
    return {"time_s": min(times.wall_s), "times_s": times.wall_s,
            "floor_s": min(floors.wall_s), "floor_times_s": floors.wall_s,
            "cpu_s": min(times.cpu_s), "cpu_times_s": times.cpu_s,
            "floor_cpu_s": min(floors.cpu_s), "floor_cpu_times_s": floors.cpu_s,
            "probe_cpu_s": {k: min(r.cpu_s) for k, r in probes.items()},
            "floor": describe(ops), "peak_bytes": peak.peak_bytes,
            "peak_method": peak.peak_method, "device_peak_bytes": peak.device_peak_bytes}


def _clone(obj: Any) -> Any:
    """A deep copy of ``obj`` with every tensor cloned (DTensors as their local tensor)."""
    if isinstance(obj, torch.Tensor):
        t = obj.to_local() if hasattr(obj, "to_local") else obj
        return t.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clone(v) for v in obj]
    return obj


def _spin(cpu_s: float) -> None:
    """Compute (busy, on this thread) until the process has spent ``cpu_s`` more CPU time."""
    end = time.process_time() + cpu_s
    while time.process_time() < end:
        pass


SLOWDOWNS = {"slow": 3, "slow10": 10}
"""The slowdown injections and their factors (module rules)."""


def _injected(kind: str, fn, output):
    """``fn`` with the test-only injection ``kind`` (module rules); ``output()`` gives what
    the call produced. ``kind`` "" returns ``fn`` itself."""
    if not kind:
        return fn
    kept: list[Any] = []

    def call() -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        if kind in SLOWDOWNS:
            factor = SLOWDOWNS[kind]
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            _spin((factor - 1) * cpu)
            time.sleep(max(0.0, t0 + factor * wall - time.perf_counter()))
        elif kind == "copy":
            kept[:] = [_clone(output())]
        else:
            raise ValueError(f"unknown injection {kind!r}")
    return call


def measure_side(ctx, case: Case, workdir: str, repeats: int) -> dict:
    """On every rank: build, train, then measure the path's save and load (module rules)."""
    pin_malloc()
    workdir_p = Path(workdir)
    group = ctx.group
    model, optim, _, _ = sut.build(ctx, case, load_side=False)

    train(ctx, case, model, optim, case.steps)
    state_bytes = _sum_over_ranks(_local_state_bytes(optim), group)
    holder: list[Any] = [None]

    def save() -> None:
        holder[0] = sut.save_call(case, model, optim)

    def drop() -> None:
        holder[0] = None

    out: dict[str, Any] = {"rank": ctx.rank, "state_bytes": state_bytes,
                           "unit_bytes": _unit_bytes(case, optim, state_bytes)}
    save_call = _injected(case.inject, save, lambda: holder[0])
    out["save"] = _phase(group, save_call, repeats, case.api, "save", state_bytes, ctx.world_size,
                         reset=drop)
    sut.write(ctx, case, sut.Live(model=model, optim=optim, step=case.steps), holder[0],
              workdir_p)
    holder[0] = None
    del model, optim
    model, optim, _, _ = sut.build(ctx, case, load_side=True)
    saved, _ = sut.read_saved(ctx, case, workdir_p)
    load = _injected(case.inject,
                     lambda: sut.load_call(ctx, case, sut.Live(model=model, optim=optim),
                                           saved, workdir_p),
                     lambda: optim.state)
    out["load"] = _phase(group, load, repeats, case.api, "load", state_bytes, ctx.world_size)
    return out


def measure_case(case: Case, workdir: str | Path, *, repeats: int = 5,
                 backend: str | None = None, timeout: float = 600.0) -> dict:
    """Measure ``case`` on the shared pool of its world size. Returns ``{"save": m, "load":
    m}`` with ``m`` = {time_s, times_s, floor_s, floor_times_s, cpu_s, cpu_times_s,
    floor_cpu_s, floor_cpu_times_s, floor, peak_bytes (one per
    rank), peak_method, state_bytes, unit_bytes, world_size}. Raises the pool's RankError."""
    if case.world_size != case.dst_world_size:
        raise ValueError(f"a measured case loads at its saving world size; got "
                         f"{case.world_size}->{case.dst_world_size} ({case.id})")
    Path(workdir).mkdir(parents=True, exist_ok=True)
    obs = get_pool(case.world_size, backend).run(measure_side, case, str(workdir), repeats,
                                                 timeout=timeout, seed=case.seed)
    obs = sorted(obs, key=lambda o: o["rank"])
    out = {}
    for phase in PHASES:
        m = dict(obs[0][phase])
        m["peak_bytes"] = [o[phase]["peak_bytes"] for o in obs]
        if m.get("device_peak_bytes") is not None:
            m["device_peak_bytes"] = [o[phase]["device_peak_bytes"] for o in obs]
        m["state_bytes"] = obs[0]["state_bytes"]
        m["unit_bytes"] = obs[0]["unit_bytes"]
        m["world_size"] = case.world_size
        out[phase] = m
    return out


__all__ = ["PHASES", "measure_case", "measure_side"]
