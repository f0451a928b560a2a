"""P0-P11 of a round trip, judged once for every kind of round trip: the save side's and the
load side's observations against the reference and the single-process run. What differs
between the run's API paths and a user's own save/load code is the view passed in
(properties/view.py ``RoundTripView``: ``torch_files.TorchFiles``, ``user.own_code.OwnCode``).

Rules
- The references are the case family's (properties/family_refs.py).
- When the state the save wrote cannot be had (a save call that raised, shards that do not
  tile, local dicts the reference gather rejects), every property that needs it carries
  that one verdict (one root cause).
- A save or load call that raised (the view's ``stopped``) fails every load-side property
  (P3, P6, P7, P10, P11) with it; P0 and P2 are still judged.
- P2 and P6 are n/a where no single-process run can match (``single_process_unmatched``:
  a model with ignored modules; Muon on params sharded over more than one rank, P2 by the
  save side, P6 by either, or by the load side alone where it continues the state at the
  save); the scheduler after resuming is still judged, and a load side that did not resume
  is P6's error, never n/a.
- P2 judges the trained state (torch's saved dict under the modelled bug; the state in
  memory exactly); P3 and P11 what the save wrote (``Saved.by_torch``: torch's dict, or
  ``Expectation.saved`` of the state in memory).
- The scheduler and the step beside the optimizer (the view's ``training``) are judged by
  P11 (at the save and after the load) and P6 (after resuming).
- A chain's later checkpoint (``continued``: properties/chain.py) judges the resumed training
  against the continuation of the state at its save (as bfloat16's P6 always is), and leaves
  P7 and P10 to the first checkpoint.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from .. import reference as ref
from ..cases import Case, shard_group_size
from ..sut.records import LoadRecord, SaveRecord
from ..zoo import model_spec
from ..zoo.optimizers import sharded_update_unmatched
from . import run_props as rp
from .baseline import local_run
from .catalogue import CATALOGUE
from .chain import LATER_LINK
from .expectation import EXACT, Evidence, Expectation
from .family_refs import family_refs
from .groups import loaded_groups, p11_groups
from .partial import loaded_dicts, p10_partial
from .precision import judged_dtype, own_mp_of, with_precision
from .verdict import Verdict, na
from .training_state import with_problems
from .view import RoundTripView

ROUND_TRIP: tuple[str, ...] = tuple(p.id for p in CATALOGUE
                                    if p.decided_by in ("round trip", "rekey path"))
"""The properties a round-trip case decides."""

LOAD_SIDE: tuple[str, ...] = ("P3", "P6", "P7", "P10", "P11")
"""The properties a save or load call that raised fails."""


def single_process_unmatched(case: Case, sides: tuple[str, ...] = ("save",)) -> str:
    """Why no single-process run can match what ``sides`` ("save": the training before the
    save; "load": the resumed training) train, "" where one can: a model with ignored
    modules, or an optimizer no single-process run matches on sharded params
    (``zoo.optimizers.sharded_update_unmatched``: Muon, a user's by its trait) where a side
    splits params over more than one rank (its shard group, ``cases.shard_group_size``, or
    tensor parallelism)."""
    ignored = model_spec(case.model).ignored
    if ignored:
        return (f"the model has ignored modules {list(ignored)}: FSDP trains them per rank "
                f"on the rank's own rows, and they feed every other param's gradient, so no "
                f"single-process run can match")
    reason = sharded_update_unmatched(case.optimizer)
    if not reason or case.family != "fsdp2":
        return ""
    split = []
    for side in sides:
        ws = case.dst_world_size if side == "load" else case.world_size
        tp = case.tensor_parallel_of(side == "load")
        if shard_group_size(case, ws) > 1 or tp > 1:
            split.append(f"{'resumed' if side == 'load' else 'saved'} on {ws} ranks")
    return f"{case.optimizer} {' and '.join(split)}: {reason}" if split else ""


def _in_memory(refs, save_obs: Sequence[SaveRecord]) -> dict | None:
    """The optimizer's state in memory at the save (the reference gather of the save side's
    local dicts), None where the gather rejects them (P11 then judges the load alone)."""
    try:
        return refs.gather(refs.layout, [o.local for o in save_obs])
    except ref.StateDictMismatch:
        return None


def judge_round_trip(case: Case, save_obs: Sequence[SaveRecord],
                     load_obs: Sequence[LoadRecord] | None, view: RoundTripView, *,
                     exp: Expectation = EXACT, continued: bool = False) -> dict[str, Verdict]:
    """P0-P11 of a round trip as ``view`` shows it (module rules), against ``exp`` with the
    ranks' evidence bound for the effects that need it (``Expectation.observing``: held here
    while the case is judged). ``load_obs``: None where the load side never ran.
    ``continued``: a chain's later checkpoint (module rules)."""
    evidence = Evidence(save_obs=tuple(save_obs), workdir=view.workdir)
    if view.workdir is not None:
        exp = exp.observing(evidence)
    load_obs = list(load_obs or [])
    refs = family_refs(case, exp)
    v: dict[str, Verdict] = {"P0": refs.p0(save_obs, load_obs, case.groups == 1)}
    v.update(view.undecided(case))
    local = local_run(case, exp)
    saved = view.saved(case, refs, save_obs)
    if saved.full is None:
        return {p: v.get(p, saved.bad) for p in ROUND_TRIP}
    full, always = saved.full, view.precision_always
    mp = own_mp_of(save_obs)
    dt, _ = judged_dtype(case, mp)
    from_save = dt == "bf16" or continued  # P6 continues the state at the save
    why = single_process_unmatched(case)
    why_resume = single_process_unmatched(case, ("load",) if from_save else ("save", "load"))
    v["P2"] = na(why) if why else with_precision(
        case, rp.p2_trained(refs.layout, [full], local, dt, exp=exp if saved.by_torch else EXACT),
        always=always, own_mp=mp)
    v.update(view.of_torch(case, refs, full, save_obs, load_obs, exp))
    stopped = view.stopped()
    if stopped is not None:
        v.update({p: stopped for p in LOAD_SIDE})
        return {p: v[p] for p in ROUND_TRIP}
    written = full if saved.by_torch else exp.saved(full)
    v["P3"] = refs.p3(written, load_obs, own=save_obs if case.loads_where_saved else None,
                      per_rank=saved.per_rank)
    weights = view.weights(save_obs, load_obs, exp)
    if weights:
        v["P3"] = with_problems(v["P3"], weights, "")
    training = view.training(case, save_obs, load_obs, local)
    v["P6"] = view.resume_raised() or rp.p6_resume(
        refs.dst, load_obs, local, dt, gather=refs.gather, resume_steps=case.resume_steps,
        case=case, start=rp.save_point(refs.layout, save_obs, refs.gather, exp=exp)
        if from_save and not why_resume else None, unmatched=why_resume, own_mp=mp,
        always_precise=always, exp=exp, scheduler=None if training is None or local.sched_at_end is None
        else "the scheduler after resuming as uninterrupted",
        probe=None if training is None else training.probe)
    info = view.information(save_obs, load_obs)
    if info:
        v["P6"] = dataclasses.replace(v["P6"], detail=v["P6"].detail + "\n\n" + "\n".join(info))
    if continued:
        v["P7"] = v["P10"] = na(LATER_LINK)
    else:
        v["P7"] = view.p7(case, refs, full, save_obs, load_obs, exp)
        v["P10"] = p10_partial(case, layout=refs.layout, dst=refs.dst,
                               full=full if saved.by_torch else None,
                               loaded=loaded_dicts(load_obs), local=local, gather=refs.gather,
                               exp=exp)
    # a later checkpoint's groups at the save are the optimizer's in memory, not a fresh run's
    at_save = _in_memory(refs, save_obs) if continued else local.optim_at_save
    v["P11"] = p11_groups(written, loaded_groups(load_obs), at_save=at_save, training=training,
                          exp=exp, in_memory=not saved.by_torch and not continued)
    return {p: v[p] for p in ROUND_TRIP}


def round_trip_verdicts(case: Case, save_obs: list[SaveRecord], load_obs: list[LoadRecord],
                        workdir: Path, *, exp: Expectation = EXACT,
                        continued: bool = False) -> dict[str, Verdict]:
    """P0-P11 of a run's API path (``torch_files.TorchFiles``: ``workdir`` holds the case's
    files, for P8's DCP read-back; ``continued``: a chain's later checkpoint)."""
    from .torch_files import TorchFiles

    return judge_round_trip(case, save_obs, load_obs, TorchFiles(workdir=workdir), exp=exp,
                            continued=continued)
