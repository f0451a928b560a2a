"""Every ``Case`` field states, where it is declared (``cases.axis``), whether only the load
side reads it and what the single-process baseline trains with; the tables the harness
shares saves and baselines by are read from those declarations."""
from __future__ import annotations

import dataclasses

from fsdp_conformance import cases
from fsdp_conformance.cases import KEEP, LOAD_ONLY, SINGLE_PROCESS, Case


def test_every_field_is_declared_with_axis():
    undeclared = [f.name for f in dataclasses.fields(Case)
                  if set(f.metadata) != {"load_only", "single_process", "shown"}]
    assert not undeclared, f"Case fields not declared with cases.axis(...): {undeclared}"


def test_load_only_fields_are_reset_to_their_defaults_in_both_tables():
    for f in dataclasses.fields(Case):
        if f.metadata["load_only"]:
            assert LOAD_ONLY[f.name] == f.default
            assert SINGLE_PROCESS[f.name] == f.default
    assert "load_world_size" in LOAD_ONLY and "world_size" not in LOAD_ONLY


def test_a_case_with_only_load_fields_changed_shares_its_save_and_baseline():
    a = Case(api="fsdp1.full", world_size=2)
    b = Case(api="fsdp1.full", world_size=2, load_world_size=3, load_plan="root")
    assert dataclasses.replace(a, **LOAD_ONLY) == dataclasses.replace(b, **LOAD_ONLY)
    sp = {**SINGLE_PROCESS, "api": "fsdp1"}
    assert Case(**{**a.to_dict(), **sp}) == Case(**{**b.to_dict(), **sp})
    # a field that changes the single-process steps is kept
    c = Case(api="fsdp1.full", world_size=2, steps=3)
    assert Case(**{**c.to_dict(), **sp}) != Case(**{**a.to_dict(), **sp})
    assert SINGLE_PROCESS["world_size"] == 1 and SINGLE_PROCESS["plan"] == "root"
    assert all(v is not KEEP for v in SINGLE_PROCESS.values())
    assert "steps" not in SINGLE_PROCESS and "optimizer" not in SINGLE_PROCESS
    assert cases.axis(5, shown="/x{}", load_only=True).metadata == {
        "load_only": True, "single_process": 5, "shown": "/x{}"}


def test_a_case_is_its_axes_and_its_kind():
    """``Case`` adds to its ``Axes`` only the kind's fields: every registered kind's flag
    (run/kinds.py) and the kinds' parameters; the axes alone are a record of their own."""
    from fsdp_conformance.cases import KIND_FIELDS, Axes
    from fsdp_conformance.run.kinds import KINDS

    flags = {k.flag for k in KINDS if k.flag}
    assert flags <= set(KIND_FIELDS), (flags, KIND_FIELDS)
    assert set(KIND_FIELDS) == flags | {"inject", "fixtures"}
    assert not flags & {f.name for f in dataclasses.fields(Axes)}
    c = Case(api="fsdp1.full", world_size=2, load_world_size=3, bounds=False, fault="shape")
    assert type(c.axes) is Axes and c.axes.load_world_size == 3
    assert Case(**dataclasses.asdict(c.axes), fault="shape") == c


def test_the_kinds_values_are_checked_before_the_axes():
    """A bad golden or fault value is named first, before an axis's error that would name the
    kind (the order users saw before the split)."""
    import pytest

    with pytest.raises(ValueError, match="golden must be"):
        Case(golden="2.5/x", fault="shape", api="fsdp2.full", nonstrict=True)
    with pytest.raises(ValueError, match="fault must be one of"):
        Case(fault="bogus", world_size=0)
