"""pytest plugin (entry point ``pytest11``): shared rank pools for tests.

Rules
- ``rank_pool`` is a session fixture returning ``get(world_size, backend=None)``: the pool
  for that world size, shared by every test of the session (of the xdist worker, under
  pytest-xdist: each worker has its own pools; ports never collide because each pool's
  store binds port 0).
- Pools are closed at the end of the session; no rank process outlives it.
- ``--fsdp-timeout`` sets the per-call timeout (seconds) of these pools.
- Tests marked ``gpu`` are skipped, with the reason, when CUDA is not available.
"""
from __future__ import annotations

import pytest


def pytest_addoption(parser) -> None:
    group = parser.getgroup("fsdp-conformance")
    group.addoption("--fsdp-timeout", type=float, default=None,
                    help="per-call timeout in seconds for rank pools (default 120)")
    parser.addini("fsdp_timeout", "per-call timeout in seconds for rank pools", default="120")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "gpu: needs CUDA (skipped with a reason without it)")


def _timeout(config) -> float:
    opt = config.getoption("--fsdp-timeout")
    return float(opt if opt is not None else config.getini("fsdp_timeout"))


def pytest_collection_modifyitems(config, items) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none (torch "
                                   f"{torch.__version__}, cuda available: False)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def rank_pool(request):
    """``rank_pool(world_size, backend=None)`` -> the session's shared RankPool."""
    from .harness import get_pool

    timeout = _timeout(request.config)

    def get(world_size: int, backend: str | None = None):
        return get_pool(world_size, backend, timeout=timeout)

    return get


def pytest_sessionfinish(session, exitstatus) -> None:
    from .harness import close_pools

    close_pools()
