"""``fsdp-conformance bench harness``: what a call on a live pool costs, against the usual
spawn-per-test pattern (spawn N fresh interpreters, init the process group, run, destroy,
exit: what PyTorch's MultiProcessTestCase and fairscale's spawn_for_all_world_sizes pay).

Measured per world size: pool start (cold), a no-op round trip (median of many), the small
FSDP task on the pool (median after warm-up), the same task spawn-per-task (median of a few).
"""
from __future__ import annotations

import multiprocessing as mp
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from ..harness import RankPool, probes
from ..report import machine_info, write_json_atomic
from .stats import summarize

SCHEMA = "fsdp-conformance/bench-harness/1"


def _spawned_rank(rank: int, world_size: int, store_path: str, backend: str) -> None:
    import warnings

    import torch
    import torch.distributed as dist

    from ..harness.context import RankContext
    from ..harness.seeding import seed_everything

    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)

    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=300))
    seed_everything(0)
    ctx = RankContext(rank=rank, world_size=world_size, local_rank=rank, backend=backend,
                      device=torch.device("cpu"), group=dist.group.WORLD,
                      scratch=Path(tempfile.gettempdir()))
    probes.small_fsdp_task(ctx)
    dist.destroy_process_group()


def spawn_per_task_seconds(world_size: int, backend: str = "gloo") -> float:
    """Wall time of one spawn -> init -> small FSDP task -> destroy -> exit of every rank."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="fsdpc-spawn-") as tmp:
        store_path = str(Path(tmp) / "store")
        t0 = time.perf_counter()
        procs = [ctx.Process(target=_spawned_rank, args=(r, world_size, store_path, backend))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(600)
        elapsed = time.perf_counter() - t0
        bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
        for p in procs:
            if p.is_alive():
                p.kill()
        if bad:
            raise RuntimeError(f"spawn-per-task baseline failed: (rank, exit code) {bad}")
    return elapsed


def _time_calls(pool: RankPool, fn, n: int, *args) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        pool.run(fn, *args)
        out.append(time.perf_counter() - t0)
    return out


def run_bench(world_sizes=(2, 4), noop_rounds: int = 200, task_rounds: int = 15,
              spawn_rounds: int = 3, progress=print) -> dict:
    results = []
    for ws in world_sizes:
        t0 = time.perf_counter()
        with RankPool(ws, "gloo") as pool:
            start_s = time.perf_counter() - t0
            progress(f"ws={ws}: pool started in {start_s:.2f}s; timing no-op calls")
            _time_calls(pool, probes.noop, 10)
            noop = summarize(_time_calls(pool, probes.noop, noop_rounds))
            progress(f"ws={ws}: timing the small FSDP task on the pool")
            first = _time_calls(pool, probes.small_fsdp_task, 1)[0]
            _time_calls(pool, probes.small_fsdp_task, 2)
            task = summarize(_time_calls(pool, probes.small_fsdp_task, task_rounds))
        spawn = []
        for i in range(spawn_rounds):
            progress(f"ws={ws}: spawn-per-task round {i + 1}/{spawn_rounds}")
            spawn.append(spawn_per_task_seconds(ws))
        spawn_s = summarize(spawn)
        results.append({
            "world_size": ws, "backend": "gloo",
            "pool_start_s": start_s,
            "noop_roundtrip": noop,
            "fsdp_task_pool_first_call_s": first,
            "fsdp_task_pool": task,
            "fsdp_task_spawn_per_task": spawn_s,
            "speedup_median": spawn_s["median"] / task["median"],
        })
    return {"schema": SCHEMA, "machine_info": machine_info(), "results": results,
            "targets": {"speedup_at_ws4_min": 50.0, "noop_roundtrip_max_ms": 10.0}}


def render_table(report: dict) -> str:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="rank pool vs spawn-per-task (gloo, CPU; medians)")
    for col in ("world size", "pool start", "no-op call", "FSDP task (pool)",
                "FSDP task (spawn)", "speed-up"):
        table.add_column(col, justify="right")
    for r in report["results"]:
        table.add_row(str(r["world_size"]), f"{r['pool_start_s']:.2f} s",
                      f"{r['noop_roundtrip']['median'] * 1e3:.2f} ms",
                      f"{r['fsdp_task_pool']['median'] * 1e3:.1f} ms",
                      f"{r['fsdp_task_spawn_per_task']['median']:.2f} s",
                      f"{r['speedup_median']:.0f}x")
    console = Console(record=True, width=110)
    console.print(table)
    return console.export_text()


def check_targets(report: dict) -> list[str]:
    """Targets from issue 2; returns the misses (empty when every target is met)."""
    misses = []
    t = report["targets"]
    for r in report["results"]:
        ms = r["noop_roundtrip"]["median"] * 1e3
        if ms >= t["noop_roundtrip_max_ms"]:
            misses.append(f"ws={r['world_size']}: no-op round trip {ms:.2f} ms >= "
                          f"{t['noop_roundtrip_max_ms']} ms")
        if r["world_size"] == 4 and r["speedup_median"] < t["speedup_at_ws4_min"]:
            misses.append(f"ws=4: pooled FSDP task only {r['speedup_median']:.1f}x cheaper "
                          f"than spawn-per-task (target {t['speedup_at_ws4_min']}x)")
    return misses


def main(out: str = "reports/bench-harness.json", quick: bool = False) -> int:
    report = run_bench(noop_rounds=50 if quick else 200, task_rounds=5 if quick else 15,
                       spawn_rounds=1 if quick else 3)
    render_table(report)
    write_json_atomic(out, report)
    print(f"wrote {out}")
    misses = check_targets(report)
    for m in misses:
        print(f"TARGET MISSED: {m}")
    return 1 if misses else 0
