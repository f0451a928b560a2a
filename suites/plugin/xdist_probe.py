"""A pytest plugin for the xdist test (``-p suites.plugin.xdist_probe``): after every test it
records which worker ran it and the worker's live rank pools (pids, store ports) and its
forkserver, as JSON lines under ``$FSDPC_PROBE_DIR``."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _record_pools(request):
    yield
    from multiprocessing import forkserver

    from fsdp_conformance.harness import live_pools

    pools = [{"ws": p.world_size, "pids": p.pids, "port": p._store.port}
             for p in live_pools() if p._store is not None]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = {"test": request.node.nodeid, "worker": worker, "pid": os.getpid(), "pools": pools,
            "forkserver": getattr(forkserver._forkserver, "_forkserver_pid", None)}
    with open(Path(os.environ["FSDPC_PROBE_DIR"]) / f"{worker}.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")
