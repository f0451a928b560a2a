"""P10, written once: where the optimizer holds state for only some params (no step yet, a
stateless optimizer, params without gradients), exactly the params the single-process run
has state for appear, with the same state names, in what was saved and after the load.
Every observer (the conformance run's paths of either family, a user's own path) hands it
the case's reference layouts, what was saved, what the load ranks hold and the
single-process run.

Rules
- A case has partial state when it takes no step before the save, its optimizer is the
  zoo's stateless SGD, its model is the zoo's ``frozen`` or ``unused`` one, or some param
  (outside ignored modules) has no state in the single-process run (``has_partial_state``).
  Where it has not, P10 is n/a (P1 and P3 compare every value).
- What was saved must hold the single-process run's params and state names as this torch is
  expected to save them (properties/expectation.py); what the load ranks hold, gathered by
  the family's reference, those of a save and a load. Params of ignored modules are left out.
  A save whose file is the user's own (``full`` None) is judged after the load only.
- The load is compared only where every rank loaded (a load that raised is P3's); the
  reference refusing the loaded dicts is an error.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from .. import reference as ref
from ..cases import Case
from ..sut.records import error_of
from .expectation import EXACT, Expectation
from .verdict import Verdict, error, fail, na, passed


def _ignored(layout) -> set[str]:
    """The params of ignored modules (left out of P10: FSDP trains them per rank)."""
    return {s.fqn for s in layout.plain_params}


def has_partial_state(case: Case, layout, local) -> bool:
    """Whether the optimizer holds state for only some params in this case (module rules)."""
    if case.steps == 0 or case.optimizer == "sgd" or case.model in ("frozen", "unused"):
        return True
    skip = _ignored(layout)
    have = set(local.optim_at_save["state"])
    return any(n not in have for n in local.params_at_save if n not in skip)


def p10_partial(case: Case, *, layout, dst, full: dict | None, loaded: Sequence[dict] | None,
                local, gather: Callable[[Any, list], dict],
                exp: Expectation = EXACT) -> Verdict:
    """P10 (module rules). ``loaded``: every load rank's local dict, None where some rank's
    load raised; ``gather``: the family's gather of ``dst``'s local dicts."""
    if not has_partial_state(case, layout, local):
        return na("every param has state in this case: nothing partial to check")
    skip = _ignored(layout)

    def shape_of(d):
        return {k: sorted(v) for k, v in d["state"].items() if k not in skip}

    want = shape_of(exp.saved(local.optim_at_save))
    want_back = shape_of(exp.round_trip(local.optim_at_save))
    problems = []
    if full is not None and shape_of(full) != want:
        problems.append(f"saved dict: params/state names {shape_of(full)}, single-process run "
                        f"has {want}")
    if loaded is not None:
        try:
            back = gather(dst, list(loaded))
        except ref.StateDictMismatch as exc:
            return error(f"reference.{gather.__name__} rejected the loaded dicts: {exc}")
        if shape_of(back) != want_back:
            problems.append(f"after loading: params/state names {shape_of(back)}, expected "
                            f"{want_back}")
    if problems:
        return fail("\n".join(problems))
    return passed(f"{len(want)} params with state, as in the single-process run")


def loaded_dicts(load_obs: Sequence) -> list[dict] | None:
    """Every load rank's local dict from its record, None where one has none (its load
    raised or did not run)."""
    if all(o.loaded is not None and not error_of(o.loaded) for o in load_obs):
        return [o.loaded for o in load_obs]
    return None
