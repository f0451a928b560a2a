"""Models of torch bugs: what a known limitation does, exactly (docs/design.md, "Known
limitations").

A known limitation is a model of its bug, not a filter. A (case, property) is "known" only
when what was observed equals what the model predicts; anything else in the same
configuration is a failure, and names the entry that explained the rest.

Rules, per model:
- ``Effect`` (a wrong value): ``save`` maps the dict a correct save returns to the dict this
  torch returns; ``load`` maps the state a correct load leaves to the state this torch
  leaves (``shards_from``: the full dict an FSDP1 load cuts each rank's state from, where
  that differs by rank); ``stored`` maps a dict to what this torch's storage layer (DCP)
  reads back of it; ``rekeyed`` maps a correct PARAM_ID rekey to this torch's;
  ``optim_loaded`` maps the state a correct plain ``Optimizer.load_state_dict`` leaves to
  this torch's; ``zero_grads`` names the params that train on zero gradients instead of
  none (the baseline is trained so); ``runs_as`` names the case whose correct result this
  torch gives (the reference layouts and the baseline are built from it); ``local_grads``
  names the gradients a rank keeps to itself (the baseline trains one replica per rank).
  The case is judged again with every expectation passed through them
  (properties/expectation.py; the single-process baseline resumes from the modelled state,
  one replica per distinct start where the load differs by rank); a property that passes
  then is "known", one that still fails is a "fail" whose detail is the residual diff.
- ``Raises`` (an exception): every exception the detail shows is of type ``exc`` (or one of
  ``alongside``: a wrapper), and every one of type ``exc`` has a message matching
  ``message`` (a regular expression, searched); where the detail carries the
  traceback, one of its frames is a function named in ``where``.
- ``Outcome`` (P15, the load of damaged input): the verdict's first line matches
  ``headline`` (a regular expression, matched in full) and every rank's exception line, if
  any, is explained by ``raises``.

Every entry has one of these models: the text of a failure is never a model (an entry whose
consequences no transform predicts is not done).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Union

# An exception line, in a traceback or quoted by a verdict ("rank 1: ValueError: ...",
# "refused optim_rank0.pt: UnpicklingError: ..."): the class name and the message.
_EXC = re.compile(r"(?:^|[\s:(])(?:[A-Za-z_]\w*\.)*(?P<type>[A-Z][A-Za-z0-9_]*"
                  r"(?:Error|Exception|Interrupt)): (?P<msg>.*)$", re.M)
# A bare exception line ending a traceback (``assert x`` raises "AssertionError" alone).
_BARE = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?P<type>[A-Z][A-Za-z0-9_]*(?:Error|Exception))\s*$",
                   re.M)
_DIFF_COUNT = re.compile(r"^\d+ differences?:$", re.M)
_FRAME = re.compile(r'^\s*File "[^"]+", line \d+, in (?P<fn>[\w<>]+)\s*$', re.M)


def raised_in(detail: str) -> list[tuple[str, str, str]]:
    """Every (exception type, message, function of the last traceback frame before it; ""
    when none) the detail shows, in order. A traceback's message may run over several lines;
    its first line is the one kept; a bare exception line (an ``assert`` without a message)
    has the message ""."""
    found = [(m.start(), m["type"], m["msg"].strip()) for m in _EXC.finditer(detail)]
    found += [(m.start(), m["type"], "") for m in _BARE.finditer(detail)]
    frames = [(m.start(), m["fn"]) for m in _FRAME.finditer(detail)]
    return [(t, msg, next((fn for at, fn in reversed(frames) if at < pos), ""))
            for pos, t, msg in sorted(found)]


def exceptions_in(detail: str) -> list[tuple[str, str]]:
    """Every (exception type, message) the detail shows, in order (:func:`raised_in`)."""
    return [(t, msg) for t, msg, _ in raised_in(detail)]


def frames_in(detail: str) -> list[str]:
    """The function names of every traceback frame in the detail."""
    return [m["fn"] for m in _FRAME.finditer(detail)]


@dataclass(frozen=True, kw_only=True)
class Raises:
    """The bug is an exception."""

    exc: str
    """The exception's class name, e.g. ``"KeyError"``."""
    message: str
    """A regular expression its message matches (``re.search``)."""
    where: tuple[str, ...] = ()
    """The torch functions that raise it (one must be a frame of the traceback, where the
    detail carries one); empty where the detail never does (a refusal quoted in one line)."""
    alongside: tuple[str, ...] = ()
    """Other exception types the same failure shows: a wrapper (DCP's
    ``CheckpointException``) or an earlier refusal of the same file."""

    def explains(self, detail: str) -> bool:
        """Whether every exception in ``detail`` is this one (module rules); a detail that
        also lists differences is never only an exception."""
        found = exceptions_in(detail)
        if not found or _DIFF_COUNT.search(detail):
            return False
        if any(typ not in (self.exc,) + self.alongside for typ, _ in found):
            return False
        mine = [msg for typ, msg in found if typ == self.exc]
        if not mine or not all(re.search(self.message, msg) for msg in mine):
            return False  # every exception of its type is this one: another is a second bug
        frames = frames_in(detail)
        return not (frames and self.where and not set(self.where) & set(frames))

    def describe(self) -> str:
        where = f" in {' / '.join(self.where)}" if self.where else ""
        return f"raises {self.exc} matching /{self.message}/{where}"


Transform = Callable[[dict, Any], dict]
"""``(dict, expectation) -> dict``: never mutates its argument. The expectation
(properties/expectation.py ``Expectation``) gives the case (``.case``), the rank whose own
state is judged (``.judged_rank``) and the case's recorded evidence (``.seen()``)."""


@dataclass(frozen=True, kw_only=True)
class Effect:
    """The bug is a wrong value."""

    what: str
    """The effect in words, e.g. ``"exp_avg := exp_avg_sq of the same param"``."""
    save: Transform | None = None
    """The dict a correct save returns -> the dict this torch's save returns."""
    load: Transform | None = None
    """The state a correct load leaves -> the state this torch's load leaves (FSDP1: each
    rank's local dict; FSDP2: the full dict, sharded afterwards by the reference)."""
    load_by_rank: bool = False
    """Whether ``load`` acts differently on different load ranks (it reads
    ``Expectation.judged_rank``): the baseline then resumes each rank from its own modelled
    state (properties/baseline.py)."""
    shards_from: Transform | None = None
    """FSDP1: the full dict a correct load cuts the judged rank's local state from -> the
    full dict this torch's load cuts it from, where that differs by rank
    (``Expectation.judged_rank``); the reference shards it as it shards a correct one, and
    ``load`` then acts on the rank's local dict."""
    stored: Transform | None = None
    """The dict a correct storage layer reads back -> what this torch's reads back (DCP's
    write and read of a saved dict: P8)."""
    rekeyed: Transform | None = None
    """The PARAM_ID dict a correct ``rekey_optim_state_dict`` returns -> what this torch's
    returns (P5 on the rekey path)."""
    optim_loaded: Transform | None = None
    """The state a correct ``torch.optim.Optimizer.load_state_dict`` leaves -> what this
    torch's leaves (P5: the PARAM_ID dict loaded into the unwrapped model's optimizer)."""
    weights: Transform | None = None
    """The params (``{fqn: tensor}``, rank 0's) a user's load that restores the weights
    correctly leaves -> what it leaves under this torch (a custom path's P3, which reads
    the weights right after the user's load; the run's paths load the weights themselves)."""
    zero_grads: Callable[[int, Any], frozenset] | None = None
    """``(step, case) ->`` the params that get a zero gradient at that training step where a
    correct FSDP leaves none (the single-process baseline of P2/P6/P10 trains them so)."""
    runs_as: Callable[[Any], Any] | None = None
    """``case ->`` the case whose correct result this torch gives instead (e.g. the same
    case on the model with its tie broken): the reference layouts and the single-process
    baseline are built from it."""
    local_grads: Callable[[Any], dict] | None = None
    """``case ->`` ``{param FQN: module FQN}``: the params whose gradient through that
    module's use of them FSDP leaves un-reduced: every rank steps such a param on the mean
    over ranks of its other uses' gradients plus its own rows' gradient through that module,
    every other param on the mean; the ranks train apart (the baseline trains one replica
    per rank, properties/baseline.py)."""

    trains_on_shards: bool = False
    """FSDP1 steps the optimizer on each rank's 1-D shards of the params (flat shards, or
    each param's piece under ``use_orig_params``) where the correct run steps the whole
    params: the single-process baseline of P2/P6 trains so (properties/shard_training.py)."""

    def describe(self) -> str:
        return f"changes values: {self.what}"


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """The bug is how a load of damaged input ends (P15)."""

    headline: str
    """A regular expression the verdict's first line matches in full."""
    raises: tuple[Raises, ...] = ()
    """The exceptions the ranks that raised show, one of these (by fault: a truncated
    and a corrupted file raise differently); empty: no rank raised."""
    interchangeable: bool = False
    """The ``raises`` are one observation: which of them a rank shows depends on where the
    fault's bytes land in the file, and another torch writes other bytes. The digest
    (``observation_digest``) then records the headline and that one of them was raised,
    not which, so an upgrade that moves the bytes is no "known changed"; an exception none
    of them matches is still unexplained (it fails)."""

    def explains(self, detail: str) -> bool:
        head, _, rest = detail.partition("\n")
        if not re.fullmatch(self.headline, head):
            return False
        if not self.raises:
            return not exceptions_in(rest)
        return any(r.explains(rest) for r in self.raises)

    def describe(self) -> str:
        raised = " or ".join(r.describe() for r in self.raises)
        return f"ends as /{self.headline}/" + (f", {raised}" if raised else "")


Model = Union[Raises, Effect, Outcome]


def detail_items(detail: str) -> list[str]:
    """The items of a verdict's detail: every non-empty line, stripped, that is not a header
    (ends in ``:``), a difference count (``3 differences:``) or part of a traceback other
    than its exception line (frames and their source lines)."""
    out = []
    in_tb = False
    for ln in detail.splitlines():
        s = ln.strip()
        if s.startswith("Traceback (most recent call last)"):
            in_tb = True
            continue
        if in_tb and (ln.startswith("  ") or not s):
            continue  # a frame, its source line, its caret line
        in_tb = False
        if not s or s.endswith(":"):
            continue
        out.append(s)
    return out


_VOLATILE = re.compile(r"0x[0-9a-f]+|/[^\s:\"']+/")
# A printed floating-point value (``1.3378810793338458e-06``, ``tensor(4.0)``'s ``4.0``,
# ``0.85``), not part of a name (``layers.0.weight``) or a version (``2.13.0``): its last
# digits are the machine's (another CPU, another summation order, other kernels), and where
# a model explains a verdict the value is what the model predicts at the property's
# tolerance, so it is not part of the observation.
_FLOAT = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?"
                    r"|\d+[eE][-+]?\d+|inf|nan)(?![\w.])")


def mask_floats(text: str) -> str:
    """``text`` with every printed floating-point value replaced by ``<float>``."""
    return _FLOAT.sub("<float>", text)
# Lines that say where code was, not what happened: traceback and faulthandler frames (their
# line numbers and function names move with every torch release) and stack-dump headers.
_WHERE = re.compile(r'File "[^"]+", line \d+,? in \S+|Thread 0x[0-9a-f]+.*|'
                    r'Current thread 0x[0-9a-f]+.*|Stack \(most recent call first\).*')


def _observed_items(detail: str) -> list[str]:
    """``detail_items`` without rank-log lines and frames, volatile parts blanked, sorted
    (the ranks report in the order they finish, which is not part of the observation)."""
    items = [i for i in detail_items(detail)
             if not i.startswith(("|", "[rank log")) and not _WHERE.fullmatch(i)]
    return sorted(_VOLATILE.sub("_", i) for i in items)


def _raised(r: Raises, detail: str) -> list[str]:
    """What a ``Raises`` model observes: each exception's type and, for the modelled type,
    the part of its message the model's pattern matches (object reprs and values after it
    are printed differently by torch releases), sorted."""
    out = []
    for typ, msg in exceptions_in(detail):
        m = re.search(r.message, msg) if typ == r.exc else None
        out.append(f"{typ}: {m.group(0)}" if m else typ)
    return sorted(out)


def observation_digest(detail: str, model: Model | None = None) -> str:
    """A digest of what a failure showed, as its model sees it, stable across runs, machines
    and torch releases that show the same thing. ``Raises``: the exceptions (module rule of
    ``_raised``); ``Outcome``: its first line and the exceptions of the ``Raises`` that
    explains the rest (an ``interchangeable`` one: its first line and that one of its
    ``Raises`` was seen); ``Effect`` and no model: the detail's items without rank
    logs and frames, with memory addresses and directories blanked, in sorted order. In
    every form, printed floating-point values are blanked (``mask_floats``): a known pair's
    values are what its model predicts at the property's tolerance, and their last digits
    are the machine's. Same observation, same digest on any machine; another key, element,
    dtype, integer, exception or message where the model reads it, another digest (a wrong
    value the model does not predict is no known pair at all: it fails)."""
    import hashlib

    if isinstance(model, Raises) and model.explains(detail):
        items = _raised(model, detail)
    elif isinstance(model, Outcome) and model.explains(detail) and model.interchangeable:
        items = [detail.partition("\n")[0], "raised one of: " + model.describe()]
    elif isinstance(model, Outcome) and model.explains(detail):
        head, _, rest = detail.partition("\n")
        r = next((r for r in model.raises if r.explains(rest)), None)
        items = [head] + (_raised(r, rest) if r is not None else [])
    else:
        items = _observed_items(detail)
    return hashlib.sha256("\n".join(mask_floats(i) for i in items).encode()).hexdigest()[:16]
