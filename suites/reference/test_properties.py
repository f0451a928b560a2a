"""Hypothesis properties of the reference: coverage, round trips, resharding, rekeying."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from fsdp_conformance.properties.statediff import assert_state_dicts_equal
from fsdp_conformance.reference import (
    gather_full,
    layout_from_spec,
    rekey_to_ids,
    rekey_to_names,
    reshard,
    shard_full,
    to_ids,
    to_named,
)

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PER_ELEMENT = {"exp_avg", "exp_avg_sq"}
DIMS = st.sampled_from([0, 1, 1, 2, 3, 5, 7, 13])
SHAPES = st.lists(DIMS, min_size=0, max_size=3).map(tuple)
DTYPES = st.sampled_from([torch.float32, torch.float64, torch.bfloat16])


@st.composite
def specs(draw):
    """(units spec, world_size, strategy, shard_world_size, use_orig_params, dtype)."""
    n_params = draw(st.integers(1, 7))
    shapes = [draw(SHAPES) for _ in range(n_params)]
    fqns = [f"m{i}.w" for i in range(n_params)]
    cuts = sorted(draw(st.sets(st.integers(1, max(1, n_params - 1)), max_size=3))) if n_params > 1 else []
    bounds = [0, *cuts, n_params]
    units = []
    for i in range(len(bounds) - 1):
        name = "" if i == 0 else f"u{i}"
        units.append((name, [(f"{name}.{fqns[j]}" if name else fqns[j], shapes[j]) for j in range(bounds[i], bounds[i + 1])]))
    ws = draw(st.integers(1, 8))
    strategy = draw(st.sampled_from(["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]))
    sws = None
    if strategy == "HYBRID_SHARD":
        sws = draw(st.sampled_from([d for d in range(1, ws + 1) if ws % d == 0]))
    return units, ws, strategy, sws, draw(st.booleans()), draw(DTYPES)


def regroup(units, draw_cuts):
    """Same params (same FQNs), different units."""
    params = [p for _, ps in units for p in ps]
    bounds = [0, *sorted(draw_cuts), len(params)]
    out = []
    for i in range(len(bounds) - 1):
        if bounds[i] < bounds[i + 1]:
            out.append(("" if i == 0 else f"v{i}", params[bounds[i]:bounds[i + 1]]))
    return out


def make_layout(units, ws, strategy, sws, uop, dtype):
    return layout_from_spec(units, ws, use_orig_params=uop, strategy=strategy, shard_world_size=sws, dtype=dtype)


def make_full(layout, dtype, seed=0, groups=1):
    g = torch.Generator().manual_seed(seed)
    state = {}
    for fqn in layout.fqns():
        _, slot = layout.find(fqn)
        state[fqn] = {
            "exp_avg": torch.randn(slot.shape, generator=g).to(dtype),
            "exp_avg_sq": torch.rand(slot.shape, generator=g).to(dtype),
            "step": torch.tensor(3.0),
        }
    keys = layout.optimizer_keys()
    pgs = []
    for gi in range(min(groups, len(keys))):
        ks = keys[gi::groups]
        fq = []
        for k in ks:
            u = layout.unit_by_key(k)
            fq.extend(u.fqns if (u is not None and not layout.use_orig_params) else [k])
        pgs.append({"lr": 0.1 * (gi + 1), "betas": (0.9, 0.999), "initial_lr": 0.5, "params": fq})
    order = {f: i for i, f in enumerate(layout.fqns())}
    for pg in pgs:
        pg["params"].sort(key=order.__getitem__)
    pgs.sort(key=lambda pg: order[pg["params"][0]])
    return {"state": state, "param_groups": pgs}


def held_by_no_rank(layout, fqn):
    """A zero-numel param under sharded orig params that FSDP marks in_shard on no rank."""
    unit, slot = layout.find(fqn)
    if not (layout.use_orig_params and unit is not None and unit.sharded and slot.numel == 0):
        return False
    i = unit.fqns.index(slot.fqn)
    return not any(unit.fsdp_in_shard(r)[i] for r in range(unit.shard_world_size))


def expected_gathered(layout, full):
    """The full dict minus params no rank holds state for (zero-numel, sharded, orig params,
    at a shard boundary)."""
    out = {"state": {}, "param_groups": full["param_groups"]}
    for fqn, st_ in full["state"].items():
        if held_by_no_rank(layout, fqn):
            continue
        out["state"][fqn] = st_
    return out


@SETTINGS
@given(specs(), st.integers(1, 3))
def test_pieces_cover_every_element_once(spec, _):
    units, ws, strategy, sws, uop, dtype = spec
    L = make_layout(*spec)
    for u in L.units:
        seen = {p.fqn: torch.zeros(p.numel, dtype=torch.int64) for p in u.params}
        for r in range(u.shard_world_size if u.sharded else 1):
            a, b = u.shard_range(r)
            assert b - a <= u.shard_numel
            used = torch.zeros(u.shard_numel, dtype=torch.int64)
            for pc in u.param_pieces(r):
                seen[pc.fqn][pc.start_in_param:pc.end_in_param] += 1
                used[pc.start_in_shard:pc.start_in_shard + pc.numel] += 1
            assert used.numel() == 0 or int(used.max()) <= 1
        for f, s in seen.items():
            assert bool((s == 1).all()), (f, s)
        if uop:
            for p in u.params[1:]:
                assert p.offset % u.align_numel == 0
            assert u.flat_numel % u.shard_world_size == 0
        else:
            assert u.flat_numel == sum(p.numel for p in u.params)


@SETTINGS
@given(specs(), st.integers(1, 2), st.integers(0, 10**6))
def test_shard_gather_round_trip(spec, groups, seed):
    L = make_layout(*spec)
    dtype = spec[-1]
    full = make_full(L, dtype, seed, groups)
    locs = [shard_full(L, full, r, per_element=PER_ELEMENT) for r in range(L.world_size)]
    # padding is not part of any param: scribble over it, gather must not care
    for r, d in enumerate(locs):
        for k, s in d["state"].items():
            u = L.unit_by_key(k)
            if u is not None and u.sharded:
                a, b = u.shard_range(L.shard_rank(r))
                for n in PER_ELEMENT:
                    s[n][b - a:] = 7.0
    g = gather_full(L, locs)
    assert_state_dicts_equal(expected_gathered(L, full), g)
    for r in range(L.world_size):
        again = shard_full(L, g, r, per_element=PER_ELEMENT)
        fresh = shard_full(L, full, r, per_element=PER_ELEMENT)
        assert_state_dicts_equal(fresh, again, msg=f"rank {r}")
        # round trip through int ids
        keys = L.optimizer_keys()
        assert_state_dicts_equal(again, to_named(to_ids(again, keys), keys))


@SETTINGS
@given(specs(), st.integers(1, 8), st.booleans(), st.sets(st.integers(1, 6), max_size=3), st.integers(0, 10**6))
def test_reshard_preserves_gather(spec, ws2, uop2, cuts, seed):
    units, ws, strategy, sws, uop, dtype = spec
    src = make_layout(*spec)
    n = sum(len(ps) for _, ps in units)
    dst_units = regroup(units, [c for c in cuts if c < n])
    dst = layout_from_spec(dst_units, ws2, use_orig_params=uop2, dtype=dtype)
    full = make_full(src, dtype, seed, groups=1)
    locs = [shard_full(src, full, r, per_element=PER_ELEMENT) for r in range(src.world_size)]
    out = reshard(src, locs, dst, per_element=PER_ELEMENT)
    assert len(out) == ws2
    want = gather_full(src, locs)
    got = gather_full(dst, out)
    # params no rank can hold (zero-numel under sharded orig params, at a shard boundary)
    # drop out on either side
    for f in list(want["state"]):
        if f not in got["state"]:
            assert held_by_no_rank(dst, f), f
            del want["state"][f]
    for f in list(got["state"]):
        if f not in want["state"]:
            assert held_by_no_rank(src, f), f
            del got["state"][f]
    assert_state_dicts_equal(want, got)
    # a loader callable gives the same result
    out2 = reshard(src, lambda r: locs[r], dst, per_element=PER_ELEMENT)
    for a, b in zip(out, out2):
        assert_state_dicts_equal(a, b)


@st.composite
def mlps(draw):
    sizes = draw(st.lists(st.integers(1, 5), min_size=2, max_size=4))
    bias = draw(st.booleans())
    layers = [nn.Linear(a, b, bias=bias) for a, b in zip(sizes, sizes[1:])]
    return nn.Sequential(*layers), draw(st.booleans())


@SETTINGS
@given(mlps())
def test_rekey_round_trip(case):
    model, tie = case
    if tie and len(model) >= 2 and model[0].weight.shape == model[-1].weight.shape:
        model[-1].weight = model[0].weight
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x = torch.randn(2, model[0].in_features)
    model(x).sum().backward()
    opt.step()
    osd = opt.state_dict()
    named = rekey_to_names(osd, model)
    assert set(named["state"]) <= {n for n, _ in model.named_parameters()}
    back = rekey_to_ids(named, model)
    assert_state_dicts_equal(osd, back)
    opt2 = torch.optim.Adam(model.parameters(), lr=0.01)
    opt2.load_state_dict(back)
    assert_state_dicts_equal(osd, opt2.state_dict())
    assert rekey_to_names(named, model) is named  # already names: unchanged, like torch


def test_reshard_zero_numel_orig_params():
    """Regression (issue 3): reshard raised KeyError for a zero-numel param under
    use_orig_params=True. Here m1.w sits at a shard boundary, so no rank holds it; the flat
    destination unit still gets a flat tensor (m1.w adds no element) and m0.w's step."""
    spec = ([("", [("m0.w", ()), ("m1.w", (0,))])], 2, "FULL_SHARD", None, True, torch.float32)
    src = make_layout(*spec)
    dst = layout_from_spec(spec[0], 1, use_orig_params=False, dtype=torch.float32)
    full = make_full(src, torch.float32, 0, groups=1)
    locs = [shard_full(src, full, r, per_element=PER_ELEMENT) for r in range(src.world_size)]
    assert not any("m1.w" in d["state"] for d in locs)
    out = reshard(src, locs, dst, per_element=PER_ELEMENT)
    assert len(out) == 1
    flat = out[0]["state"]["_flat_param"]
    assert_state_dicts_equal(
        {"exp_avg": full["state"]["m0.w"]["exp_avg"].reshape(1),
         "exp_avg_sq": full["state"]["m0.w"]["exp_avg_sq"].reshape(1),
         "step": full["state"]["m0.w"]["step"]}, flat)
    back = gather_full(dst, out)
    assert_state_dicts_equal(full["state"]["m0.w"], back["state"]["m0.w"])
    assert back["state"]["m1.w"]["exp_avg"].shape == (0,)


def test_zero_numel_orig_param_goes_to_the_rank_fsdp_marks_in_shard():
    """FSDP (probed, torch 2.13, 2 and 3 ranks): a zero-numel param at offset o is held,
    with empty per-element state and its scalars, by the rank with r*S < o <= (r+1)*S - 1;
    gather and reshard carry its state (step included) through."""
    # fp32, 3 ranks: a (3) at 0, z (0) at 4 (aligned), b (5) at 4..9, flat 9, S = 3
    units = [("", [("a", (3,)), ("z", (0,)), ("b", (5,))])]
    src = layout_from_spec(units, 3, use_orig_params=True, dtype=torch.float32)
    full = make_full(src, torch.float32, 1)
    locs = [shard_full(src, full, r, per_element=PER_ELEMENT) for r in range(3)]
    assert [("z" in d["state"]) for d in locs] == [False, True, False]
    z = locs[1]["state"]["z"]
    assert z["exp_avg"].shape == (0,) and z["exp_avg_sq"].shape == (0,) and "step" in z
    g = gather_full(src, locs)
    assert_state_dicts_equal(full, g)
    for dst_ws, dst_uop in [(1, False), (2, False), (2, True), (4, True)]:
        dst = layout_from_spec(units, dst_ws, use_orig_params=dst_uop, dtype=torch.float32)
        out = reshard(src, locs, dst, per_element=PER_ELEMENT)
        for r in range(dst_ws):
            assert_state_dicts_equal(shard_full(dst, full, r, per_element=PER_ELEMENT), out[r])
