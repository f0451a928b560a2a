"""NCCL paths of the pool: run only where CUDA GPUs exist (skipped with a reason otherwise)."""
from __future__ import annotations

import pytest
import torch

from fsdp_conformance.harness import RankPool, RankTimeout, pick_backend, probes

pytestmark = pytest.mark.gpu


def test_auto_backend_picks_nccl_when_a_gpu_per_rank_exists():
    assert pick_backend(1, None) == "nccl"
    assert pick_backend(torch.cuda.device_count() + 1, None) == "gloo"


def test_nccl_pool_runs_collectives_and_fsdp_on_the_gpu():
    with RankPool(1, "nccl") as pool:
        assert pool.run(probes.whoami) == [(0, 1, 0)]
        out = pool.run(probes.small_fsdp_task)
        assert set(out[0]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
        assert pool.run(probes.device_of_ctx) == ["cuda:0"]


def test_nccl_timeout_is_reported_and_pool_rebuilt():
    with RankPool(1, "nccl") as pool:
        with pytest.raises(RankTimeout) as info:
            pool.run(probes.sleep, 30, timeout=2)
        assert "sleep" in info.value.failures[0].detail
        assert pool.run(probes.whoami) == [(0, 1, 0)]
