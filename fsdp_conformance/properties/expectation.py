"""What the properties expect: the correct result, or the correct result with a modelled
torch bug applied (known/model.py ``Effect``).

Rule: every comparison whose observed side went through torch's save passes its expected
side through ``saved``; through torch's load, through ``loaded``; through both, through
both in that order; a saved dict read back from storage (P8's DCP read-back), through
``stored``; torch's PARAM_ID rekey (P5), through ``rekeyed``; a plain
``Optimizer.load_state_dict`` (P5's unwrapped optimizer), through ``optim_loaded``. A bug in training itself
(``zero_grads``) changes the single-process baseline's steps; a bug that makes the run
another configuration's (``runs_as``: a broken tie) changes the case the reference layouts
and the baseline are built from. Outside ``expecting`` every
channel is the identity (no zero gradients), so the properties judge against the correct
result. The single-process baseline (P2, P6) resumes from
``loaded(saved(state at the save))`` under an expectation (properties/baseline.py), so a
modelled bug's consequences on the resumed run are predicted, not waved through.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True, kw_only=True)
class Expectation:
    """A modelled bug bound to one case: the ``Effect`` models of the known entries that
    model it (known/model.py, where each channel is declared and documented once), applied
    in the order given. Every channel below is that composition: a dict transform
    (``saved``, ``loaded``, ``shards_from``, ``stored``, ``rekeyed``, ``optim_loaded``: each
    effect's transform in turn, the identity where none has one), the params given zero
    gradients at a step (their union), the case run as (each effect's in turn), the
    gradients kept per rank (their merge)."""

    key: str
    """The known entries modelled ("a+b" for several; "" for the correct result)."""
    effects: tuple = ()
    """Their ``Effect`` models, in order (known/model.py)."""
    case: object = None
    """The case they are bound to (each transform's second argument)."""

    def _chain(self, channel: str, d):
        for e in self.effects:
            f = getattr(e, channel)
            if f is not None:
                d = f(d, self.case)
        return d

    def saved(self, d: dict) -> dict:
        """The dict a correct save returns -> the dict expected from this torch."""
        return self._chain("save", d)

    def loaded(self, d: dict) -> dict:
        """The state a correct load leaves -> the state expected from this torch."""
        return self._chain("load", d)

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
    def by_rank(self) -> bool:
        """Whether the modelled load may differ between the load side's ranks (a
        ``shards_from`` effect): the baseline then resumes each rank from its own modelled
        state and trains the ranks as FSDP does, one replica per distinct start
        (properties/baseline.py)."""
        return any(e.shards_from is not None for e in self.effects)


EXACT = Expectation(key="")
_CURRENT: ContextVar[Expectation] = ContextVar("fsdpc_expectation", default=EXACT)


def current() -> Expectation:
    """The expectation the properties judge against now."""
    return _CURRENT.get()


@contextlib.contextmanager
def expecting(e: Expectation) -> Iterator[Expectation]:
    """Judge against ``e`` inside the block."""
    token = _CURRENT.set(e)
    try:
        yield e
    finally:
        _CURRENT.reset(token)


def saved(d: dict) -> dict:
    """``d`` (what a correct save returns) as this torch is expected to save it."""
    return current().saved(d)


def loaded(d: dict) -> dict:
    """``d`` (what a correct load leaves) as this torch is expected to leave it."""
    return current().loaded(d)


def shards_from(d: dict) -> dict:
    """``d`` (the full dict a correct FSDP1 load cuts the judged rank's state from) as this
    torch's load is expected to cut it."""
    return current().shards_from(d)


def stored(d: dict) -> dict:
    """``d`` (a saved dict) as this torch's storage layer is expected to read it back."""
    return current().stored(d)


def rekeyed(d: dict) -> dict:
    """``d`` (a correct PARAM_ID rekey) as this torch's rekey is expected to return it."""
    return current().rekeyed(d)


_RANK: ContextVar[int | None] = ContextVar("fsdpc_judged_rank", default=None)


@contextlib.contextmanager
def on_rank(rank: int) -> Iterator[int]:
    """Compare what rank ``rank`` holds inside the block: a load effect that differs between
    ranks (``judged_rank``) acts as it does on that rank."""
    token = _RANK.set(rank)
    try:
        yield rank
    finally:
        _RANK.reset(token)


def judged_rank() -> int:
    """The rank whose own state is being compared (``on_rank``); 0 outside: a dict that is
    no one rank's own (a path's full dict, a gathered one, a re-save) is what rank 0
    returns, so a rank-dependent effect acts as on rank 0 there."""
    r = _RANK.get()
    return 0 if r is None else r


def optim_loaded(d: dict) -> dict:
    """``d`` (what a correct plain ``Optimizer.load_state_dict`` leaves) as this torch's is
    expected to leave it."""
    return current().optim_loaded(d)


def round_trip(d: dict) -> dict:
    """``d`` saved, then loaded."""
    return loaded(saved(d))


def runs_as(case):
    """The case whose correct result is expected from this torch (``case`` itself outside
    ``expecting``)."""
    return current().runs_as(case)


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """What the ranks recorded for the case being judged, for the effects that depend on it
    (an effect whose outcome torch decides from the ranks' own state, e.g. which rank's copy
    DCP keeps); set by the judge around its properties (``observing``)."""

    save_obs: tuple
    """Every save rank's ``SaveRecord``, in rank order."""
    workdir: object
    """The case's work directory (its files: the DCP directory, the full file)."""


_EVIDENCE: ContextVar[Evidence | None] = ContextVar("fsdpc_evidence", default=None)


@contextlib.contextmanager
def observing(*, save_obs, workdir) -> Iterator[Evidence]:
    """Judge the case whose ranks recorded ``save_obs`` (and wrote ``workdir``) inside the
    block: effects that need the ranks' own state read it from ``evidence()``."""
    token = _EVIDENCE.set(Evidence(save_obs=tuple(save_obs), workdir=workdir))
    try:
        yield _EVIDENCE.get()
    finally:
        _EVIDENCE.reset(token)


def evidence() -> Evidence:
    """The recorded evidence of the case being judged; LookupError outside ``observing``
    (an effect that needs it cannot be applied there, and explains nothing)."""
    ev = _EVIDENCE.get()
    if ev is None:
        raise LookupError("this effect needs the ranks' recorded state (expectation.observing)")
    return ev
