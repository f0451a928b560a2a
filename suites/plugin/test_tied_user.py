"""Known limitations matched on a user's model by what it has: FSDP1 breaks a tie whose
users sit in different units (tied-across-units-flat-untied), whatever the params are
called; a second bug behind it still fails."""
from __future__ import annotations

import pytest

from fsdp_conformance.user import RoundtripFailure, check
from fsdp_conformance.zoo.ties import ties_across_units
from suites.plugin.tied_user import TinyLM, tokens

ENTRY = "tied-across-units-flat-untied"
OPTS = dict(plan=["proj"], fsdp_version=1, world_sizes=["2"], links=1)


def test_the_tie_across_units_is_found_from_the_users_model_and_plan():
    from fsdp_conformance.user import user_model

    u = user_model(TinyLM, tokens, plan=["proj"])
    u.register()
    (tie,) = ties_across_units(u.name, u.plan_name)
    assert tie.names == ("tok.weight", "proj.weight") and tie.owner == "proj"
    assert tie.owned_by_later_user
    assert ties_across_units(u.name, "root") == ()


def test_a_users_split_tie_is_the_known_limitation_on_builtin_and_own_paths():
    """fsdp1.full (built in) and the user's own full-dict save/load: every property that
    differs is known by the entry's exact effect (the run of the same model untied)."""
    results = check(TinyLM, tokens, paths=["fsdp1.full"], **OPTS)
    results += check(TinyLM, tokens, save_fn="suites.plugin.userfns:save",
                     load_fn="suites.plugin.userfns:load", **OPTS)
    for r in results:
        st = {p: (v.status, v.known) for p, v in r.properties.items()}
        assert not any(s in ("fail", "error") for s, _ in st.values()), (r.case.id, st)
        assert any(s == "known" and k == ENTRY for s, k in st.values()), (r.case.id, st)


def test_a_second_bug_behind_the_split_tie_fails():
    with pytest.raises(RoundtripFailure) as info:
        check(TinyLM, tokens, save_fn="suites.plugin.userfns:save_nudging_exp_avg_sq",
              load_fn="suites.plugin.userfns:load", **OPTS)
    text = str(info.value)
    assert "exp_avg_sq" in text, text
