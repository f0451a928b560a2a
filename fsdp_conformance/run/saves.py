"""Shared save sides: round-trip cases that differ only in how they load share one save.

Rules
- ``save_key(case)``: the case with every field only its load side reads reset
  (``cases.LOAD_ONLY``: the load world size and plan, ``scheduler_after_load``,
  ``nonstrict``); None for a case that must
  save alone (a user's own path: its save side may read any field).
- A lane keeps the last save it ran (``SaveCache``: one entry, the save ranks' records and
  the directory they wrote, under the run directory). A round-trip case whose key matches
  loads from that directory and is judged on those records instead of saving again. The
  save side is deterministic (same case, same seed -> same bits), so they are the records
  the case's own save gives; a load reads the directory's checkpoint and writes nothing
  another load reads (its own marker files; the judge's DCP read-back file, rewritten each
  time). A save that raised on a rank is never kept, and its directory is removed.
- ``by_save``: the run's cases in groups, one per training key (``sut.trained``: the
  paths of one family that train alike; a case without one goes by its save key, and
  a case without either alone), in the order of each group's first case; inside a group
  the cases of one save key run one after another. A lane takes a whole group, so the
  group's saves after the first of a key are shared, and its save sides after the first
  take the state the first trained (the ranks keep it: sut/trained.py).
"""
from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..cases import LOAD_ONLY, PATHS, Case
from ..sut import trained
from .kinds import kind_record


def save_key(case: Case) -> Case | None:
    """The case as its save side sees it (module rules); None: it saves alone (not a run
    path's, or its kind shares no save: ``KindRecord.shares``)."""
    if case.api not in PATHS or not kind_record(case).shares:
        return None
    return dataclasses.replace(case, **LOAD_ONLY)


def training_key(case: Case) -> tuple | None:
    """The case as its save side's training sees it (``sut.trained.training_key``); None:
    it trains alone (also where its kind shares no training)."""
    return trained.training_key(case) if kind_record(case).shares else None


def by_save(cases: Sequence[tuple[int, Case]]) -> list[list[tuple[int, Case]]]:
    """``(index, case)`` pairs grouped by training key, then save key (module rules)."""
    groups: dict[object, list[tuple[int, Case]]] = {}
    skeys: dict[int, Case | None] = {}
    for i, case in cases:
        tkey, skeys[i] = training_key(case), save_key(case)
        key = (("train", tkey) if tkey is not None else ("save", skeys[i])
               if skeys[i] is not None else ("alone", i))
        groups.setdefault(key, []).append((i, case))
    out = []
    for group in groups.values():
        first: dict[object, int] = {}
        for i, _ in group:
            first.setdefault(skeys[i], i)
        out.append(sorted(group, key=lambda ic: first[skeys[ic[0]]]))  # stable
    return out


@dataclass
class SaveCache:
    """One lane's last save (module rules). Used by one lane's thread only."""

    root: Path
    """Where the lane's save directories go (under the run directory)."""
    key: Case | None = None
    """The kept save's key (None: nothing kept)."""
    records: list | None = None
    """Its save ranks' records, in rank order."""
    directory: Path | None = None
    """The directory its ranks wrote."""
    made: int = 0
    """Save directories made so far (names them)."""
    shared: int = 0
    """Cases that loaded from a kept save instead of saving again."""
    reused_trainings: int = 0
    """Cases whose save side took the state a case of another path trained alike
    (sut/trained.py) instead of training."""

    def get(self, key: Case) -> tuple[list, Path] | None:
        """The kept records and directory if ``key`` is the kept save's, else None."""
        if key != self.key or self.directory is None:
            return None
        self.shared += 1
        return self.records, self.directory

    def fresh_dir(self) -> Path:
        """A new empty directory for the next save (the kept one is dropped first)."""
        self.drop()
        self.made += 1
        d = self.root / f"save-{self.made}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    def put(self, key: Case, records: list, directory: Path) -> None:
        """Keep this save (records and directory) for the cases of the same key."""
        self.key, self.records, self.directory = key, list(records), directory

    def drop(self) -> None:
        """Forget the kept save and remove its directory."""
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
        self.key = self.records = self.directory = None
