"""P0, P1, P3, P4, P7, P9 and P11 are each one function (properties/sharding.py, saved.py,
loaded.py, flatten.py, idempotent.py, flags.py, groups.py) that every observer hands its observations and the family's reference; their
rules, checked on the reference's own dicts (no ranks): a wrong value on one rank fails
naming it, a rank that raised beside a wrong value elsewhere is a failure that shows both (a
second bug never hides behind an error), nothing compared is n/a, never a pass."""
from __future__ import annotations

import copy
import math

import torch

from fsdp_conformance.properties.families import FSDP1, FSDP2
from fsdp_conformance.properties.flatten import ShardedRank, p4_flatten
from fsdp_conformance.properties.idempotent import SameState, p7_idempotent
from fsdp_conformance.properties.flags import FlagSeen, FlagsSeen, p9_flags
from fsdp_conformance.properties.groups import LoadedGroups, p11_groups
from fsdp_conformance.properties.loaded import LoadedState, p3_loaded
from fsdp_conformance.properties.saved import SavedDict, p1_saved
from fsdp_conformance.properties.sharding import LayoutSide, p0_layout
from fsdp_conformance.properties.verdict import error, na
from fsdp_conformance.reference import fsdp2_layout, fsdp2_shard, layout_from_spec, shard_full

UNITS = [("", [("a.w", (4, 3)), ("a.b", (4,))]), ("u1", [("u1.c.w", (5, 2))])]
WS = 2


def _layout():
    return layout_from_spec(UNITS, WS, use_orig_params=False, strategy="FULL_SHARD",
                            shard_world_size=None, dtype=torch.float64)


def _full(layout):
    g = torch.Generator().manual_seed(0)
    state = {}
    for fqn in layout.fqns():
        _, slot = layout.find(fqn)
        state[fqn] = {"exp_avg": torch.randn(slot.shape, generator=g, dtype=torch.float64),
                      "step": torch.tensor(2.0)}
    return {"state": state, "param_groups": [{"lr": 0.1, "params": list(layout.fqns())}]}


def _shards(layout, full):
    return [shard_full(layout, full, r, per_element={"exp_avg"}) for r in range(WS)]


def _world():
    """The layout, a full dict on it and every rank's shard of that dict."""
    layout = _layout()
    full = _full(layout)
    return layout, full, _shards(layout, full)


def _nudged(d):
    d = copy.deepcopy(d)
    st = next(iter(d["state"].values()))
    st["exp_avg"].view(-1)[0] += 1.0
    return d


def test_p3_passes_the_reference_shards_and_fails_a_nudged_rank_by_name():
    layout, full, shards = _world()
    ok = [LoadedState(rank=r, got=shards[r], source=full, own=shards[r]) for r in range(WS)]
    v = p3_loaded(FSDP1, layout, ok)
    assert v.status == "pass", v.detail
    assert "own state" in v.detail
    bad = [ok[0], LoadedState(rank=1, got=_nudged(shards[1]), source=full)]
    v = p3_loaded(FSDP1, layout, bad)
    assert v.status == "fail"
    assert v.detail.startswith("rank 1 after loading differs from reference.shard_full"), v.detail


def test_p3_a_rank_that_raised_beside_a_wrong_rank_is_a_failure_showing_both():
    layout, full, shards = _world()
    raised = LoadedState(rank=0, problem=error("torch raised while loading on rank 0:\nBoom"))
    v = p3_loaded(FSDP1, layout, [raised, LoadedState(rank=1, got=_nudged(shards[1]),
                                                      source=full)])
    assert v.status == "fail" and "rank 1 after loading differs" in v.detail
    assert "Boom" in v.detail
    v = p3_loaded(FSDP1, layout, [raised, LoadedState(rank=1, got=shards[1], source=full)])
    assert v.status == "error" and "Boom" in v.detail


def test_p3_nothing_compared_is_na_and_a_reference_check_alone_does_not_count():
    layout, full, shards = _world()
    states = [LoadedState(rank=r, label="set_full", problem=na("path set_full was not run"))
              for r in range(WS)]
    states += [LoadedState(rank=r, source=full, own=shards[r]) for r in range(WS)]
    v = p3_loaded(FSDP1, layout, states)
    assert (v.status, v.detail) == ("n/a", "path set_full was not run")
    # the reference's own check still fails when the own state disagrees
    states[-1] = LoadedState(rank=1, source=full, own=_nudged(shards[1]))
    v = p3_loaded(FSDP1, layout, states)
    assert v.status == "fail"
    assert "reference.shard_full(full) on rank 1 differs from the rank's own state" in v.detail


def test_p3_own_state_differs():
    layout, full, shards = _world()
    v = p3_loaded(FSDP1, layout, [LoadedState(rank=0, got=shards[0], source=full,
                                              own=_nudged(shards[0]))])
    assert v.status == "fail"
    assert "rank 0 after loading differs from the rank's own state before saving" in v.detail


def test_p1_gather_of_the_locals_passes_and_a_nudged_save_fails_by_rank():
    layout, full, locals_ = _world()
    v = p1_saved(FSDP1, layout, locals_, [SavedDict(rank=0, label="x.full", got=full)])
    assert v.status == "pass", v.detail
    v = p1_saved(FSDP1, layout, locals_, [SavedDict(rank=0, label="x.full", got=_nudged(full))])
    assert v.status == "fail"
    assert v.detail.startswith("x.full on rank 0 differs from reference.gather_full"), v.detail


def test_p1_rank0_only_elsewhere_empty_and_errors_beside_differences():
    layout, full, locals_ = _world()
    saves = [SavedDict(rank=0, label="p", got=full, rank0_only=True),
             SavedDict(rank=1, label="p", got={}, rank0_only=True)]
    assert p1_saved(FSDP1, layout, locals_, saves).status == "pass"
    saves[1] = SavedDict(rank=1, label="p", got=full, rank0_only=True)
    v = p1_saved(FSDP1, layout, locals_, saves)
    assert v.status == "fail" and "p on rank 1 (rank 0 only) is not empty" in v.detail
    raised = SavedDict(rank=1, label="p", problem=error("torch raised in p on rank 1:\nBoom"))
    v = p1_saved(FSDP1, layout, locals_, [SavedDict(rank=0, label="p", got=_nudged(full)),
                                          raised])
    assert v.status == "fail" and "Boom" in v.detail
    v = p1_saved(FSDP1, layout, locals_, [raised])
    assert v.status == "error"
    assert p1_saved(FSDP1, layout, locals_, [SavedDict(rank=0, problem=na("skipped"))]) \
        .status == "n/a"


# ---------------------------------------------------------------- P0 (properties/sharding.py)
def _fsdp1_seen(layout, rank: int) -> dict:
    """What a rank whose FSDP1 layout is the reference's records (``run_props.layout_view``)."""
    meta = [{"name": u.name, "fqns": list(u.flat_fqns), "shapes": [p.shape for p in u.params],
             "numels_with_padding": list(u.numels_with_padding()),
             "is_padding_mask": list(u.is_padding_mask()), "local_numel": u.shard_numel,
             "shard_param_infos": [(b,) for b in u.fsdp_in_shard(layout.shard_rank(rank))]}
            for u in layout.units]
    return {"rank": rank, "keys": list(layout.optimizer_keys()), "meta": meta}


def _sides(save_obs, load_obs=None):
    layout = _layout()
    sides = [LayoutSide(label="save side", layout=layout, observations=save_obs)]
    if load_obs is not None:
        sides.append(LayoutSide(label="load side", layout=layout, observations=load_obs))
    return sides


def test_p0_passes_the_reference_layout_on_both_sides_and_names_what_it_compared():
    layout = _layout()
    seen = [_fsdp1_seen(layout, r) for r in range(WS)]
    v = p0_layout(FSDP1, _sides(seen, seen))
    assert v.status == "pass", v.detail
    assert v.detail == "save side 2 unit(s) on 2 rank(s); load side 2 unit(s) on 2 rank(s)"


def test_p0_key_order_counts_with_one_group_only():
    layout = _layout()
    seen = [_fsdp1_seen(layout, r) for r in range(WS)]
    seen[1] = {**seen[1], "keys": list(reversed(seen[1]["keys"]))}
    v = p0_layout(FSDP1, _sides(seen))
    assert v.status == "fail" and v.detail.startswith("save side: rank 1: optimizer keys"), v.detail
    assert p0_layout(FSDP1, _sides(seen), ordered=False).status == "pass"
    seen[1] = {**seen[1], "keys": seen[1]["keys"][1:]}
    v = p0_layout(FSDP1, _sides(seen), ordered=False)
    assert v.status == "fail" and "(as sets)" in v.detail, v.detail


def test_p0_names_side_rank_unit_and_field_and_a_wrong_save_side_decides():
    layout = _layout()
    good = [_fsdp1_seen(layout, r) for r in range(WS)]
    bad = copy.deepcopy(good)
    bad[1]["meta"][1]["local_numel"] += 1
    v = p0_layout(FSDP1, _sides(good, bad))
    assert v.status == "fail"
    assert v.detail.startswith("load side: rank 1, unit 'u1': local_numel = "), v.detail
    both = copy.deepcopy(bad)
    both[0]["meta"][0]["shard_param_infos"] = [(not b[0],) for b in
                                               both[0]["meta"][0]["shard_param_infos"]]
    v = p0_layout(FSDP1, _sides(both, bad))
    assert [ln.split(":")[0] for ln in v.detail.splitlines()] == ["save side"] * 2, v.detail


def test_p0_fsdp2_names_the_param_whose_piece_is_off():
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))
    layout = fsdp2_layout(model, 4)

    def seen(r):
        meta = [{"fqn": p.fqn, "dtensor": p.sharded, "shape": p.shape,
                 "local_shape": p.local_shape(r), "offset": p.offset(r),
                 "placements": p.placements(1)} for p in layout.params]
        return {"rank": r, "keys": layout.optimizer_keys(), "meta": meta}

    obs = [seen(r) for r in range(4)]
    v = p0_layout(FSDP2, [LayoutSide(layout=layout, observations=obs)])
    assert v.status == "pass" and v.detail == "4 params on 4 rank(s)", v.detail
    obs[3]["meta"][0]["offset"] = (obs[3]["meta"][0]["offset"][0] - 1, 0)
    v = p0_layout(FSDP2, [LayoutSide(layout=layout, observations=obs)])
    assert v.status == "fail"
    assert v.detail.startswith("rank 3, 0.weight: offset = "), v.detail


# ---------------------------------------------------------------- P11 (properties/groups.py)
def _groups(full):
    return copy.deepcopy(full["param_groups"])


def test_p11_compares_every_rank_that_loaded_and_names_each_difference():
    full = _full(_layout())
    ok = [LoadedGroups(rank=r, got=_groups(full)) for r in range(WS)]
    v = p11_groups(full, ok, at_save=full)
    assert v.status == "pass" and v.detail == "1 group(s), keys ['lr']", v.detail
    bad = [LoadedGroups(rank=r, got=_groups(full)) for r in range(WS)]
    bad[0].got[0]["lr"] = 0.2
    bad[1].got[0]["lr"] = (0.1,)  # a value of another type is a difference too
    v = p11_groups(full, bad)
    assert v.status == "fail"
    assert [ln for ln in v.detail.splitlines() if ln.startswith("rank")] == [
        "rank 0: param_groups after loading differ:", "rank 1: param_groups after loading differ:"]


def test_p11_params_count_only_where_the_groups_name_them_by_fqn():
    full = _full(_layout())
    units = [{**g, "params": ["unit0"]} for g in _groups(full)]  # a flat optimizer's own form
    assert p11_groups(full, [LoadedGroups(rank=0, got=units)]).status == "pass"
    v = p11_groups(full, [LoadedGroups(rank=0, label="set_full", got=units, by_fqn=True)])
    assert v.status == "fail" and v.detail.startswith("rank 0: param_groups after set_full"), v.detail


def test_p11_no_rank_loaded_is_the_load_error_or_what_the_observer_says():
    full = _full(_layout())
    raised = [LoadedGroups(rank=r, problem=error("KeyError: 'state'")) for r in range(WS)]
    v = p11_groups(full, raised)
    assert v.status == "error" and "load failed on every rank" in v.detail
    assert "KeyError: 'state'" in v.detail
    elsewhere = [LoadedGroups(rank=0, problem=na("set_full did not load (P3:set_full reports why)"))]
    assert p11_groups(full, elsewhere).status == "n/a"
    one = [raised[0], LoadedGroups(rank=1, got=_groups(full))]
    assert p11_groups(full, one).status == "pass"  # the rank that loaded is compared
    saved_other = {**full, "param_groups": [{**full["param_groups"][0], "lr": 0.3}]}
    v = p11_groups(full, raised, at_save=saved_other)
    assert v.status == "fail" and v.detail.startswith("saved param_groups differ"), v.detail


def _row_pieces(full, layout_ws):
    """Every rank's FSDP1 sharded dict in the reference's pieces form: each per-element state
    chunked by rows over the ranks (torch's ShardedTensor layout), as flat-offset pieces."""
    out = []
    for r in range(layout_ws):
        state = {}
        for fqn, st in full["state"].items():
            t = st["exp_avg"]
            rows = t.shape[0]
            per = -(-rows // layout_ws)
            a, b = min(r * per, rows), min((r + 1) * per, rows)
            row = t[0].numel() if t.dim() > 1 else 1
            pcs = [(tuple(t.shape), a * row, t[a:b].reshape(-1).clone())] if b > a else []
            state[fqn] = {"step": st["step"], **({"exp_avg": pcs} if pcs else {})}
        out.append({"state": state, "param_groups": full["param_groups"]})
    return out


def test_p4_fsdp1_flattens_the_shard_group_and_names_a_nudged_rank_and_torchs_flatten():
    layout, full, shards = _world()
    pieces = _row_pieces(full, WS)
    ok = [ShardedRank(rank=r, sharded=pieces[r], flat=shards[r], torch_flat=shards[r],
                      torch_label="flatten_sharded_optim_state_dict") for r in range(WS)]
    v = p4_flatten(FSDP1, layout, ok)
    assert v.status == "pass", v.detail
    bad = [ok[0], ShardedRank(rank=1, sharded=pieces[1], flat=_nudged(shards[1]),
                              torch_flat=_nudged(shards[1]), torch_label="to_load")]
    v = p4_flatten(FSDP1, layout, bad)
    assert v.status == "fail"
    assert "rank 1: flat local state differs from reference.flatten_sharded" in v.detail
    assert "rank 1: to_load differs from reference.flatten_sharded" in v.detail
    assert "rank 0" not in v.detail


def test_p4_a_missing_piece_is_an_error_and_a_rank_that_raised_decides():
    layout, full, shards = _world()
    pieces = _row_pieces(full, WS)
    short = copy.deepcopy(pieces)
    short[1]["state"]["a.w"].pop("exp_avg")  # rank 1's rows of a.w: no rank holds them
    v = p4_flatten(FSDP1, layout, [ShardedRank(rank=r, sharded=short[r], flat=shards[r])
                                   for r in range(WS)])
    assert v.status == "error" and "reference.flatten_sharded rejected" in v.detail, v.detail
    assert "'a.w'" in v.detail or "a.w" in v.detail
    raised = error("torch raised on rank 1:\nBoom")
    v = p4_flatten(FSDP1, layout, [ShardedRank(rank=0, sharded=pieces[0], flat=_nudged(shards[0])),
                                   ShardedRank(rank=1, problem=raised)])
    assert v is raised  # the flatten needs every rank's dict of the shard group
    v = p4_flatten(FSDP1, layout, [ShardedRank(rank=r, sharded=pieces[r], flat=shards[r],
                                               torch_problem=na("not run")) for r in range(WS)])
    assert v.status == "pass", v.detail


def _fsdp2_world():
    layout = fsdp2_layout([("w", (3, 2)), ("b", (5,))], 4)
    g = torch.Generator().manual_seed(1)
    full = {"state": {f: {"exp_avg": torch.randn(s, generator=g, dtype=torch.float64),
                          "step": torch.tensor(3.0)} for f, s in (("w", (3, 2)), ("b", (5,)))},
            "param_groups": [{"lr": 0.1, "params": ["w", "b"]}]}
    locals_ = [fsdp2_shard(layout, full, r) for r in range(4)]
    return layout, full, locals_


def _fsdp2_pieces(layout, full, locals_, r):
    """Rank r's sharded dict as the FSDP2 observer hands it to P4: each DTensor as the
    reference's pieces (an empty piece of its global shape where the rank holds no rows)."""
    state = {}
    for fqn, st in locals_[r]["state"].items():
        p = layout.param(fqn)
        t = st["exp_avg"].reshape(-1)
        off = p.offset(r)[0] * math.prod(p.shape[1:])  # Shard(0): whole rows
        state[fqn] = {"step": st["step"], "exp_avg": [(p.shape, off, t)]}
    return {"state": state, "param_groups": locals_[r]["param_groups"]}


def test_p4_fsdp2_flattens_each_rank_alone_empty_ranks_included_and_names_a_misplaced_piece():
    layout, full, locals_ = _fsdp2_world()
    assert locals_[3]["state"]["w"]["exp_avg"].shape[0] == 0  # 3 rows over 4 ranks
    ranks = [ShardedRank(rank=r, sharded=_fsdp2_pieces(layout, full, locals_, r),
                         flat=locals_[r]) for r in range(4)]
    v = p4_flatten(FSDP2, layout, ranks)
    assert v.status == "pass", v.detail
    moved = copy.deepcopy(ranks[1].sharded)
    (shape, off, t), = moved["state"]["b"]["exp_avg"]
    moved["state"]["b"]["exp_avg"] = [(shape, off - 1, t)]  # one element early: not its box
    v = p4_flatten(FSDP2, layout, [*ranks[:1], ShardedRank(rank=1, sharded=moved,
                                                           flat=locals_[1]), *ranks[2:]])
    assert v.status == "error" and "reference.fsdp2_flatten rejected" in v.detail, v.detail
    assert "'b'" in v.detail, v.detail
    v = p4_flatten(FSDP2, layout, [*ranks[:1], ShardedRank(
        rank=1, sharded=moved, flat=locals_[1], read_problems=("b.exp_avg: torch's global offset "
                                                               "(1,), reference says (2,)",)),
        *ranks[2:]])
    assert v.status == "fail", v.detail  # the reading already disagreed: a failure showing both
    assert v.detail.startswith("rank 1: b.exp_avg: torch's global offset") and "rejected" in v.detail
    v = p4_flatten(FSDP2, layout, [*ranks[:2], ShardedRank(
        rank=2, sharded=ranks[2].sharded, flat=_nudged(locals_[2])), ranks[3]])
    assert v.status == "fail" and "rank 2: flat local state differs from reference.fsdp2_flatten" \
        in v.detail, v.detail


def test_p7_names_every_pair_that_differs_and_a_raise_beside_them_fails():
    layout, full, shards = _world()
    same = SameState(what="rank 0: saving again gives another dict", want=shards[0],
                     got=copy.deepcopy(shards[0]))
    v = p7_idempotent([same], summary="bitwise the same on 1 rank")
    assert (v.status, v.detail) == ("pass", "bitwise the same on 1 rank")
    moved = SameState(what="rank 1: loading twice gives another state", want=shards[1],
                      got=_nudged(shards[1]))
    v = p7_idempotent([same, moved], raised=["load -> save -> load raised:\nBoom"])
    assert v.status == "fail", v.detail
    assert v.detail.startswith("rank 1: loading twice gives another state:\n") and "rank 0" not in v.detail
    assert v.detail.endswith("Boom")
    v = p7_idempotent([], raised=["load -> save -> load raised:\nBoom"])
    assert v.status == "fail"  # a path that cannot save again is not idempotent


def test_p7_a_pair_that_cannot_be_had_decides():
    layout, full, shards = _world()
    torn = error("the ranks' shards do not tile")
    moved = SameState(what="differs", want=shards[1], got=_nudged(shards[1]))
    assert p7_idempotent([moved, SameState(problem=torn)]) is torn


def test_p9_reports_found_differences_and_unequal_pairs_in_order_and_a_problem_decides():
    layout, full, shards = _world()
    same = FlagSeen(what="rank 0: rank0_only=True differs from rank0_only=False",
                    want=full, got=copy.deepcopy(full))
    v = p9_flags(FlagsSeen(seen=(same,), checked=("rank0_only as documented",),
                           note="offload_to_cpu: not observable on CPU"))
    assert (v.status, v.detail) == ("pass", "rank0_only as documented; offload_to_cpu: not "
                                            "observable on CPU")
    left = FlagSeen(found="rank 1: offload_to_cpu saved tensors on ['cuda:1']")
    other = FlagSeen(what="rank 1: rank0_only=False differs from rank 0's", want=shards[1],
                     got=_nudged(shards[1]))
    v = p9_flags(FlagsSeen(seen=(left, same, other), checked=("x",)))
    assert v.status == "fail"
    first, second = v.detail.split("\n", 1)
    assert first == left.found and second.startswith("rank 1: rank0_only=False differs"), v.detail
    raised = error("offload_to_cpu=True raised on rank 1:\nBoom")
    assert p9_flags(FlagsSeen(seen=(left, other, FlagSeen(problem=raised)), checked=("x",))) \
        is raised
    v = p9_flags(FlagsSeen(not_checked="sharded_optim_state_dict has no rank0_only flag"))
    assert v.status == "n/a" and "no rank0_only" in v.detail  # nothing checked is never a pass


def test_p4_a_refusal_after_a_difference_elsewhere_is_still_the_references_error():
    """Only what the reading of the dicts found (``read_problems``) turns the reference's
    refusal into a failure; a value difference on an earlier rank does not (the run's P4 was
    an error there, and still is)."""
    layout, full, shards = _world()
    pieces = _row_pieces(full, WS)
    pieces[1]["state"]["u1.c.w"].pop("exp_avg")  # rows 3-4 of u1.c.w: only rank 1 needs them
    ranks = [ShardedRank(rank=0, sharded=pieces[0], flat=_nudged(shards[0])),
             ShardedRank(rank=1, sharded=pieces[1], flat=shards[1])]
    v = p4_flatten(FSDP1, layout, ranks)
    assert v.status == "error" and "rank 1" in v.detail and "u1.c.w" in v.detail, v.detail
    read = [ranks[0], ShardedRank(rank=1, sharded=pieces[1], flat=shards[1],
                                  read_problems=("u1.c.w.exp_avg: not where torch says",))]
    v = p4_flatten(FSDP1, layout, read)
    assert v.status == "fail" and v.detail.startswith("rank 1: u1.c.w.exp_avg: not where"), \
        v.detail
    assert "rank 0: flat local state differs" in v.detail and "rejected" in v.detail
