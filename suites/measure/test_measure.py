"""measure.measure_case on real FSDP (gloo, 2 ranks): the figures mean what they say."""
from __future__ import annotations

import pytest

from fsdp_conformance.cases import Case
from fsdp_conformance.bounds.measure import measure_case
from fsdp_conformance.zoo.models import build_model, scaled_name

N = 200_000


@pytest.fixture(scope="module")
def full_save_load(tmp_path_factory):
    case = Case(api="fsdp1.full", model=scaled_name(N), plan="nested", world_size=2,
                dtype="fp32", steps=1)
    return measure_case(case, tmp_path_factory.mktemp("m"), repeats=3)


def test_state_bytes_are_adams_two_fp32_states(full_save_load):
    params = sum(p.numel() for p in build_model(scaled_name(N)).parameters())
    m = full_save_load["save"]
    # exp_avg + exp_avg_sq, 4 bytes each; FSDP1 pads each flat unit to a multiple of 2
    assert 8 * params <= m["state_bytes"] <= 8 * params + 8 * 2 * 4
    assert m["unit_bytes"] < m["state_bytes"]


def test_rank0_holds_the_full_dict_after_a_full_save(full_save_load):
    m = full_save_load["save"]
    assert len(m["peak_bytes"]) == 2
    assert m["peak_bytes"][0] >= 0.9 * m["state_bytes"], m
    assert m["peak_method"] in ("hwm", "sampled")


def test_times_floors_and_repeats(full_save_load):
    for phase, m in full_save_load.items():
        assert len(m["times_s"]) == 3 and m["time_s"] == min(m["times_s"]) > 0, phase
        assert len(m["floor_times_s"]) == 3 and m["floor_s"] == min(m["floor_times_s"]) > 0
        assert len(m["cpu_times_s"]) == 3 and m["cpu_s"] == min(m["cpu_times_s"]) > 0
        assert m["floor_cpu_s"] == min(m["floor_cpu_times_s"]) > 0
        assert m["world_size"] == 2
    assert full_save_load["save"]["floor"].startswith("all_gather")
    assert full_save_load["load"]["floor"].startswith("copy")


def test_a_resized_case_is_refused(tmp_path):
    with pytest.raises(ValueError, match="loads at its saving world size"):
        measure_case(Case(api="fsdp1.full", world_size=2, load_world_size=3), tmp_path)


def test_scaled_model_size_and_name():
    assert scaled_name(10**6) == "scaled1000000"
    n = sum(p.numel() for p in build_model("scaled1000000").parameters())
    assert abs(n - 10**6) / 10**6 < 0.05
    with pytest.raises(ValueError, match="scaled<n params>"):
        build_model("scaled0")


def test_rss_sampler_sees_an_allocation_and_stops():
    """The fallback sampler (used where /proc/self/clear_refs cannot reset the high-water
    mark): its stop() once raised TypeError (its Event shadowed Thread._stop)."""
    import time

    import torch

    from fsdp_conformance.bounds.timing import RssSampler

    s = RssSampler()
    s.start()
    x = torch.ones(64 * 2**20, dtype=torch.uint8)
    time.sleep(0.05)
    peak = s.stop()
    assert not s.is_alive()
    assert peak >= x.numel()
