"""A restored LR scheduler is judged by what it does (properties/scheduler_probe.py): a field
whose observed value changes no lr and no other field over the probe's steps is information;
any other difference fails, naming the field and the first lr that differs. Plants of the
issue that asked for it: ``last_epoch`` one short and ``base_lrs`` wrong fail; ``_step_count``
restarted (a scheduler rebuilt from the step, as torchtune does) is information under
``LambdaLR`` and fails under ``CosineAnnealingLR``, whose first step after a restart takes its
closed form."""
from __future__ import annotations

import torch

from fsdp_conformance.cases import Case
from fsdp_conformance.properties.baseline import local_run
from fsdp_conformance.properties.scheduler_probe import SchedulerProbe, judged_diffs
from fsdp_conformance.properties.training_state import with_problems
from fsdp_conformance.properties.verdict import passed
from fsdp_conformance.zoo import optimizers

LAMBDA = Case(api="fsdp1.full", optimizer="adam", scheduler="warmup_cosine", world_size=2)


def _judged(case, want, got):
    return judged_diffs("scheduler after the load vs at the save", want, got,
                        SchedulerProbe(case))


def test_step_count_restarted_under_lambdalr_is_information():
    want = local_run(LAMBDA).sched_at_save
    problems, notes = _judged(LAMBDA, want, {**want, "_step_count": 1})
    assert problems == []
    assert notes and "'_step_count': expected 3, got 1" in notes[0] \
        and "LambdaLR does not read it" in notes[0], notes
    v = with_problems(passed("2 group(s)"), problems, "the scheduler restored", notes)
    assert v.status == "pass" and "information" in v.detail


def test_last_epoch_one_short_fails_naming_the_field_and_the_first_lr():
    want = local_run(LAMBDA).sched_at_save
    problems, notes = _judged(LAMBDA, want, {**want, "last_epoch": want["last_epoch"] - 1})
    assert notes == [] and len(problems) == 1, (problems, notes)
    assert "'last_epoch': expected 2, got 1 (LambdaLR reads it: the lr of group 0 after 1 " \
        "step(s) would be" in problems[0], problems


def test_wrong_base_lrs_fail_naming_the_field_and_the_first_lr():
    want = local_run(LAMBDA).sched_at_save
    problems, _ = _judged(LAMBDA, want, {**want, "base_lrs": [b * 1.1 for b in want["base_lrs"]]})
    assert len(problems) == 1 and "'base_lrs'" in problems[0] \
        and "the lr of group 0 after 1 step(s) would be" in problems[0], problems


def test_step_count_restarted_fails_under_a_class_that_reads_it(monkeypatch):
    cosine = lambda optim: torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=10)  # noqa: E731
    monkeypatch.setitem(optimizers.SCHEDULES, "exp", cosine)
    case = Case(api="fsdp1.full", optimizer="adam", scheduler="exp", world_size=2)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = cosine(opt)
    for _ in range(3):
        opt.step()
        sched.step()
    want = sched.state_dict()
    problems, notes = _judged(case, want, {**want, "_step_count": 0})
    assert notes == [] and len(problems) == 1, (problems, notes)
    assert "'_step_count': expected 4, got 0 (CosineAnnealingLR reads it: the lr of group 0 " \
        "after 1 step(s)" in problems[0], problems


def test_two_fields_that_matter_only_together_are_not_let_through(monkeypatch):
    """Each harmless alone is not enough: the harmless ones are tried together too (a
    scheduler stand-in whose lr changes only when both fields change)."""
    from fsdp_conformance.properties import scheduler_probe

    def run(case, state, start=None):
        return [[1.0 if state["a"] and state["b"] else 0.5]], dict(state), ""

    monkeypatch.setattr(scheduler_probe, "_run", run)
    out = SchedulerProbe(LAMBDA).consequences({"a": 0, "b": 0, "c": 0},
                                             {"a": 1, "b": 1, "c": 0})
    assert set(out) == {"a", "b"} and all("together" in e and "lr of group 0" in e
                                          for e in out.values()), out
    alone = SchedulerProbe(LAMBDA).consequences({"a": 0, "b": 0}, {"a": 1, "b": 0})
    assert alone == {"a": ""}


def test_without_a_probe_every_difference_fails():
    want = local_run(LAMBDA).sched_at_save
    problems, notes = judged_diffs("x", want, {**want, "_step_count": 1}, None)
    assert problems and not notes
