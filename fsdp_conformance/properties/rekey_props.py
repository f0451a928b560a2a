"""P5, written once: ``FSDP.rekey_optim_state_dict`` (PARAM_ID <-> PARAM_NAME) against
``reference.rekey_to_ids`` / ``rekey_to_names``. Every observer hands ``p5_rekey`` what
torch did in the uses of its docstring it observed: the conformance run's rekey path,
FSDP -> plain on the dict it saved (``run_props.rekey_seen``); the differential observer
(``sut.rekey.observe``), both uses (``to_plain``, and its observations for plain -> FSDP).

Rules (all bitwise, ``statediff.diff_state_dicts``)

FSDP -> plain (``ToPlain``: rank 0's full dict and what torch made of it there)
    torch's PARAM_ID dict == reference.rekey_to_ids(full) for the plain optimizer (under a
    modelled bug, ``Expectation.rekeyed`` of it); the plain optimizer loads it, and its
    ``state_dict()`` == reference.rekey_to_ids(full) as a load leaves it
    (``Expectation.optim_loaded``), loaded on the rank where the observer recorded it, else
    here (a load the rank recorded that raised is an error, and the rekey back of what it
    loaded is not compared); rekeying back to PARAM_NAME gives ``full`` again (torch raising there is a
    failure). Param groups' ``params`` are compared as sets there (their order follows the
    units); where the rank recorded the loaded dict, torch's rekey of it back to PARAM_NAME
    also == reference.rekey_to_names of it, order included (torch sorts each group's
    params, notes/reference-spec.md section 4). Where observed: rekeying to the key type a
    dict already has returns the same object; the ``optim_input=None`` path ==
    reference.rekey_to_ids without an optimizer. The reference refusing the full dict is an
    error where torch's rekey raised too, a failure where torch returned a dict.
plain -> FSDP (every rank; ``from_plain``: ``sut.rekey.observe``'s records)
    torch's rekey of a plain optimizer's dict to PARAM_NAME == reference.rekey_to_names;
    rekeying that to PARAM_ID gives the plain dict back (the ID -> name -> ID identity);
    a fresh plain optimizer loaded with it has ``state_dict()`` == the original; and
    ``shard_full_optim_state_dict`` of the name-keyed dict == reference.shard_full on every
    rank (P3's comparison; ``shard``), unless the plain optimizer's groups split a flat
    unit, which ``use_orig_params=False`` cannot load.

Verdict: every difference is a failure, listing what raised after it; what raised alone
(a path that did not run or raised where it should have returned) is an error; a pass
counts the comparisons. The controller rebuilds the plain model and optimizer from the case
(same seed, same grouping rule as the rank); it never touches a process group.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .. import reference as ref
from ..cases import Case
from .expectation import EXACT, Expectation
from .statediff import diff_state_dicts, format_diff
from ..zoo.plain import (plain_model, plain_optimizer, plain_optimizer_for,
                         uses_model_order)
from .groups import canon_groups
from .layouts import reference_layout
from .families import FSDP1
from .loaded import p3_loaded
from .reference_props import loaded_states
from .verdict import Verdict, error, fail, na, passed


@dataclass(frozen=True, kw_only=True)
class ToPlain:
    """FSDP -> plain: a full FQN-keyed dict and what torch's rekey made of it on a rank.
    Every value is in its recorded form: the value, ``{"error": traceback}`` where it raised,
    ``{"n/a": reason}`` where it was skipped on purpose, None where it was not recorded."""

    full: Any
    """The full FQN-keyed dict that was rekeyed."""
    model: Any
    """The plain (unwrapped) model the reference rekeys for."""
    optim: Any
    """The plain optimizer the reference rekeys for (and, where ``loaded`` is None, the one
    the PARAM_ID dict is loaded into here)."""
    how: str = ""
    """How the plain optimizer was grouped (for the reference's refusal)."""
    rank: int = 0
    """The rank it was observed on."""
    ids: Any = None
    """torch's rekey of ``full`` to PARAM_ID."""
    loaded: Any = None
    """The plain optimizer's ``state_dict()`` after loading ``ids`` on the rank (None: not
    recorded there; it is loaded here)."""
    names: Any = None
    """torch's rekey back to PARAM_NAME (of ``loaded`` where recorded, else of ``ids``)."""
    same_object: Any = None
    """Whether rekeying ``full`` to PARAM_NAME returned the same object (None: not
    observed)."""
    legacy: Any = None
    """torch's rekey of ``full`` to PARAM_ID without an optimizer (``optim_input=None``;
    None: not observed)."""


def _value(v: Any, what: str, rank: int):
    """(value, None) or (None, why) of one recorded value."""
    if v is None:
        return None, f"{what} was not recorded on rank {rank}"
    if isinstance(v, dict) and "error" in v:
        return None, f"torch raised in {what} on rank {rank}:\n{v['error']}"
    if isinstance(v, dict) and "n/a" in v:
        return None, f"{what} on rank {rank}: n/a ({v['n/a']})"
    return v, None


class _Checks:
    """The comparisons of one P5 verdict, its differences and what raised (module rules)."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.errors: list[str] = []
        self.count = 0

    def same(self, what: str, expected, got) -> None:
        self.count += 1
        diffs = diff_state_dicts(expected, got)
        if diffs:
            self.problems.append(f"{what}:\n{format_diff(diffs)}")

    def verdict(self, summary: str) -> Verdict:
        if self.problems:
            return fail("\n\n".join(self.problems + self.errors))
        if self.errors:
            return error("\n\n".join(self.errors))
        return passed(f"{self.count} comparisons bitwise equal ({summary})")


def _to_plain(case: Case, seen: ToPlain, checks: _Checks, exp: Expectation) -> str:
    """FSDP -> plain (module rules); returns what a pass names."""
    r, model, optim = seen.rank, seen.model, seen.optim
    full, why = _value(seen.full, "the full dict", r)
    if why:
        checks.errors.append(why)
        return "no full dict"
    try:
        correct = ref.rekey_to_ids(full, model, optim=optim)
    except ref.StateDictMismatch as exc:
        if isinstance(seen.ids, dict) and "error" in seen.ids:
            checks.errors.append(
                f"FSDP -> plain: torch's full dict cannot be rekeyed for the unwrapped "
                f"{case.model} model (plain optimizer: {seen.how}); reference: {exc}; torch's "
                f"rekey raised too:\n{seen.ids['error'].strip().splitlines()[-1]}")
        else:
            checks.problems.append(
                f"FSDP -> plain: torch's rekey returned a dict where the reference raises: {exc}")
        return "the full dict cannot be rekeyed"
    if seen.same_object is not None:
        same_obj, why = _value(seen.same_object, "rekey to PARAM_NAME of an FQN-keyed dict", r)
        if why:
            checks.errors.append(why)
        elif same_obj is not True:
            checks.problems.append("rekey of an FQN-keyed dict to PARAM_NAME did not return "
                                   "the same object (the reference's rule, and torch's source)")
    ids, why = _value(seen.ids, "rekey_optim_state_dict(PARAM_ID)", r)
    if why:
        checks.errors.append(why)
        return "rekey to PARAM_ID unavailable"
    checks.same("rekey_optim_state_dict(PARAM_ID) differs from reference.rekey_to_ids",
                canon_groups(exp.rekeyed(correct)), canon_groups(ids))
    loaded = None
    if seen.loaded is None:
        try:
            optim.load_state_dict(ids)
            loaded = optim.state_dict()
        except Exception as exc:  # noqa: BLE001
            checks.problems.append(f"the unwrapped optimizer cannot load the PARAM_ID dict: "
                                   f"{type(exc).__name__}: {exc}")
    else:
        loaded, why = _value(seen.loaded, "loading the PARAM_ID dict into the unwrapped "
                                          "optimizer", r)
        if why:  # the rank's load did not give a state: nothing after it to compare
            checks.errors.append(why)
    if loaded is not None:
        checks.same("the unwrapped optimizer's state_dict() after loading the PARAM_ID dict "
                    "differs from reference.rekey_to_ids",
                    canon_groups(exp.optim_loaded(correct)), canon_groups(loaded))
    names, why = _value(seen.names, "rekey back to PARAM_NAME", r)
    if seen.loaded is not None and loaded is None:
        pass  # the rank rekeyed back what it loaded: nothing was loaded
    elif isinstance(seen.names, dict) and "error" in seen.names:
        checks.problems.append(f"rekey back to PARAM_NAME raised:\n{seen.names['error']}")
    elif why:
        checks.errors.append(why)
    else:
        checks.same("name -> id -> name is not the identity", canon_groups(full),
                    canon_groups(names))
        if seen.loaded is not None and loaded is not None:
            checks.same("rekey back to PARAM_NAME differs from reference.rekey_to_names",
                        ref.rekey_to_names(loaded, model, optim=optim), names)
    if seen.legacy is not None:
        legacy, why = _value(seen.legacy, "rekey_optim_state_dict(PARAM_ID) without an "
                                          "optimizer", r)
        if isinstance(seen.legacy, dict) and "n/a" in seen.legacy \
                and not uses_model_order(model, optim):
            pass  # the optim_input=None path assumes model.parameters() order: not this grouping
        elif why:
            checks.errors.append(why)
        else:
            checks.same("rekey(full, PARAM_ID) without an optimizer (optim_input path) differs "
                        "from reference.rekey_to_ids(optim=None)", ref.rekey_to_ids(full, model),
                        legacy)
    return f"{len(full['state'])} params"


def _plain_to_fsdp(case: Case, observations: Sequence[dict], checks: _Checks) -> None:
    """plain -> FSDP (module rules)."""
    model = plain_model(case)
    optim = plain_optimizer(case, model)
    for obs in observations:
        r = obs["rank"]
        b_osd, why = _value(obs.get("b_osd"), "b_osd", r)
        if why:
            checks.errors.append(why)
            continue
        names, why = _value(obs.get("b_names"), "b_names", r)
        if why:
            checks.errors.append(why)
            continue
        checks.same(f"plain -> FSDP, rank {r}: rekey(osd, PARAM_NAME) differs from "
                    f"reference.rekey_to_names", ref.rekey_to_names(b_osd, model, optim=optim),
                    names)
        checks.same(f"plain -> FSDP, rank {r}: reference.rekey_to_ids(names) is not the plain "
                    f"dict", b_osd, ref.rekey_to_ids(names, model, optim=optim))
        for path, what in (("b_ids", "rekey(rekey(osd, PARAM_NAME), PARAM_ID) (the ID -> name "
                                     "-> ID round trip)"),
                           ("b_reloaded", "a fresh plain optimizer's state_dict() after loading "
                                          "the name-keyed dict via rekey")):
            got, why = _value(obs.get(path), path, r)
            if why:
                checks.errors.append(why)
            else:
                checks.same(f"plain -> FSDP, rank {r}: {what} differs from the plain dict",
                            b_osd, got)


def split_flat_units(layout, full: dict) -> list[str]:
    """Flat units (``use_orig_params=False``) whose params sit in more than one param group
    of ``full``, each as ``"<unit> (groups i, j)"``: no FSDP1 optimizer can hold that."""
    if layout.use_orig_params:
        return []
    group_of: dict[str, set[int]] = {}
    for i, g in enumerate(full.get("param_groups", [])):
        for fqn in g["params"]:
            group_of.setdefault(fqn, set()).add(i)
    out = []
    for unit in layout.units:
        groups = sorted(set().union(*(group_of.get(f, set()) for f in unit.fqns)))
        if len(groups) > 1:
            out.append(f"{unit.name or '<root>'!r} (groups {', '.join(map(str, groups))})")
    return out


def to_plain(case: Case, obs0: dict) -> ToPlain:
    """What ``sut.rekey.observe`` recorded of FSDP -> plain on rank 0, with the plain model
    and the optimizer mirroring the full dict's groups (``plain_optimizer_for``)."""
    model = plain_model(case)
    full = obs0.get("full")
    if isinstance(full, dict) and "state" in full:
        optim, how = plain_optimizer_for(case, model, full)
    else:
        optim, how = plain_optimizer(case, model), "zoo grouping"
    return ToPlain(full=full, model=model, optim=optim, how=how, rank=obs0["rank"],
                   ids=obs0.get("a_ids"), loaded=obs0.get("a_loaded"),
                   names=obs0.get("a_names"), same_object=obs0.get("a_same_object"),
                   legacy=obs0.get("a_ids_legacy"))


def p5_rekey(case: Case, *, to_plain: ToPlain | None = None,
             from_plain: Sequence[dict] = (), shard: bool = True,
             exp: Expectation = EXACT) -> Verdict:
    """P5 of what torch did in the uses observed (module rules): ``to_plain`` (FSDP ->
    plain), ``from_plain`` (plain -> FSDP, every rank's record; ``shard``: with
    ``shard_full_optim_state_dict`` of the name-keyed dict), as this torch is expected to
    rekey and load under ``exp``."""
    if to_plain is None and not from_plain:
        return na("no observations")
    checks = _Checks()
    seen = []
    if to_plain is not None:
        seen.append(f"FSDP -> plain: {_to_plain(case, to_plain, checks, exp)}")
    if from_plain:
        _plain_to_fsdp(case, from_plain, checks)
        seen.append(f"plain -> FSDP on {len(from_plain)} rank(s)")
    verdict = checks.verdict("; ".join(seen))
    if not from_plain or not shard or verdict.status != "pass":
        return verdict
    names, why = _value(from_plain[0].get("b_names"), "b_names", from_plain[0]["rank"])
    if why:
        return error(why)
    layout = reference_layout(case, exp=exp)
    split = split_flat_units(layout, names)
    if split:
        return passed(verdict.detail + "; shard of the rekeyed plain dict not checked: the plain "
                      "optimizer's groups split flat unit(s) " + ", ".join(split) + ", which "
                      "use_orig_params=False cannot load (torch lists the flat param in each of "
                      "those groups; the reference raises)")
    shard_v = p3_loaded(FSDP1, layout, loaded_states(names, from_plain, paths=("b_shard",),
                                                     own_locals=False), exp=exp)
    if shard_v.status != "pass":
        return Verdict(shard_v.status, "shard_full_optim_state_dict of the rekeyed plain dict: "
                       + shard_v.detail)
    return passed(verdict.detail + f"; shard of the rekeyed plain dict: {shard_v.detail}")
