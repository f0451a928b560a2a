"""P0-P11 of a round-trip case: the save side's and the load side's observations judged
against the reference and the single-process run.

Rules
- The family of the case's API path (``sut.registry``) picks the reference layout and the
  family's P0/P1/P3 functions (``fsdp2_run_props`` for ``fully_shard``, ``run_props`` for
  FSDP1); everything else is the same for every path.
- When the save recorded an error or the shards do not tile, every property that needs the
  saved dict carries that one verdict (one root cause).
- P2 and P6 are n/a for models with ignored modules (no single-process run can match).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import reference as ref
from ..cases import Case
from .baseline import local_run
from ..sut.registry import DCP_DIR, api_path
from ..sut.records import LoadRecord, SaveRecord, error_of
from ..zoo import model_spec
from .expectation import EXACT, Evidence, Expectation
from . import run_props as rp
from .precision import judged_dtype, own_mp_of, with_precision
from .training_state import TrainingSeen
from .groups import loaded_groups, p11_groups
from .partial import loaded_dicts, p10_partial
from .catalogue import CATALOGUE, NO_REKEY
from .families import FSDP1, FSDP2
from .flags import p9_flags
from .flatten import p4_flatten
from .idempotent import p7_idempotent
from .rekey_props import p5_rekey
from .family import FamilyReference
from .layouts import reference_layout
from .loaded import p3_loaded, run_states
from .saved import SavedDict, p1_saved
from .sharding import LayoutSide, p0_layout
from .verdict import Verdict, error, na

ROUND_TRIP: tuple[str, ...] = tuple(p.id for p in CATALOGUE
                                    if p.decided_by in ("round trip", "rekey path"))
"""The properties a round-trip case decides."""


@dataclass(frozen=True, kw_only=True)
class FamilyRefs:
    """The references and family-specific property functions of one case."""

    layout: Any
    """The save side's reference layout (FSDP1 ``ModelLayout`` or ``Fsdp2Layout``)."""
    dst: Any
    """The load side's (its world size and plan)."""
    family: FamilyReference
    """The family's reference (properties/families.py): what P3 (properties/loaded.py)
    judges with."""
    exp: Expectation = EXACT
    """The expectation judged against (properties/expectation.py)."""

    @property
    def gather(self) -> Callable[..., dict]:
        """The reference's gather of the ranks' local dicts."""
        return self.family.gather

    def p0(self, save_obs, load_obs, ordered: bool) -> Verdict:
        """P0 (properties/sharding.py) of the save side's records and, where the load side
        ran (``load_obs`` not empty), the load side's."""
        sides = [LayoutSide(label="save side", layout=self.layout,
                            observations=rp.layout_view(save_obs))]
        if load_obs:
            sides.append(LayoutSide(label="load side", layout=self.dst,
                                    observations=rp.layout_view(load_obs)))
        return p0_layout(self.family, sides, ordered=ordered)

    def p1(self, full: dict, save_obs, api: str) -> Verdict:
        """P1 of the full dict ``full`` a round trip's path ``api`` saved (rank 0's, or
        the ranks' shards assembled) against the gather of the save side's local dicts."""
        return p1_saved(self.family, self.layout, [o.local for o in save_obs],
                        [SavedDict(rank=0, label=api, got=full)], exp=self.exp)

    def p3(self, full: dict, load_obs, own=None) -> Verdict:
        """P3 of a round trip's load side that loaded ``full`` (``own``: the save side's
        records where the load is at the save's world size and plan)."""
        return p3_loaded(self.family, self.dst,
                         run_states(self.family, self.dst, full, load_obs, own=own,
                                    exp=self.exp), exp=self.exp)


def family_refs(case: Case, exp: Expectation = EXACT) -> FamilyRefs:
    """The references of the case's FSDP family (``fsdp2_run_props`` for ``fully_shard``,
    ``run_props`` for FSDP1), of the case it runs as under ``exp``."""
    if case.family == "fsdp2":
        from . import fsdp2_run_props as f2

        layout, dst = f2.layouts(case, exp)
        return FamilyRefs(layout=layout, dst=dst, family=FSDP2, exp=exp)
    return FamilyRefs(layout=reference_layout(case, exp=exp),
                      dst=reference_layout(case, load_side=True, exp=exp), family=FSDP1, exp=exp)


def _read_dcp(path: Path, app_state: bool = False) -> dict | None:
    """A DCP directory's optimizer state as one full dict, read without a process group
    (``app_state``: the ``optim`` part of the app state saved under ``APP_KEY``)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = path.parent / "dcp_full.pt"
    try:
        dcp_to_torch_save(str(path), str(out))
        from ..sut.registry import APP_KEY

        d = torch.load(out, weights_only=False)
        return d[APP_KEY]["optim"] if app_state else d["optim"]
    except Exception:  # noqa: BLE001  (P8 reports it as an error)
        return None


def _nested(flat: dict, full: dict) -> dict:
    """A flattened dict read back from DCP (``Case.flatten_optimizer_state_dict``) in the
    nested form, its groups those of the saved dict ``full``; as it is (P8 then shows how it
    differs) when it is not the flattening of such a dict."""
    try:
        return ref.unflatten_osd(flat, [g["params"] for g in full.get("param_groups", [])])
    except ValueError:
        return flat


def round_trip_verdicts(case: Case, save_obs: list[SaveRecord], load_obs: list[LoadRecord],
                        workdir: Path, *, exp: Expectation = EXACT) -> dict[str, Verdict]:
    """P0-P11 of a round-trip case from what the save and load ranks recorded (``workdir``:
    the case's files, for P8's DCP read-back), against ``exp`` with that evidence bound for
    the effects that need it (``Expectation.observing``: held here while the case is
    judged)."""
    evidence = Evidence(save_obs=tuple(save_obs), workdir=workdir)
    exp = exp.observing(evidence)
    api = case.api
    v: dict[str, Verdict] = {}
    ordered = case.groups == 1  # several groups: the optimizer's order is the groups' order
    refs = family_refs(case, exp)
    layout, dst, gather = refs.layout, refs.dst, refs.gather
    v["P0"] = refs.p0(save_obs, load_obs, ordered)
    full, bad = rp.to_full(api, save_obs)
    local = local_run(case, exp)
    if full is None:
        for p in ("P1", "P2", "P3", "P4", "P6", "P7", "P8", "P9", "P10", "P11"):
            v[p] = bad
    else:
        v["P1"] = refs.p1(full, save_obs, api)
        ignored = model_spec(case.model).ignored
        why = (f"the model has ignored modules {list(ignored)}: FSDP trains them per rank on "
               f"the rank's own rows, and they feed every other param's gradient, so no "
               f"single-process run can match") if ignored else ""
        mp = own_mp_of(save_obs)
        dt, _ = judged_dtype(case, mp)
        v["P2"] = na(why) if why else with_precision(
            case, rp.p2_trained(layout, [full], local, dt, exp=exp), always=False, own_mp=mp)
        same = case.loads_where_saved
        v["P3"] = refs.p3(full, load_obs, own=save_obs if same else None)
        why_flat = rp.no_flatten(api)
        v["P4"] = na(why_flat) if why_flat else p4_flatten(refs.family, dst,
                                                           rp.flat_ranks(load_obs))
        load_error = next((e for e in map(error_of, (o.loaded for o in load_obs)) if e), None)
        training = None  # the scheduler and step beside the optimizer, where they are judged
        if case.scheduler and not case.golden and load_error is None:
            step = case.steps if case.app_state else None
            training = TrainingSeen(
                save_obs=save_obs, load_obs=load_obs, local=local, step=step,
                held="the scheduler" + ("" if step is None else f" and step {step}")
                + " restored")
        v["P6"] = rp.p6_resume(
            dst, load_obs, local, dt, gather=gather, resume_steps=case.resume_steps, case=case,
            start=rp.save_point(layout, save_obs, gather, exp=exp)
            if dt == "bf16" and not why else None, unmatched=why, own_mp=mp,
            always_precise=False, exp=exp,
            scheduler=None if training is None or why
            else "the scheduler after resuming as uninterrupted")
        if load_error is None:
            pairs, summary = rp.resaved_pairs(api, full, load_obs, case.plan == case.dst_plan,
                                              dst.shard_groups(), exp=exp)
            v["P7"] = p7_idempotent(pairs, summary=summary)
        else:
            v["P7"] = error("load failed: " + load_error)
        dcp_full = _read_dcp(workdir / DCP_DIR, case.app_state) \
            if api_path(api).writes == "dcp" else None
        if dcp_full is not None and case.flatten_optimizer_state_dict:
            dcp_full = _nested(dcp_full, full)
        v["P8"] = rp.p8_serialise(api, save_obs, load_obs, full, dcp_full, exp=exp)
        from . import fsdp2_run_props as f2

        # the path's declared flip says what P9 judges (sut/roundtrip.py Flip)
        v["P9"] = p9_flags(f2.flags_seen(full, save_obs) if save_obs[0].flip == "offloaded"
                           else rp.flags_seen(layout, api, save_obs, exp=exp))
        v["P10"] = p10_partial(case, layout=layout, dst=dst, full=full,
                               loaded=loaded_dicts(load_obs), local=local, gather=gather,
                               exp=exp)
        v["P11"] = p11_groups(full, loaded_groups(load_obs), at_save=local.optim_at_save,
                              training=training, exp=exp)
    if not api_path(api).rekeys:
        v["P5"] = na(NO_REKEY)
    elif full is None:
        v["P5"] = bad
    else:
        v["P5"] = p5_rekey(case, to_plain=rp.rekey_seen(case, full, load_obs), exp=exp)
    return {p: v[p] for p in ROUND_TRIP}
