"""Shared save sides (run/saves.py): round trips that differ only in how they load are
decided on one save exactly as each is on its own."""
from __future__ import annotations

import dataclasses
import re

from fsdp_conformance.cases import Case
from fsdp_conformance.run.execute import run_all, run_case
from fsdp_conformance.run.saves import by_save, save_key

SHARED = [
    Case(api="fsdp1.full", optimizer="adam", world_size=2, load_world_size=1),
    Case(api="fsdp2.sharded", optimizer="adam", model="unused", world_size=2, load_world_size=3),
    Case(api="fsdp1.full", optimizer="adam", world_size=2, load_world_size=3),
    Case(api="fsdp2.sharded", optimizer="adam", model="unused", world_size=2, load_world_size=1,
         nonstrict=True),
    Case(api="fsdp1.full", optimizer="adam", world_size=2, load_world_size=2, load_plan="root"),
]


def _decided(results) -> list:
    """Status, known entry, digest and detail of every property (memory addresses in the
    ranks' stack dumps blanked: they differ between any two runs)."""
    return [(r.case.id, {p: (v.status, re.sub(r"0x[0-9a-f]+", "0x_", v.detail), v.known,
                             v.digest) for p, v in r.properties.items()}) for r in results]


def test_save_keys_group_the_cases_whose_save_is_the_same():
    groups = by_save(list(enumerate(SHARED)))
    assert [[i for i, _ in g] for g in groups] == [[0, 2, 4], [1, 3]]
    base = Case(api="fsdp1.full", optimizer="adam")
    for other in (dataclasses.replace(base, world_size=3), dataclasses.replace(base, seed=1),
                  dataclasses.replace(base, plan="root"), dataclasses.replace(base, steps=0)):
        assert save_key(other) != save_key(base)  # another save
    for alone in (dataclasses.replace(base, fault="shape"), Case(api="custom:mine")):
        assert save_key(alone) is None
    assert len(by_save([(0, Case(api="custom:mine")), (1, Case(api="custom:mine"))])) == 2


def test_cases_sharing_a_save_are_decided_as_each_alone(tmp_path):
    """Same verdicts, details, known entries and digests as every case saving on its own;
    three of the five load from a kept save."""
    shared = run_all(SHARED, lanes=1)
    assert shared.shared_saves == 3
    alone = [run_case(c, tmp_path, backend=None, timeout=120.0) for c in SHARED]
    assert _decided(shared.results) == _decided(alone)
