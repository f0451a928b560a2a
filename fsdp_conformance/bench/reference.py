"""``fsdp-conformance bench reference``: what the reference's gather and reshard cost, against
the floor and against torch.

Workload: Adam state (``exp_avg``, ``exp_avg_sq``: fp32, one element per param element; a
0-dim ``step``) of a synthetic model of N = 1e6, 1e7, 1e8 elements in 4 FSDP units of uneven
param shapes, flat (``use_orig_params=False``), FULL_SHARD. The 4 ranks' local dicts are
built from the reference layout (random values).

Measured per size:
  * ``floor``: the same bytes copied once: for each state, ``torch.cat`` of every rank's
    shards into a preallocated output that was touched beforehand (pure copy, no page faults).
  * ``gather``: ``reference.gather_full`` of the 4 local dicts (a new full dict each round).
  * ``reshard``: ``reference.reshard`` of the 4 local dicts to 3 ranks (same plan).
  * ``torch``: ``FSDP.full_optim_state_dict`` (rank0_only) on a 4-rank gloo pool at 1e6 only
    (a 4-layer MLP of 1,002,000 params, one unit per layer, after one Adam step); next to it
    the reference gather and the floor on the very same local dicts.
Time: median of several rounds after one warm-up (bench/stats.summarize). GB/s: bytes of
per-element state in the full dict (2 states x 4 bytes x N) / median time.
Peak memory: each (op, size) runs in a fresh interpreter that builds its inputs, resets the
kernel's peak-RSS mark (``/proc/self/clear_refs`` = 5), runs the op once keeping its output,
and reports ``VmHWM`` minus the RSS before the op (a 1 ms RSS-sampling thread is the
fallback where the reset is not allowed). tracemalloc is not used: it cannot see torch's
allocations. For torch, rank 0's peak is measured the same way inside the rank.
Targets (issue 3): gather median <= 3x the floor at 1e8; reshard peak <= its output plus one
unit (the largest unit's unsharded state, all states).
"""
from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
import time
from typing import Any, Callable

import torch

from .. import reference as ref
from ..report import machine_info, write_json_atomic
from .stats import summarize
from ..bounds.timing import RssSampler, reset_hwm, status_kib
from ..harness import RankPool

SCHEMA = "fsdp-conformance/bench/1"
"""The benchmark contract ``compare`` reads (report/diff_bench.py)."""
WORLD_SIZE = 4
DST_WORLD_SIZE = 3
STATES = ("exp_avg", "exp_avg_sq")
SIZES = (10**6, 10**7, 10**8)
ROUNDS = {10**5: 5, 10**6: 15, 10**7: 7, 10**8: 5}
TORCH_SIZE = 10**6
TARGET_GATHER_X_FLOOR = 3.0
# glibc's mmap threshold fixed at its default (no dynamic raise after a free): every tensor
# of 128 KiB or more is its own mapping and leaves RSS when freed, so RSS follows what the
# code keeps alive rather than what the allocator keeps cached
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


# ----------------------------------------------------------------------------------------
# workload
# ----------------------------------------------------------------------------------------
def model_units(n: int, units: int = 4) -> list[tuple[str, list[tuple[str, tuple[int, ...]]]]]:
    """``layout_from_spec`` units of a model with exactly ``n`` elements: per unit a weight
    ``(m, 997)``, a bias ``(m,)`` and a 1-D gain taking the rest (uneven, prime widths)."""
    per = n // units
    out = []
    for i in range(units):
        b = per if i < units - 1 else n - per * (units - 1)
        m = int(0.9 * b) // 997
        rest = b - m * 997 - m
        out.append((f"layers.{i}", [(f"layers.{i}.w", (m, 997)), (f"layers.{i}.b", (m,)),
                                    (f"layers.{i}.g", (rest,))]))
    return out


def synthetic_layout(n: int, world_size: int = WORLD_SIZE) -> ref.ModelLayout:
    return ref.layout_from_spec(model_units(n), world_size, use_orig_params=False)


def synthetic_locals(layout: ref.ModelLayout, seed: int = 0) -> list[dict]:
    """Every rank's neutral local Adam dict for ``layout`` (fp32, random)."""
    g = torch.Generator().manual_seed(seed)
    keys = layout.optimizer_keys()
    out = []
    for _ in range(layout.world_size):
        state = {}
        for u in layout.units:
            state[u.key] = {"step": torch.tensor(10.0),
                            "exp_avg": torch.randn(u.shard_numel, generator=g),
                            "exp_avg_sq": torch.rand(u.shard_numel, generator=g)}
        out.append({"state": state, "param_groups": [
            {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
             "amsgrad": False, "params": list(keys)}]})
    return out


def state_bytes(layout: ref.ModelLayout) -> int:
    """Bytes of per-element state in the full dict (real elements, both states, fp32)."""
    return sum(p.numel for u in layout.units for p in u.params) * len(STATES) * 4


def local_bytes(layout: ref.ModelLayout) -> int:
    """Bytes of per-element state over all ranks' local dicts (padding included)."""
    return sum(u.shard_numel for u in layout.units) * layout.world_size * len(STATES) * 4


def unit_bytes(layout: ref.ModelLayout) -> int:
    """The largest unit's unsharded state, every per-element state (the "one unit")."""
    return max(u.flat_numel for u in layout.units) * len(STATES) * 4


# ----------------------------------------------------------------------------------------
# timed operations
# ----------------------------------------------------------------------------------------
def _time(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """One warm-up call of each, then ``rounds`` rounds that call each in turn (interleaved,
    so a busy moment of a shared machine hits every op alike); results are dropped."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(rounds + 1):
        for k, fn in fns.items():
            gc.collect()
            t0 = time.perf_counter()
            res = fn()
            dt = time.perf_counter() - t0
            del res
            if i:
                out[k].append(dt)
    return out


def floor_fn(layout: ref.ModelLayout, locals_: list[dict]) -> Callable[[], None]:
    """The copy floor: per state, ``torch.cat`` of every piece into a touched buffer."""
    pieces = {n: [d["state"][u.key][n] for u in layout.units for d in locals_] for n in STATES}
    bufs = {n: torch.empty(sum(p.numel() for p in ps)) for n, ps in pieces.items()}
    for b in bufs.values():
        b.zero_()  # touch every page now: the floor is the copy alone

    def run() -> None:
        for n, ps in pieces.items():
            torch.cat(ps, out=bufs[n])
    return run


# ----------------------------------------------------------------------------------------
# peak memory, in a fresh interpreter per measurement
# ----------------------------------------------------------------------------------------
def peak_of(fn: Callable[[], Any]) -> dict:
    """Run ``fn`` once, keeping its result; RSS before and the peak while it ran (bytes)."""
    gc.collect()
    before = status_kib("VmRSS")
    exact = reset_hwm()
    sampler = RssSampler()
    sampler.start()
    res = fn()
    sampled = sampler.stop() // 1024
    hwm = status_kib("VmHWM") if exact else sampled
    del res
    peak = max(hwm, sampled)
    return {"rss_before_bytes": before * 1024, "peak_bytes": peak * 1024,
            "peak_delta_bytes": (peak - before) * 1024,
            "method": "VmHWM after clear_refs=5" if exact else "VmRSS sampled every 1 ms"}


def _op(op: str, n: int) -> tuple[Callable[[], Any], ref.ModelLayout, int]:
    """``(run once, source layout, output bytes)`` of ``op`` at size ``n``."""
    layout = synthetic_layout(n)
    locals_ = synthetic_locals(layout)
    if op == "gather":
        return (lambda: ref.gather_full(layout, locals_)), layout, state_bytes(layout)
    if op == "reshard":
        dst = synthetic_layout(n, DST_WORLD_SIZE)
        return (lambda: ref.reshard(layout, locals_, dst)), layout, local_bytes(dst)
    raise ValueError(f"unknown op {op!r}")


def _measure_in_process(op: str, n: int) -> dict:
    # warm up at a small size first: imports, torch's thread pool and per-thread buffers are
    # one-time costs of a fresh interpreter, not of the op
    warm, _, _ = _op(op, 10**5)
    warm()
    del warm
    fn, layout, out_bytes = _op(op, n)
    res = peak_of(fn)
    res.update(output_bytes=out_bytes, unit_bytes=unit_bytes(layout), op=op, elements=n,
               malloc_env=" ".join(f"{k}={os.environ[k]}" for k in MALLOC_ENV if k in os.environ))
    return res



def measure_peaks(jobs: list[tuple[str, int]], timeout: float = 900) -> list[dict]:
    """:func:`_measure_in_process` for each ``(op, n)``, each in its own fresh interpreter
    (so earlier work leaves no trace), all at once (peaks are per process)."""
    procs = []
    for op, n in jobs:
        cmd = [sys.executable, "-m", "fsdp_conformance.bench.reference", "--measure", op, str(n)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env={**os.environ, **MALLOC_ENV}))
    out = []
    try:
        for (op, n), p in zip(jobs, procs):
            stdout, stderr = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"peak-memory run {op} {n} failed ({p.returncode}):\n"
                                   f"{stderr[-2000:]}")
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


# ----------------------------------------------------------------------------------------
# torch's own full_optim_state_dict, on the rank pool
# ----------------------------------------------------------------------------------------
def _fix_mmap_threshold() -> None:
    """``mallopt(M_MMAP_THRESHOLD, 128 KiB)`` in this process (what MALLOC_ENV does at start)."""
    import ctypes

    try:
        ctypes.CDLL(None).mallopt(-3, 131072)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _mlp_width(n: int) -> int:
    return max(2, int(math.sqrt(n / 4)))


def torch_full_osd(ctx, n: int, rounds: int) -> dict:
    """Rank function: a 4-layer MLP (4 (d^2 + d) ~ ``n`` fp32 params, one FSDP unit per
    layer, FULL_SHARD, flat), one Adam step, then ``FSDP.full_optim_state_dict``
    (rank0_only) ``rounds`` + 1 times (the first is a warm-up), each between barriers.
    Returns the times, this rank's named local dict, and rank 0's peak-RSS delta of one call."""
    import warnings

    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import CustomPolicy

    warnings.filterwarnings("ignore")
    _fix_mmap_threshold()  # like MALLOC_ENV for the controller-side measurements
    d = _mlp_width(n)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(d, d) for _ in range(4)])
    elements = sum(p.numel() for p in model.parameters())
    fsdp = FSDP(model, process_group=ctx.group, device_id=ctx.device, use_orig_params=False,
                auto_wrap_policy=CustomPolicy(lambda m: isinstance(m, nn.Linear)))
    optim = torch.optim.Adam(fsdp.parameters(), lr=1e-3)
    fsdp(torch.randn(8, d)).sum().backward()
    optim.step()
    names = {id(p): k.replace("_fsdp_wrapped_module.", "") for k, p in fsdp.named_parameters()}
    keys = [names[id(p)] for g in optim.param_groups for p in g["params"]]
    osd = optim.state_dict()
    local = {"state": {keys[i]: {k: v.clone() for k, v in s.items()} for i, s in osd["state"].items()},
             "param_groups": [{**g, "params": [keys[i] for i in g["params"]]}
                              for g in osd["param_groups"]]}
    dist.barrier(group=ctx.group)
    # the first call is the memory measurement (nothing freed yet that the allocator could
    # hand back unseen) and the warm-up
    peak = peak_of(lambda: FSDP.full_optim_state_dict(fsdp, optim, rank0_only=True))
    times = []
    for _ in range(rounds):
        dist.barrier(group=ctx.group)
        gc.collect()
        t0 = time.perf_counter()
        full = FSDP.full_optim_state_dict(fsdp, optim, rank0_only=True)
        dist.barrier(group=ctx.group)
        times.append(time.perf_counter() - t0)
        del full
    return {"times": times, "local": local, "peak": peak, "width": d, "elements": elements}


def _torch_group(rounds: int, progress) -> list[dict]:
    from torch import nn

    progress(f"torch: FSDP.full_optim_state_dict at ~{TORCH_SIZE:.0e} on a {WORLD_SIZE}-rank pool")
    # a pool of its own: the rank function changes malloc settings for the memory figure
    with RankPool(WORLD_SIZE, "gloo") as pool:
        res = pool.run(torch_full_osd, TORCH_SIZE, rounds, timeout=900)
        d, n = res[0]["width"], res[0]["elements"]
        with torch.device("meta"):
            model = nn.Sequential(*[nn.Linear(d, d) for _ in range(4)])
        layout = ref.build_layout(model, ["0", "1", "2", "3"], WORLD_SIZE, use_orig_params=False)
        locals_ = [r["local"] for r in res]
        times = [max(ts) for ts in zip(*(r["times"] for r in res))]  # the slowest rank per round
        nbytes = state_bytes(layout)
        # (timed while the pool's ranks sit idle, as they did for torch's own calls)
        t = _time({"floor": floor_fn(layout, locals_),
                   "gather": lambda: ref.gather_full(layout, locals_)}, rounds)
        floor, gather = t["floor"], t["gather"]
    mem = res[0]["peak"]
    common = {"elements": n, "world_size": WORLD_SIZE, "layout": f"4 x Linear({d}, {d}), flat"}
    return [
        _entry("torch_full_optim_state_dict", "torch", common, times, nbytes,
               peak=mem | {"output_bytes": nbytes, "unit_bytes": unit_bytes(layout)},
               note="rank0_only, gloo, 4 ranks on this machine; slowest rank per round"),
        _entry("gather", "torch", common, gather, nbytes, note="reference, same local dicts"),
        _entry("floor", "torch", common, floor, local_bytes(layout), note="same local dicts"),
    ]


# ----------------------------------------------------------------------------------------
# the report
# ----------------------------------------------------------------------------------------
def _entry(op: str, group: str, params: dict, samples: list[float], nbytes: int,
           peak: dict | None = None, note: str = "") -> dict:
    stats = summarize(samples)
    extra = {"bytes": nbytes, "gb_per_s": nbytes / stats["median"] / 1e9, "note": note}
    if peak is not None:
        extra["memory"] = peak
    return {"name": f"{op}[{group}]", "group": group,  # unique: compare matches by name
            "fullname": f"bench/reference.py::{op}[{group}]", "params": {"op": op, **params},
            "stats": stats, "extra_info": extra}


def run_bench(quick: bool = False, progress=print, with_torch: bool = True) -> dict:
    t_start = time.perf_counter()
    say = progress
    progress = lambda msg: say(f"[{time.perf_counter() - t_start:6.1f} s] {msg}")  # noqa: E731
    sizes = (10**6,) if quick else SIZES
    benches: list[dict] = []
    for n in sizes:
        rounds = 3 if quick else ROUNDS[n]
        progress(f"N={n:.0e}: building {WORLD_SIZE} ranks' local dicts")
        layout = synthetic_layout(n)
        dst = synthetic_layout(n, DST_WORLD_SIZE)
        locals_ = synthetic_locals(layout)
        nbytes = state_bytes(layout)
        common = {"elements": n, "world_size": WORLD_SIZE, "units": len(layout.units),
                  "layout": "flat, FULL_SHARD"}
        progress(f"N={n:.0e}: timing floor, gather, reshard ({rounds} rounds each)")
        t = _time({"floor": floor_fn(layout, locals_),
                   "gather": lambda: ref.gather_full(layout, locals_),
                   "reshard": lambda: ref.reshard(layout, locals_, dst)}, rounds)
        floor, gather, reshard = t["floor"], t["gather"], t["reshard"]
        del locals_
        gc.collect()
        progress(f"N={n:.0e}: peak memory of gather and reshard (fresh interpreters)")
        mg, mr = measure_peaks([("gather", n), ("reshard", n)])
        group = f"{n:.0e}".replace("e+0", "e")
        benches.append(_entry("floor", group, common, floor, local_bytes(layout),
                              note="torch.cat into a preallocated, touched buffer"))
        benches.append(_entry("gather", group, common, gather, nbytes, peak=mg))
        benches.append(_entry("reshard", group, {**common, "dst_world_size": DST_WORLD_SIZE},
                              reshard, nbytes, peak=mr, note=f"{WORLD_SIZE} -> {DST_WORLD_SIZE} ranks"))
    if with_torch:
        benches.extend(_torch_group(3 if quick else 10, progress))
    info = machine_info()
    report = {"schema": SCHEMA, "bench": "reference", "machine_info": info, "commit_info": info.get("commit_info"),
              "datetime": info.get("datetime"), "version": _version(), "quick": quick,
              "benchmarks": benches,
              "targets": {"gather_x_floor_max": TARGET_GATHER_X_FLOOR, "gather_x_floor_at": max(sizes),
                          "reshard_peak_max": "output_bytes + unit_bytes"}}
    report["results"] = evaluate(report)
    return report


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("fsdp-conformance")
    except Exception:  # noqa: BLE001
        return "unknown"


def _find(report: dict, op: str, group: str) -> dict | None:
    return next((b for b in report["benchmarks"] if b["params"]["op"] == op and b["group"] == group),
                None)


def evaluate(report: dict) -> dict:
    """Ratios and target verdicts (``misses`` lists the targets not met)."""
    out: dict[str, Any] = {"gather_x_floor": {}, "reshard_peak_over_output_in_units": {},
                           "misses": []}
    groups = sorted({b["group"] for b in report["benchmarks"]})
    for g in groups:
        floor, gather, reshard = (_find(report, op, g) for op in ("floor", "gather", "reshard"))
        if floor and gather:
            out["gather_x_floor"][g] = gather["stats"]["median"] / floor["stats"]["median"]
        if reshard and "memory" in reshard["extra_info"]:
            m = reshard["extra_info"]["memory"]
            out["reshard_peak_over_output_in_units"][g] = (
                (m["peak_delta_bytes"] - m["output_bytes"]) / m["unit_bytes"])
    t = report["targets"]
    at = f"{t['gather_x_floor_at']:.0e}".replace("e+0", "e")
    x = out["gather_x_floor"].get(at)
    if x is not None and x > t["gather_x_floor_max"]:
        out["misses"].append(f"gather at {at}: {x:.2f}x the copy floor (target <= "
                             f"{t['gather_x_floor_max']}x)")
    for g, u in out["reshard_peak_over_output_in_units"].items():
        if g != "torch" and u > 1.0:
            out["misses"].append(f"reshard at {g}: peak is {u:.2f} units above its output "
                                 "(target <= 1)")
    return out


def _mb(b: float) -> str:
    return f"{b / 2**20:,.0f} MiB" if abs(b) >= 2**20 else f"{b / 1024:,.0f} KiB"


def render_table(report: dict) -> str:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="reference gather / reshard vs copy floor and torch "
                        f"(Adam fp32, {WORLD_SIZE} ranks; medians)")
    for col in ("N", "op", "median", "min", "rounds", "GB/s", "x floor", "peak - before",
                "output", "1 unit", "note"):
        table.add_column(col, justify="left" if col in ("op", "note") else "right")
    res = report.get("results") or evaluate(report)
    for b in report["benchmarks"]:
        g, op, s, e = b["group"], b["params"]["op"], b["stats"], b["extra_info"]
        floor = _find(report, "floor", g)
        xf = s["median"] / floor["stats"]["median"] if floor else float("nan")
        m = e.get("memory")
        table.add_row(
            f"{b['params']['elements']:,}" if g == "torch" else g, op,
            f"{s['median'] * 1e3:,.1f} ms", f"{s['min'] * 1e3:,.1f} ms", str(s["rounds"]),
            f"{e['gb_per_s']:.2f}", f"{xf:.2f}",
            _mb(m["peak_delta_bytes"]) if m else "", _mb(m["output_bytes"]) if m else "",
            _mb(m["unit_bytes"]) if m else "", e.get("note", ""))
    console = Console(record=True, width=160)
    console.print(table)
    for k, v in res["gather_x_floor"].items():
        console.print(f"gather / floor at {k}: {v:.2f}x")
    for k, v in res["reshard_peak_over_output_in_units"].items():
        console.print(f"reshard peak above its output at {k}: {v:.2f} units")
    return console.export_text()


def main(out: str = "reports/bench-reference.json", quick: bool = False) -> int:
    report = run_bench(quick=quick)
    render_table(report)
    write_json_atomic(out, report)
    print(f"wrote {out}")
    for m in report["results"]["misses"]:
        print(f"TARGET MISSED: {m}")
    return 1 if report["results"]["misses"] else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--measure":
        print(json.dumps(_measure_in_process(sys.argv[2], int(sys.argv[3]))))
        sys.exit(0)
    sys.exit(main(*(sys.argv[1:2] or ["reports/bench-reference.json"])))
