"""P5 rekey: ``FSDP.rekey_optim_state_dict`` against ``reference.rekey_to_ids`` /
``rekey_to_names``, on the observations of ``sut.rekey.observe``.

Checked, all bitwise (``compare.diff_state_dicts``):

FSDP -> plain (rank 0)
    torch's rekey of the full dict to PARAM_ID == reference.rekey_to_ids (with the plain
    optimizer mirroring the full dict's groups); loading it into the plain optimizer gives
    ``state_dict()`` == it; rekeying that back to PARAM_NAME == reference.rekey_to_names ==
    the full dict with each group's ``params`` sorted (the name -> ID -> name round trip;
    torch sorts, see notes/reference-spec.md section 4); the ``optim_input=None`` path ==
    reference.rekey_to_ids without an optimizer; rekeying to the key type the dict already
    has returns the same object.
plain -> FSDP (every rank)
    torch's rekey of a plain optimizer's dict to PARAM_NAME == reference.rekey_to_names;
    rekeying that to PARAM_ID gives the plain dict back (the ID -> name -> ID identity);
    a fresh plain optimizer loaded with it has ``state_dict()`` == the original; and
    ``shard_full_optim_state_dict`` of the name-keyed dict == reference.shard_full on every
    rank (the second use in torch's docstring).

The controller rebuilds the plain model and optimizer from the case (same seed, same
grouping rule as the rank); it never touches a process group.
"""
from __future__ import annotations

import copy
from typing import Sequence

from .. import reference as ref
from ..cases import Case
from .statediff import diff_state_dicts, format_diff
from ..sut.rekey import (plain_model, plain_optimizer, plain_optimizer_for,
                         uses_model_order)
from .layouts import reference_layout
from .families import FSDP1
from .loaded import p3_loaded
from .reference_props import loaded_states
from .verdict import Verdict, error, fail, na, passed


def _value(obs: dict, path: str):
    """(value, None) or (None, why): the recorded output of ``path`` on this rank."""
    v = obs.get(path)
    if v is None:
        return None, f"path {path} was not run on rank {obs['rank']}"
    if isinstance(v, dict) and "error" in v:
        return None, f"torch raised in {path} on rank {obs['rank']}:\n{v['error']}"
    if isinstance(v, dict) and "n/a" in v:
        return None, f"{path} on rank {obs['rank']}: n/a ({v['n/a']})"
    return v, None


def _sorted_groups(osd: dict) -> dict:
    out = {**osd, "param_groups": copy.deepcopy(osd["param_groups"])}
    for g in out["param_groups"]:
        g["params"] = sorted(g["params"])
    return out


class _Checks:
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


def _fsdp_to_plain(case: Case, obs0: dict, checks: _Checks) -> str:
    full, why = _value(obs0, "full")
    if why:
        checks.errors.append(why)
        return "no full dict"
    model = plain_model(case)
    optim, how = plain_optimizer_for(case, model, full)
    try:
        want_ids = ref.rekey_to_ids(full, model, optim=optim)
    except ref.StateDictMismatch as exc:
        got = obs0.get("a_ids")
        if isinstance(got, dict) and "error" in got:
            checks.errors.append(
                f"FSDP -> plain: torch's full dict cannot be rekeyed for the unwrapped "
                f"{case.model} model (plain optimizer: {how}); reference: {exc}; torch's "
                f"rekey raised too:\n{got['error'].strip().splitlines()[-1]}")
        else:
            checks.problems.append(
                f"FSDP -> plain: torch's rekey returned a dict where the reference raises: {exc}")
        return "the full dict cannot be rekeyed"
    same_obj, why = _value(obs0, "a_same_object")
    if why:
        checks.errors.append(why)
    elif same_obj is not True:
        checks.problems.append("rekey of an FQN-keyed dict to PARAM_NAME did not return the "
                               "same object (the reference's rule, and torch's source)")
    a_ids, why = _value(obs0, "a_ids")
    if why:
        checks.errors.append(why)
        return "rekey to PARAM_ID unavailable"
    checks.same("FSDP -> plain: rekey(full, PARAM_ID) differs from reference.rekey_to_ids",
                want_ids, a_ids)
    loaded, why = _value(obs0, "a_loaded")
    if why:
        checks.errors.append(why)
    else:
        checks.same("FSDP -> plain: the plain optimizer's state_dict() after loading the "
                    "rekeyed dict differs from that dict", a_ids, loaded)
        back, why = _value(obs0, "a_names")
        if why:
            checks.errors.append(why)
        else:
            checks.same("FSDP -> plain: rekey back to PARAM_NAME differs from "
                        "reference.rekey_to_names", ref.rekey_to_names(loaded, model, optim=optim),
                        back)
            checks.same("FSDP -> plain: the name -> ID -> name round trip is not the full dict "
                        "(each group's params sorted)", _sorted_groups(full), back)
    raw = obs0.get("a_ids_legacy")
    legacy, why = _value(obs0, "a_ids_legacy")
    if isinstance(raw, dict) and "n/a" in raw and not uses_model_order(model, optim):
        pass  # the optim_input=None path assumes model.parameters() order: not this grouping
    elif why:
        checks.errors.append(why)
    else:
        checks.same("FSDP -> plain: rekey(full, PARAM_ID) without an optimizer (optim_input "
                    "path) differs from reference.rekey_to_ids(optim=None)",
                    ref.rekey_to_ids(full, model), legacy)
    return f"{len(full['state'])} params"


def _plain_to_fsdp(case: Case, observations: Sequence[dict], checks: _Checks) -> None:
    model = plain_model(case)
    optim = plain_optimizer(case, model)
    for obs in observations:
        r = obs["rank"]
        b_osd, why = _value(obs, "b_osd")
        if why:
            checks.errors.append(why)
            continue
        names, why = _value(obs, "b_names")
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
            got, why = _value(obs, path)
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


def p5_rekey(case: Case, observations: Sequence[dict], *, shard: bool = True) -> Verdict:
    """P5 on the observations of ``sut.rekey.observe`` (see the module docstring). ``shard``:
    also check ``shard_full_optim_state_dict`` of the rekeyed plain dict (P3's comparison)."""
    if not observations:
        return na("no observations")
    checks = _Checks()
    summary = _fsdp_to_plain(case, observations[0], checks)
    _plain_to_fsdp(case, observations, checks)
    verdict = checks.verdict(f"FSDP -> plain: {summary}; plain -> FSDP on "
                             f"{len(observations)} rank(s)")
    if not shard or verdict.status != "pass":
        return verdict
    names, why = _value(observations[0], "b_names")
    if why:
        return error(why)
    layout = reference_layout(case)
    split = split_flat_units(layout, names)
    if split:
        return passed(verdict.detail + "; shard of the rekeyed plain dict not checked: the plain "
                      "optimizer's groups split flat unit(s) " + ", ".join(split) + ", which "
                      "use_orig_params=False cannot load (torch lists the flat param in each of "
                      "those groups; the reference raises)")
    shard_v = p3_loaded(FSDP1, layout, loaded_states(names, observations, paths=("b_shard",),
                                                     own_locals=False))
    if shard_v.status != "pass":
        return Verdict(shard_v.status, "shard_full_optim_state_dict of the rekeyed plain dict: "
                       + shard_v.detail)
    return passed(verdict.detail + f"; shard of the rekeyed plain dict: {shard_v.detail}")
