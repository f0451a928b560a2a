"""Properties of one round trip of the conformance run (``sut.roundtrip`` save side at N ->
load side at M) that are not written in a module of their own: P2 and P6 against the
single-process run, and P8 (P0, P1, P3, P4, P5, P7, P9, P10, P11: sharding.py, saved.py,
loaded.py, flatten.py, rekey_props.py, idempotent.py, flags.py, partial.py, groups.py; what
P4, P5, P7 and P9 judge of a round trip: ``flat_ranks``, ``rekey_seen``, ``resaved_pairs``,
``flags_seen``). Each returns a ``Verdict``; inputs are what the
ranks recorded: ``SaveRecord`` / ``LoadRecord`` (``sut.records``), one per rank, in rank
order.

Rules
- "full" is what the path saved, as one FQN-keyed dict: rank 0's dict for the full paths,
  the ranks' shards assembled at their offsets for the sharded paths (``to_full``).
- Tolerances (P2, P6) are per dtype (``TOLERANCES``): tight enough in float64 that a 1% lr
  error, a missing or extra ``step`` or a dropped momentum buffer fails. ``step`` and every
  param-group value are compared exactly in every dtype.
- Params of ignored modules are left out of P2/P6: FSDP trains them per rank on the rank's
  own rows, so no single-process run can match them.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .. import reference as ref
from .expectation import EXACT, Expectation
from .statediff import STEP_KEY, diff_state_dicts, format_diff
from .baseline import LocalRun, continue_from
from ..api_paths import PATH_NAMES, api_path, family_of, sharded_paths
from ..sut.records import LoadRecord, SaveRecord, error_of
from ..zoo.plain import plain_model, plain_optimizer
from .groups import canon_groups
from .precision import TOLERANCES, with_precision
from .training_state import resumed_problems, with_problems
from .flatten import ShardedRank
from .flags import FlagSeen, FlagsSeen
from .idempotent import SameState
from .rekey_props import ToPlain
from .reference_props import comparable, replica_first, rotated_note, sharded_rank
from .verdict import Verdict, error, fail, na, passed

# bfloat16 (8 bits of mantissa) cannot be compared element by element with one tolerance:
# Adam's exp_avg_sq is ~1e-4 where the params are ~1e-1, so an atol that lets rounding
# through swallows whole state tensors. Each tensor is judged against its own scale.
# - P2: the saved state's relative L2 error per tensor against the single-process run.
#   After ``steps`` steps trained apart the two drift (an adaptive optimizer turns a gradient
#   element that rounding pushed across zero into a full +-lr step): measured on torch 2.13,
#   at most 0.138 (RMSprop's square_avg, ws 2), 0.056 (Adagrad), <= 0.011 for the others.
BF16_STATE_NORM_RTOL = 0.25
# - P6: the resumed run against the single-process *continuation of FSDP's own state at the
#   save* (``baseline.continue_from``: the same start bits), judged on the update of the
#   resumed steps (final - start), which is what a wrong lr or a skipped step changes.
#   ``BF16_UPDATE_SCALE_TOL``: |<u, u*> / <u*, u*> - 1| over all params (u: the resumed
#   update, u*: the continuation's). Measured on torch 2.13 over 7 optimizers x fsdp1.full
#   x ws 2, 2->3, 3->1: clean at most 0.0030 (Adadelta 2->3), a 1% lr error at least 0.0052.
#   ``BF16_UPDATE_RTOL``: each param's update, relative L2 error (clean at most 0.116).
BF16_UPDATE_SCALE_TOL = 0.004
BF16_UPDATE_RTOL = 0.25


def _norm_diffs(want: dict, got: dict, rtol: float) -> list[str]:
    """Tensors (nested dicts of them) whose relative L2 error exceeds ``rtol`` or whose dtype
    or shape differs; a missing or extra key counts as a difference too, and anything else
    must be equal exactly (its type included), the step counter (``step``) too."""
    out: list[str] = []

    def walk(w, g, path):
        if isinstance(w, dict) and isinstance(g, dict):
            for k in sorted(set(w) | set(g), key=str):
                if k not in w or k not in g:
                    out.append(f"{path}[{k!r}]: {'missing' if k not in g else 'unexpected'}")
                else:
                    walk(w[k], g[k], f"{path}[{k!r}]")
        elif (isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor) and w.is_floating_point()
              and not path.endswith(f"[{STEP_KEY!r}]")):
            if w.shape != g.shape:
                out.append(f"{path}: shape {tuple(g.shape)}, expected {tuple(w.shape)}")
                return
            if w.dtype != g.dtype:  # a silent cast of the state is a difference in any dtype
                out.append(f"{path}: dtype {g.dtype}, expected {w.dtype}")
            wd, gd = w.double(), g.double()
            err = float((wd - gd).norm() / wd.norm().clamp_min(1e-12))
            if err > rtol:
                out.append(f"{path}: relative L2 error {err:.3g} > {rtol}")
        else:
            # hyperparameters, scalars, the step counter and non-float tensors: exact,
            # described as every other property does (a tuple that came back a list says
            # "got list")
            out.extend(d.describe() for d in diff_state_dicts(w, g, path=path))

    walk(want, got, "")
    return out
SHARDED_PATHS = sharded_paths()


def assemble_sharded(per_rank: Sequence[dict]) -> dict:
    """Every rank's neutral sharded dict (``{"global_shape", "shards": [(offsets, t)]}`` or
    ``{"global_shape", "dtensor", "local", "offsets"}`` values) -> one full FQN-keyed dict.
    Every global element must be covered; shards covering the same elements (replicas under
    HYBRID_SHARD) must agree bitwise (else ``ValueError`` names the param)."""
    state: dict[str, dict] = {}
    for d in per_rank:
        for fqn, st in d.get("state", {}).items():
            out = state.setdefault(fqn, {})
            for name, v in st.items():
                if isinstance(v, dict) and "global_shape" in v:
                    shards = v.get("shards")
                    if shards is None:
                        shards = [(tuple(v["offsets"]), v["local"])]
                    shape = tuple(v["global_shape"])
                    if name not in out:
                        dtype = shards[0][1].dtype if shards else torch.float32
                        out[name] = (torch.zeros(shape, dtype=dtype),
                                     torch.zeros(shape, dtype=torch.int8))
                    full, seen = out[name]
                    for offsets, t in shards:
                        idx = tuple(slice(o, o + n) for o, n in zip(offsets, t.shape))
                        if bool((seen[idx] > 0).any()):  # a replica (HYBRID_SHARD): must agree
                            have = full[idx][seen[idx] > 0]
                            new = t.to(full.dtype)[seen[idx] > 0]
                            if not torch.equal(have.view(-1), new.view(-1)):
                                raise ValueError(f"{fqn}.{name}: replicas of the shard at "
                                                 f"offsets {tuple(offsets)} disagree")
                        full[idx] = t.to(full.dtype)
                        seen[idx] = 1
                elif name not in out:
                    out[name] = v
    result: dict[str, dict] = {}
    for fqn, st in state.items():
        res = {}
        for name, v in st.items():
            if isinstance(v, tuple):
                full, seen = v
                if seen.numel() and not bool((seen == 1).all()):
                    bad = int((seen != 1).flatten().nonzero()[0])
                    raise ValueError(f"{fqn}.{name}: element {bad} is held by no rank's shard")
                res[name] = full
            else:
                res[name] = v
        result[fqn] = res
    groups = per_rank[0].get("param_groups", []) if per_rank else []
    return {"state": result, "param_groups": groups}


def to_full(api: str, obs: Sequence[SaveRecord] | Sequence[LoadRecord], *,
            resaved: bool = False) -> tuple[dict | None, Verdict | None]:
    """The full FQN-keyed dict a path saved: the save side's ``saved``, or with ``resaved``
    the load side's save right after the load."""
    values = [o.resaved if resaved else o.saved for o in obs]
    for o, value in zip(obs, values):
        e = error_of(value)
        if e:
            return None, error(f"torch raised in the {api} save call on rank {o.rank}:\n{e}")
    if api in SHARDED_PATHS:
        try:
            return assemble_sharded(values), None
        except ValueError as exc:
            return None, fail(f"the ranks' shards do not tile the params: {exc}")
    return values[0], None


def layout_view(obs: Sequence[SaveRecord] | Sequence[LoadRecord]) -> list[dict]:
    """What P0 (``sharding.p0_layout``) reads of a side's records, as the dicts of
    ``LayoutSide.observations``: the differential observers' observations are dicts."""
    return [{"rank": o.rank, "keys": o.keys, "meta": o.meta, "mesh_shape": o.mesh_shape}
            for o in obs]


def _plain(layout) -> set[str]:
    return {s.fqn for s in layout.plain_params}


def _without(d: dict, fqns: set[str]) -> dict:
    return {**d, "state": {k: v for k, v in d["state"].items() if k not in fqns}}



def p2_trained(layout, fulls: Sequence[dict], local: LocalRun, dtype: str, *,
               exp: Expectation = EXACT) -> Verdict:
    """P2: the full dict each rank saved (``fulls[r]``; a run's path: rank 0's only) ~= the
    single-process optimizer state after the same steps, of that rank (the ranks differ only
    under a modelled bug that trains them apart, ``LocalRun.save_of``), within the dtype's
    tolerance (bfloat16: the relative L2 error per tensor). Params of ignored modules are left
    out (FSDP trains them per rank). One dict: its verdict; several: every rank that differs,
    named; a save that raised is an error. ``exp``: the save as this torch is expected to
    make it."""
    verdicts = []
    for r, full in enumerate(fulls):
        e = error_of(full)
        if e:
            return error(f"torch raised in the save on rank {r}:\n{e}")
        verdicts.append(_within_tolerance(layout, full, local, dtype, r, exp))
    if len(verdicts) == 1:
        return verdicts[0]
    problems = [f"rank {r}: {v.detail}" for r, v in enumerate(verdicts) if v.status != "pass"]
    return fail("\n\n".join(problems)) if problems else \
        passed(f"{len(fulls)} rank(s) within the tolerance of the single-process run")


def _within_tolerance(layout, full: dict, local: LocalRun, dtype: str, rank: int,
                      exp: Expectation) -> Verdict:
    """One rank's full dict against its single-process state, within the tolerance (the
    body of ``p2_trained``)."""
    rtol, atol = TOLERANCES[dtype]
    skip = _plain(layout)
    want = canon_groups(_without(exp.saved(local.save_of(rank)), skip))
    if dtype == "bf16":
        bad = _norm_diffs(want, canon_groups(_without(full, skip)), BF16_STATE_NORM_RTOL)
        if bad:
            return fail(f"saved state differs from the single-process run (relative L2 error "
                        f"per tensor > {BF16_STATE_NORM_RTOL}):\n" + "\n".join(bad[:20]))
        note = f"; ignored-module params {sorted(skip)} left out (per-rank in FSDP)" if skip else ""
        return passed(f"relative L2 error per tensor <= {BF16_STATE_NORM_RTOL}{note}")
    diffs = diff_state_dicts(want, canon_groups(_without(full, skip)), exact=False, rtol=rtol,
                             atol=atol)
    if diffs:
        return fail(f"saved state differs from the single-process run (rtol={rtol}, "
                    f"atol={atol}):\n" + format_diff(diffs))
    note = f"; ignored-module params {sorted(skip)} left out (per-rank in FSDP)" if skip else ""
    return passed(f"within rtol={rtol}, atol={atol}{note}")


def no_flatten(api: str) -> str:
    """Why P4 (properties/flatten.py) is n/a for the run's path ``api``; "" where it is
    judged (FSDP1's sharded paths)."""
    if api not in SHARDED_PATHS:
        return "a full path: nothing sharded to flatten"
    return "FSDP2 keeps per-parameter state: nothing to flatten" if family_of(api) == "fsdp2" \
        else ""


def flat_ranks(load_obs: Sequence[LoadRecord]) -> list[ShardedRank]:
    """What P4 judges of a sharded path's load side: the sharded dict torch saves after the
    load (``resaved``) against every rank's flat local state after it (``loaded``). A rank's
    flat state is flattened from the sharded dicts of its own shard group (under
    HYBRID_SHARD, its replica; under NO_SHARD with original params, its own; whether the
    replicas agree is P7's and P6's)."""
    out = []
    for o in load_obs:
        e = error_of(o.resaved) or error_of(o.loaded)
        if e:
            out.append(ShardedRank(rank=o.rank, problem=error(f"torch raised on rank {o.rank}:\n{e}")))
        else:
            out.append(sharded_rank(o.rank, o.resaved, flat=o.loaded))
    return out


def save_point(layout, save_obs: Sequence[SaveRecord], gather=ref.gather_full, *,
               exp: Expectation = EXACT) -> tuple[dict, dict] | str:
    """FSDP's own training state at the save, for bfloat16's P6: (rank 0's unsharded params,
    the reference gather of every rank's own optimizer state, passed through the modelled
    bug as a save and a load would), or why it cannot be had."""
    if not save_obs or save_obs[0].params is None:
        return "rank 0 of the save side recorded no params"
    try:
        state = gather(layout, [o.local for o in save_obs])
    except ref.StateDictMismatch as exc:
        return f"reference.{gather.__name__} rejected the save side's local dicts: {exc}"
    return save_obs[0].params, exp.round_trip(state)


def _update_diffs(start: dict, want: dict, got: dict) -> tuple[float, list[str]]:
    """bfloat16's P6 rule on params (module rules): the scale of the resumed update against
    the continuation's, and the params whose update differs by more than
    ``BF16_UPDATE_RTOL`` (relative L2)."""
    dot = norm = 0.0
    bad = []
    for k in sorted(want):
        if k not in got:
            bad.append(f"[{k!r}]: missing")
            continue
        u = got[k].double() - start[k].double()
        w = want[k].double() - start[k].double()
        dot, norm = dot + float((u * w).sum()), norm + float((w * w).sum())
        err = float((u - w).norm() / w.norm().clamp_min(1e-30))
        if err > BF16_UPDATE_RTOL:
            bad.append(f"[{k!r}]: the resumed update differs by relative L2 error {err:.3g} "
                       f"> {BF16_UPDATE_RTOL}")
    return (dot / norm if norm else float("nan")), bad


def _not_resumed(load_obs: Sequence[LoadRecord]) -> Verdict | None:
    """The error of a load side that did not resume (rank 0 recorded no final params: its
    load or its resumed training raised), None where it did; judged before P6 is n/a, so
    that n/a never hides it."""
    o0 = load_obs[0]
    if o0.final_params is not None:
        return None
    e = error_of(o0.loaded)
    return error(f"the load side did not resume: {e or 'no final params recorded'}")


def p6_resume(dst_layout, load_obs: Sequence[LoadRecord], local: LocalRun, dtype: str,
              gather=ref.gather_full, *, resume_steps: int, case=None,
              start: tuple[dict, dict] | str | None = None, unmatched: str = "",
              own_mp: str = "", always_precise: bool = True,
              scheduler: str | None = None, exp: Expectation = EXACT,
              probe=None) -> Verdict:
    """P6: resumed training (params, losses, optimizer state) ~= the uninterrupted run
    (``_resumed_training``), at the precision it is judged at (``precision.with_precision``
    of ``case``, ``own_mp``; ``always_precise`` False: only where the judged dtype is not the
    case's own), and, where the path checkpoints the scheduler (``scheduler``: what a pass
    adds that held), the scheduler after resuming == the uninterrupted run's
    (``training_state.resumed_problems``, added to any verdict). ``unmatched``: why no
    single-process run can match (``roundtrip.single_process_unmatched``): n/a, the
    scheduler still judged, unless the load side did not resume (its error).
    ``exp``: the bug modelled (the bfloat16 continuation starts from its modelled state).
    ``probe``: the case's ``scheduler_probe.SchedulerProbe`` (a scheduler field that changes
    nothing the scheduler does is information, not a problem)."""
    verdict = (_not_resumed(load_obs) or na(unmatched)) if unmatched else with_precision(
        case, _resumed_training(dst_layout, load_obs, local, dtype, gather,
                                resume_steps=resume_steps, case=case, start=start, exp=exp),
        always=always_precise, own_mp=own_mp)
    if scheduler is None:
        return verdict
    problems, notes = resumed_problems(load_obs, local, probe)
    return with_problems(verdict, problems, scheduler, notes)


def _resumed_training(dst_layout, load_obs: Sequence[LoadRecord], local: LocalRun, dtype: str,
                      gather, *, resume_steps: int, case=None,
                      start: tuple[dict, dict] | str | None = None,
                      exp: Expectation = EXACT) -> Verdict:
    """Resumed training (params, losses, optimizer state) ~= the uninterrupted run
    (``gather``: the reference gather of the load side's layout; FSDP2: ``fsdp2_gather``).
    The params and the state are judged for every replica of the load side (``replicas()``:
    each HYBRID_SHARD shard group, each NO_SHARD rank), as its first rank holds them, against
    the run of that rank (``LocalRun.end_of``: they differ only under a modelled bug that
    trains the ranks apart); bfloat16's params, rank 0's (a custom path records rank 0's
    params only).
    The resumed run must record one loss per resumed step (``resume_steps``), each compared
    with the uninterrupted run's loss at the same step: a resume that records none compares
    nothing, and fails.

    bfloat16 (module rules): the uninterrupted run is the single-process continuation of
    FSDP's own state at the save (``start``, from ``save_point``; ``case`` gives the model);
    the params are judged on their resumed update, the state per tensor by its own scale."""
    rtol, atol = TOLERANCES[dtype]
    o0 = load_obs[0]
    stopped = _not_resumed(load_obs)
    if stopped is not None:
        return stopped
    if local.params_at_end is None:
        return error("the uninterrupted run has no resumed part under this model (its ranks "
                     "train apart, and their resume is not modelled)")
    skip = _plain(dst_layout)
    problems = []
    scale = 1.0
    if dtype == "bf16" or start is not None:  # bf16, a chain's later checkpoint
        if not isinstance(start, tuple) or case is None:
            return error(f"this P6 judges against the continuation of FSDP's own state at "
                         f"the save, which could not be had: {start or 'not given'}")
        local = continue_from(case, *start, exp=exp)
    want_p = {k: v for k, v in local.end_of(0)[0].items() if k not in skip}
    got_p = {k: v for k, v in o0.final_params.items() if k not in skip}
    if dtype == "bf16":
        scale, bad_p = _update_diffs(start[0], want_p, got_p)
        if not abs(scale - 1) <= BF16_UPDATE_SCALE_TOL:
            problems.append(f"the resumed update is {scale:.5g} x the uninterrupted one "
                            f"(allowed: 1 +- {BF16_UPDATE_SCALE_TOL}): a wrong lr, a skipped "
                            f"or an extra step")
        if bad_p:
            problems.append("params after resuming differ from uninterrupted training:\n"
                            + "\n".join(bad_p[:20]))
    else:
        replicas = dst_layout.replicas()
        for grp in replicas:  # each replica's params as its first rank holds them
            o = load_obs[grp[0]]
            if o.final_params is None:  # rank 0's is required above; a custom path keeps
                continue                # rank 0's only
            want_p = {k: v for k, v in local.end_of(grp[0])[0].items() if k not in skip}
            got_p = {k: v for k, v in o.final_params.items() if k not in skip}
            diffs = diff_state_dicts(want_p, got_p, exact=False, rtol=rtol, atol=atol)
            if diffs:
                who = f" (rank {grp[0]}, the replica on ranks {list(grp)})" \
                    if len(replicas) > 1 else ""
                problems.append(f"params after resuming{who} differ from uninterrupted "
                                f"training:\n" + format_diff(diffs))
    # the uninterrupted run's losses of the resumed steps (the continuation's are all of them)
    want_l = list(local.losses[len(local.losses) - resume_steps:]) if resume_steps else []
    got_l = list(o0.losses or ())
    if len(got_l) != resume_steps:
        problems.append(f"the resumed run recorded {len(got_l)} losses, expected "
                        f"{resume_steps} (one per resumed step)")
    bad = [(i, w, g) for i, (w, g) in enumerate(zip(want_l, got_l))
           if abs(w - g) > atol + rtol * abs(w)]
    if bad:
        problems.append("losses after resuming differ: " + ", ".join(
            f"step {i}: uninterrupted {w!r}, resumed {g!r}" for i, w, g in bad))
    groups = dst_layout.replicas()
    finals = [o.final_local for o in load_obs]
    for grp in groups:
        # each replica's state, gathered as the reference gathers the first one's
        # (its ranks rotated to the front), against the run of its first rank
        try:
            final = gather(dst_layout, replica_first(dst_layout, finals, grp[0]))
        except ref.StateDictMismatch as exc:
            return error(f"reference.{gather.__name__} rejected the resumed local dicts"
                         f"{rotated_note(grp)}: {exc}")
        want_s = canon_groups(_without(local.end_of(grp[0])[1], skip))
        got_s = canon_groups(_without(final, skip))
        what = "optimizer state after resuming" + (
            f" (the replica on ranks {list(grp)})" if len(groups) > 1 else "")
        if dtype == "bf16":
            bad_s = _norm_diffs(want_s, got_s, BF16_STATE_NORM_RTOL)
            if bad_s:
                problems.append(f"{what} differs from uninterrupted training:\n"
                                + "\n".join(bad_s[:20]))
        else:
            diffs = diff_state_dicts(want_s, got_s, exact=False, rtol=rtol, atol=atol)
            if diffs:
                problems.append(f"{what} differs from uninterrupted training:\n"
                                + format_diff(diffs))
    if problems:
        return fail("\n\n".join(problems))
    how = (f"against the continuation of FSDP's state at the save: update scale {scale:.5f} "
           f"(1 +- {BF16_UPDATE_SCALE_TOL}), each param's update and state tensor within "
           f"relative L2 {BF16_UPDATE_RTOL} / {BF16_STATE_NORM_RTOL}" if dtype == "bf16"
           else f"within rtol={rtol}, atol={atol}" + (
               " of the continuation of FSDP's state at the save" if start is not None else ""))
    return passed(f"params, {len(want_l)} losses and state {how}")


def resaved_pairs(api: str, full: dict, load_obs: Sequence[LoadRecord], same_plan: bool,
                  groups: Sequence[Sequence[int]] = (), *,
                  exp: Expectation = EXACT) -> tuple[list[SameState], str]:
    """What P7 (properties/idempotent.py) judges of a round trip, and how a pass reads: the
    dict saved again right after the load against the one saved, as the modelled save and
    load leave it (under another wrapping plan the order of FQNs inside a param group
    follows the new units: compared as sets there).

    A sharded path's re-save is assembled from each shard group's ranks (``groups``, the
    load side's ``shard_groups()``: one per HYBRID_SHARD replica, one per rank under NO_SHARD
    with original params) and each group's is judged on its own, as its first rank holds it
    (a load effect that differs between groups, ``Expectation.judged_rank``): replicas that
    disagree fail, naming the group. A full path's re-save is rank 0's."""
    sets = [list(g) for g in groups] if api in SHARDED_PATHS and groups else \
        [[o.rank for o in load_obs]]
    pairs = []
    for ranks in sets:
        again, v = to_full(api, [load_obs[r] for r in ranks], resaved=True)
        if v is not None:
            pairs.append(SameState(problem=v))
            break
        on_first = exp.on_rank(ranks[0])
        want = on_first.saved(on_first.loaded(on_first.shards_from(full)))
        if not same_plan:
            want, again = canon_groups(want), canon_groups(again)
        who = f" (the replica on ranks {ranks})" if len(sets) > 1 else ""
        pairs.append(SameState(what=f"saving again right after loading gives a different "
                                    f"dict{who}", want=want, got=again))
    return pairs, "bitwise the same" + (f" on each of {len(sets)} replicas"
                                         if len(sets) > 1 else "")


def p8_serialise(api: str, save_obs: Sequence[SaveRecord], load_obs: Sequence[LoadRecord],
                 full: dict, dcp_full: dict | None, *, exp: Expectation = EXACT) -> Verdict:
    """What was written reads back bitwise: ``torch.load(weights_only=True)`` for files,
    DCP for DCP directories."""
    notes = [o.weights_only_refused for o in load_obs if o.weights_only_refused]
    per_rank = api in PATH_NAMES and api_path(api).writes == "per_rank"
    if notes and not per_rank:
        return fail(notes[0])
    if api in PATH_NAMES and api_path(api).writes == "dcp":
        if dcp_full is None:
            return error("the DCP directory could not be read back on the controller")
        diffs = diff_state_dicts(exp.stored(full), dcp_full)
        return fail("DCP round trip changed the state:\n" + format_diff(diffs)) if diffs else \
            passed("DCP directory reads back bitwise")
    if per_rank:  # one file per rank, read back by the same rank
        # (a refusal of weights_only=True is reported first; the content read back without
        # it is still compared, so a changed file does not hide behind the refusal)
        problems = notes[:1]
        for s, o in zip(save_obs, load_obs):
            if s.saved is None or o.reread is None:
                return na(f"rank {o.rank} did not record the file it wrote or read back")
            diffs = diff_state_dicts(s.saved, o.reread)
            if diffs:
                problems.append(f"rank {o.rank}: torch.save -> torch.load(weights_only=True) "
                                f"changed its file's dict:\n" + format_diff(diffs))
        if problems:
            return fail("\n".join(problems))
        return passed(f"{len(load_obs)} per-rank files: torch.save -> "
                      f"torch.load(weights_only=True) bitwise")
    written, reread = save_obs[0].saved, load_obs[0].reread
    if api in PATH_NAMES and api_path(api).rekeys:  # the file holds the PARAM_ID dict
        written, reread = save_obs[0].saved_ids, load_obs[0].reread_ids
    if reread is None or written is None:
        return na("rank 0 did not record the file it wrote or read back")
    diffs = diff_state_dicts(written, reread)
    if diffs:
        return fail("torch.save -> torch.load(weights_only=True) changed the dict:\n"
                    + format_diff(diffs))
    return passed("torch.save -> torch.load(weights_only=True) bitwise")


ON_CPU = ("offload_to_cpu: not observable on CPU (every tensor is on the CPU whether it "
          "works or not)")


def flags_seen(layout, api: str, save_obs: Sequence[SaveRecord], *,
               exp: Expectation = EXACT) -> FlagsSeen:
    """What P9 (properties/flags.py) judges of an FSDP1 path's save:
    rank0_only: other ranks get ``{}`` and rank 0 equals the all-ranks result (under a
    modelled bug, as its save leaves it); offload_to_cpu: every saved tensor is on CPU
    (observable only where the ranks compute on another device) and the offloaded sharded
    dict equals the one saved without offloading. Nothing checked where none of these can be
    observed (the reason: ``not_checked``)."""
    if api in PATH_NAMES and api_path(api).writes == "per_rank":
        return FlagsSeen(not_checked="sharded_optim_state_dict has no rank0_only / "
                                     "offload_to_cpu flags")
    on_device = any(o.device != "cpu" for o in save_obs)
    checked: list[str] = []
    seen: list[FlagSeen] = []
    if on_device:
        checked.append("offload_to_cpu: every tensor on CPU")
        seen += [FlagSeen(found=f"rank {o.rank}: offload_to_cpu saved tensors on {devs}")
                 for o in save_obs if (devs := [d for d in o.saved_devices if d != "cpu"])]
    if save_obs[0].flip == "all_ranks":
        checked.insert(0, "rank0_only as documented")
        seen += [FlagSeen(found=f"rank {o.rank}: rank0_only=True returned a non-empty dict "
                                f"({len(o.saved.get('state', {}))} params)")
                 for o in save_obs[1:] if o.saved != {}]
        seen += [FlagSeen(problem=error(f"rank0_only=False raised on rank {o.rank}:\n{e}"))
                 for o in save_obs if (e := error_of(o.flipped))]
        if not any(s.problem for s in seen):
            # rank0_only=True saves what rank0_only=False returns (a modelled bug: its effect)
            seen.append(FlagSeen(what="rank 0: rank0_only=True differs from rank0_only=False",
                                 want=exp.saved(save_obs[0].flipped), got=save_obs[0].saved))
            for o in save_obs[1:]:
                mine, theirs = comparable(save_obs[0].flipped, o.flipped, layout, o.rank)
                seen.append(FlagSeen(what=f"rank {o.rank}: rank0_only=False differs from rank 0's",
                                     want=mine, got=theirs))
    if save_obs[0].flip == "unoffloaded":  # saved with offload_to_cpu, flipped without
        on = False
        checked.append("offload_to_cpu changes nothing but devices")
        for o in save_obs:
            e = error_of(o.flipped)
            if e:
                seen.append(FlagSeen(problem=error(f"offload_to_cpu={on} raised on rank "
                                                   f"{o.rank}:\n{e}")))
                break
            seen.append(FlagSeen(  # records are CPU clones
                what=f"rank {o.rank}: offload_to_cpu={on} gives another sharded dict than "
                     f"{not on}", want=o.flipped, got=o.saved))
    return FlagsSeen(seen=tuple(seen), checked=tuple(checked), note="" if on_device else ON_CPU,
                     not_checked=f"nothing to observe: {api} has no rank0_only flag, and "
                                 f"{ON_CPU}")


def rekey_seen(case, full: dict, load_obs: Sequence[LoadRecord]) -> ToPlain:
    """What P5 (properties/rekey_props.py) judges of the rekey path: the saved full dict,
    the PARAM_ID dict written for the unwrapped model (read back on rank 0 of the load
    side) and torch's rekey of it back to PARAM_NAME there. The plain optimizer has the
    zoo's grouping, as on the rank; the PARAM_ID dict is loaded into it here."""
    o0 = load_obs[0]
    model = plain_model(case)

    def recorded(v):
        e = error_of(v)
        return {"error": e} if e else v

    return ToPlain(full=full, model=model, optim=plain_optimizer(case, model),
                   how="zoo grouping", rank=o0.rank, ids=recorded(o0.reread_ids),
                   names=recorded(o0.reread))
