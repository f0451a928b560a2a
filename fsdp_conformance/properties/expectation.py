"""What the properties expect: the correct result, or the correct result with a modelled
torch bug applied (known/model.py ``Effect``).

Rule: every comparison whose observed side went through torch's save passes its expected
side through ``saved``; through torch's load, through ``loaded``; through both, through
both in that order; a saved dict read back from storage (P8's DCP read-back), through
``stored``; torch's PARAM_ID rekey (P5), through ``rekeyed``; a plain
``Optimizer.load_state_dict`` (P5's unwrapped optimizer), through ``optim_loaded``. A bug in training itself
(``zero_grads``) changes the single-process baseline's steps; a bug that makes the run
another configuration's (``runs_as``: a broken tie) changes the case the reference layouts
and the baseline are built from. Under ``EXACT`` every channel is the identity (no zero
gradients), so the properties judge against the correct result. The single-process
baseline (P2, P6) resumes from ``loaded(saved(state at the save))`` under an expectation
(properties/baseline.py), so a modelled bug's consequences on the resumed run are
predicted, not waved through.

Dependencies are explicit: every property and every helper it calls receives the
``Expectation`` it judges against as an argument (``exp``); the run's kinds judge once
under ``EXACT`` and again under each applicable model (known/apply.py ``rejudge`` hands the
judge the expectation). Nothing here is global state.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """What the ranks recorded for the case being judged, for the effects that depend on it
    (an effect whose outcome torch decides from the ranks' own state, e.g. which rank's copy
    DCP keeps); the judge binds it to the expectation (``Expectation.observing``)."""

    save_obs: tuple
    """Every save rank's ``SaveRecord``, in rank order."""
    workdir: object
    """The case's work directory (its files: the DCP directory, the full file)."""


@dataclass(frozen=True, kw_only=True)
class Expectation:
    """A modelled bug bound to one case: the ``Effect`` models of the known entries that
    model it (known/model.py, where each channel is declared and documented once), applied
    in the order given. Every channel below is that composition: a dict transform
    (``saved``, ``loaded``, ``shards_from``, ``stored``, ``rekeyed``, ``optim_loaded``,
    ``weights``: each
    effect's transform in turn, given the dict and this expectation, the identity where none
    has one), the params given zero gradients at a step (their union), the case run as
    (each effect's in turn), the gradients kept per rank (their merge).

    A property receives the expectation it judges against as an argument (``EXACT``: the
    correct result), and passes on what it narrows: the rank whose own state it compares
    (``on_rank``), the case's recorded evidence (``observing``). Two expectations that differ
    only in those are equal (the single-process baseline is cached per case and modelled
    bug, and is the same on every rank)."""

    key: str
    """The known entries modelled ("a+b" for several; "" for the correct result)."""
    effects: tuple = ()
    """Their ``Effect`` models, in order (known/model.py)."""
    case: object = None
    """The case they are bound to (what the transforms model the bug for)."""
    rank: int | None = field(default=None, compare=False)
    """The rank whose own state is compared (``on_rank``); None: a dict that is no one
    rank's own (a path's full dict, a gathered one, a re-save), which is what rank 0
    returns, so a rank-dependent effect acts as on rank 0 there (``judged_rank``)."""
    evidence: Any = field(default=None, compare=False, repr=False)
    """What the ranks recorded for the case being judged (``observing``): a weak reference
    to the ``Evidence`` the judge holds, so an expectation kept as a cache key (the
    baseline's) does not keep a judged case's records alive; None outside."""

    def _chain(self, channel: str, d):
        for e in self.effects:
            f = getattr(e, channel)
            if f is not None:
                d = f(d, self)
        return d

    def saved(self, d: dict) -> dict:
        """The dict a correct save returns -> the dict expected from this torch."""
        return self._chain("save", d)

    def loaded(self, d: dict) -> dict:
        """The state a correct load leaves -> the state expected from this torch."""
        return self._chain("load", d)

    def round_trip(self, d: dict) -> dict:
        """``d`` saved, then loaded."""
        return self.loaded(self.saved(d))

    def shards_from(self, d: dict) -> dict:
        """FSDP1: the full dict a correct load cuts the judged rank's state from -> the one
        this torch's load is expected to cut it from (``on_rank``)."""
        return self._chain("shards_from", d)

    def stored(self, d: dict) -> dict:
        """A saved dict -> what this torch's storage layer (DCP) is expected to read back."""
        return self._chain("stored", d)

    def rekeyed(self, d: dict) -> dict:
        """A correct PARAM_ID rekey -> what this torch's rekey is expected to return."""
        return self._chain("rekeyed", d)

    def optim_loaded(self, d: dict) -> dict:
        """The state a correct plain ``Optimizer.load_state_dict`` leaves -> the state
        expected from this torch's."""
        return self._chain("optim_loaded", d)

    def weights(self, params: dict) -> dict:
        """The params a user's load that restores the weights correctly leaves -> what is
        expected from this torch (``Effect.weights``)."""
        return self._chain("weights", params)

    def zero_grads(self, step: int) -> frozenset:
        """The params (FQNs) that get a zero gradient at ``step`` where no gradient is
        correct (the single-process baseline trains them so)."""
        return frozenset().union(*(e.zero_grads(step, self.case) for e in self.effects
                                   if e.zero_grads is not None))

    def runs_as(self, case):
        """The case whose correct result is expected from this torch (the reference layouts
        and the single-process baseline are built from it)."""
        for e in self.effects:
            if e.runs_as is not None:
                case = e.runs_as(case)
        return case

    def local_grads(self, case) -> dict:
        """``{param FQN: module FQN}``: the gradient of the param through that module's use
        that each rank keeps to itself (the baseline trains one replica per rank)."""
        return {k: v for e in self.effects if e.local_grads is not None
                for k, v in e.local_grads(case).items()}

    @property
    def on_shards(self) -> bool:
        """Whether FSDP1 steps the optimizer on each rank's shards (``Effect.trains_on_shards``):
        the baseline then trains so (properties/shard_training.py)."""
        return any(e.trains_on_shards for e in self.effects)

    @property
    def by_rank(self) -> bool:
        """Whether the modelled load may differ between the load side's ranks (a
        ``shards_from`` effect, or a ``load`` one that says ``load_by_rank``): the baseline
        then resumes each rank from its own modelled
        state and trains the ranks as FSDP does, one replica per distinct start
        (properties/baseline.py)."""
        return any(e.shards_from is not None or e.load_by_rank for e in self.effects)

    def on_rank(self, rank: int) -> "Expectation":
        """This expectation, comparing what rank ``rank`` holds: a load effect that differs
        between ranks (``judged_rank``) acts as it does on that rank."""
        return replace(self, rank=rank)

    @property
    def judged_rank(self) -> int:
        """The rank whose own state is being compared (``on_rank``); 0 when none is (see
        ``rank``)."""
        return 0 if self.rank is None else self.rank

    def observing(self, evidence: Evidence) -> "Expectation":
        """This expectation, judging the case whose ranks recorded ``evidence``: effects
        that need the ranks' own state read it (``seen``) for as long as the caller holds
        ``evidence`` (the judge, while it judges the case)."""
        return replace(self, evidence=weakref.ref(evidence))

    def seen(self) -> Evidence:
        """The recorded evidence of the case being judged; LookupError without it (an
        effect that needs it cannot be applied there, and explains nothing)."""
        ev = self.evidence() if self.evidence is not None else None
        if ev is None:
            raise LookupError("this effect needs the ranks' recorded state "
                              "(Expectation.observing)")
        return ev


EXACT = Expectation(key="")
"""The correct result: every channel the identity, no zero gradients."""
