"""The zoo's LR schedules (zoo/optimizers.py ``SCHEDULES``): named once for the torch-free
``Case`` (``cases.SCHEDULE_NAMES``); every one but the chainable "exp" gives a learning rate
that depends on the scheduler's own state, so a scheduler restored wrongly shows in the
resumed learning rates (what the run's P6 and P11 judge)."""
import pytest
import torch

from fsdp_conformance.cases import SCHEDULE_NAMES, Case
from fsdp_conformance.zoo import build_scheduler
from fsdp_conformance.zoo.optimizers import SCHEDULES


def test_the_case_names_the_zoo_schedules():
    assert tuple(SCHEDULES) == SCHEDULE_NAMES
    assert Case(api="fsdp1.full", scheduler=True).scheduler == "exp"
    assert Case(api="fsdp1.full").scheduler == ""
    assert "+sched:onecycle/" in Case(api="fsdp1.full", scheduler="onecycle").id
    assert "+sched/" in Case(api="fsdp1.full", scheduler=True).id
    with pytest.raises(ValueError, match="scheduler must be one of"):
        Case(api="fsdp1.full", scheduler="cosine")


def _lrs_after_resume(kind: str, restore_scheduler: bool) -> list[float]:
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.1)
    sched = build_scheduler(opt, None, kind)
    for _ in range(3):
        opt.step()
        sched.step()
    o_sd, s_sd = opt.state_dict(), sched.state_dict()
    q = torch.nn.Parameter(torch.zeros(2))
    opt2 = torch.optim.SGD([q], lr=0.1)
    sched2 = build_scheduler(opt2, None, kind)  # built first, then both states loaded
    opt2.load_state_dict(o_sd)
    if restore_scheduler:
        sched2.load_state_dict(s_sd)
    out = []
    for _ in range(3):
        opt2.step()
        sched2.step()
        out.append(opt2.param_groups[0]["lr"])
    return out


@pytest.mark.parametrize("kind", SCHEDULE_NAMES)
def test_a_restored_schedule_resumes_and_only_exp_ignores_its_own_state(kind):
    restored = _lrs_after_resume(kind, True)
    assert _lrs_after_resume(kind, True) == restored  # deterministic
    forgot = _lrs_after_resume(kind, False)
    if kind == "exp":
        assert forgot == restored  # chainable: the next lr comes from group['lr']
    else:
        assert forgot != restored, f"{kind}'s lr does not depend on its state"
