"""A torchrun job for the attach-mode tests: ``torchrun ... attach_job.py MODE OUT.json``.

Rank 0 runs the checks of MODE through ``attach()`` and writes what it saw to OUT.json;
the other ranks only serve.
"""
import json
import os
import sys

import torch.distributed

from fsdp_conformance.harness import RankError, RankTimeout, attach, probes


def main(mode: str, out: str) -> None:
    if mode == "no-close-late-watchdog":
        _late_watchdog_and_exit_report(out + ".atexit.json")
    if mode.endswith("-slow-leaver"):
        _slow_leaver(2.0)
        mode = mode.removesuffix("-slow-leaver")
    pool = attach(timeout=60)
    seen: dict = {"world_size": pool.world_size}
    if mode == "basic":
        seen["whoami"] = pool.run(probes.whoami)
        seen["each"] = [int(t.sum()) for t, _ in
                        pool.run_each(probes.tensor_roundtrip,
                                      [(probes_tensor(r),) for r in range(pool.world_size)])]
        a = pool.run(probes.random_bits, seed=3)
        b = pool.run(probes.random_bits, seed=3)
        seen["seeded_equal"] = all(x[0] == y[0] and x[2].equal(y[2]) for x, y in zip(a, b))
        try:
            pool.run(probes.raise_on, pool.world_size - 1)
            seen["error"] = None
        except RankError as exc:
            seen["error"] = {"ranks": exc.ranks, "text": str(exc)}
        seen["after_error"] = pool.run(probes.whoami)
        scratch = pool.run(probes.scratch_dir)
        pool.close()
        seen["default_group_after_close"] = torch.distributed.is_initialized()
        seen["scratch_left_after_close"] = [d for d in scratch if os.path.exists(d)]
    elif mode in ("no-close", "no-close-late-watchdog"):
        seen["whoami"] = pool.run(probes.whoami)  # the pool is closed at exit
    elif mode in ("rank0-free-hang", "rank0-free-late-hang"):
        # late: rank 0's own part takes 4 s, longer than the watchdog's grace (3 s), and
        # still ends before the 6 s deadline: rank 0 is free when the deadline passes
        call = ((probes.skip_collective, 0) if mode == "rank0-free-hang" else
                (probes.skip_collective_late, 0, 4.0))
        try:
            pool.run(*call, timeout=3 if mode == "rank0-free-hang" else 6)
            seen["timeout"] = None
        except RankTimeout as exc:
            seen["timeout"] = {"ranks": exc.ranks, "text": str(exc)}
    elif mode == "rank0-stuck-hang":
        pool.run(probes.skip_collective, 1, timeout=3)  # exits the process with code 124
        seen["returned"] = True
    with open(out, "w") as f:
        json.dump(seen, f)


def _late_watchdog_and_exit_report(report: str) -> None:
    """What a loaded machine can do: a call's watchdog thread is not scheduled for a while
    after its call ended (here: 0.5 s). And, registered before attach() so that it runs after
    the pool's own exit hook: write which threads are left when the interpreter is about to
    finalize (gloo threads alive then can abort the process)."""
    import atexit
    import importlib
    import threading
    import time

    attach_mod = importlib.import_module("fsdp_conformance.harness.attach")
    watch = attach_mod._Watchdog._watch

    def late_watch(self):
        if self.done.wait(self.timeout):
            time.sleep(0.5)
            return
        watch(self)

    attach_mod._Watchdog._watch = late_watch

    def exit_report():
        with open(report, "w") as f:
            json.dump({"gloo_threads": len(attach_mod._gloo_threads()),
                       "python_threads": [t.name for t in threading.enumerate()]}, f)

    atexit.register(exit_report)


def _slow_leaver(delay: float) -> None:
    """What a loaded machine can do: a serving rank told to leave after a timeout is not
    scheduled for ``delay`` seconds. No rank may exit before it has left, or torchrun stops it
    (SIGTERM, as soon as one rank exits 124) before it has removed its scratch directory."""
    import importlib
    import time

    attach_mod = importlib.import_module("fsdp_conformance.harness.attach")
    leave = attach_mod.AttachedPool._leave

    def slow_leave(self, call_id):
        if self.rank != 0:
            time.sleep(delay)
        leave(self, call_id)

    attach_mod.AttachedPool._leave = slow_leave


def probes_tensor(r):
    import torch

    return torch.full((3,), float(r))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
