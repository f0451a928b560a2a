"""Differential tests: real FSDP1 on the rank pool (gloo) against the reference.

P0 layout, P1 gather, P3 shard/scatter/to_load, P4 flatten, each bitwise, for nested
wrapping, tied weights, frozen params, params without grads, ignored modules, a conv net,
use_orig_params both ways, the common optimizers, FULL_SHARD / SHARD_GRAD_OP / NO_SHARD /
HYBRID_SHARD, world sizes 1-4 and every save->load pair among them."""
from __future__ import annotations

import itertools

import pytest

from fsdp_conformance.cases import Case
from fsdp_conformance.known.entries import known_for
from fsdp_conformance.properties.baseline import local_run
from fsdp_conformance.properties.layouts import reference_layout
from fsdp_conformance.properties.run_props import p2_trained
from fsdp_conformance.zoo import model_spec
from fsdp_conformance.properties.expectation import EXACT
from fsdp_conformance.properties.families import FSDP1
from fsdp_conformance.properties.loaded import p3_loaded
from fsdp_conformance.properties.flatten import p4_flatten
from fsdp_conformance.properties.reference_props import flat_ranks, loaded_states, saved_dicts
from fsdp_conformance.properties.saved import p1_saved
from fsdp_conformance.properties.sharding import LayoutSide, p0_layout
from fsdp_conformance.sut import fsdp1

from .known_pairs import assert_ok as _assert_ok


def p2_judge(case, obs, layout):
    """P2 on every rank, as a judge of the expectation it is given (``layout(exp)`` builds
    the layout of the case it runs as): each rank's full dict against the single-process run (the rank's own, where a
    modelled bug trains the ranks apart). P1/P3/P4 judge each replica on its own; whether
    the replicas agree is this one's question. None where it cannot be judged: a save that
    raised (P1 reports it), a model with ignored modules (no single-process run matches),
    several param groups (the observer groups flat params by their own names, not by the
    params they hold as the run's paths do, so it trains another optimizer than the
    single-process run; the run's P2 judges several groups)."""
    if model_spec(case.model).ignored or case.groups != 1 or \
            any("error" in o["full_legacy"] for o in obs):
        return None
    return lambda exp: p2_trained(layout(exp), [o["full_legacy"] for o in obs],
                                  local_run(case, exp), case.dtype, exp=exp)


def _check_same_layout(rank_pool, case):
    obs = rank_pool(case.world_size).run(fsdp1.observe, case, seed=case.seed)
    layout = reference_layout(case)
    _assert_ok(p0_layout(FSDP1, [LayoutSide(layout=layout, observations=obs)]),
               f"P0 {case.id}")
    _assert_ok(lambda exp: p1_saved(FSDP1, layout, [o["local"] for o in obs],
                                    saved_dicts(obs, "full_legacy"), exp=exp),
               f"P1 full_optim_state_dict {case.id}",
               case, "P1")
    _assert_ok(lambda exp: p1_saved(FSDP1, layout, [o["local"] for o in obs],
                                    saved_dicts(obs, "full_current"), exp=exp),
               f"P1 optim_state_dict FULL {case.id}",
               case, "P1")
    if known_for(case, "P1") is None:  # a corrupted full dict cannot be sharded meaningfully
        _assert_ok(lambda exp: p3_loaded(FSDP1, layout, loaded_states(
            [o["full_legacy"] for o in obs], obs, exp=exp), exp=exp), f"P3 {case.id}", case,
                   "P3")
    _assert_ok(lambda exp: p4_flatten(FSDP1, layout, flat_ranks(obs, exp)), f"P4 {case.id}",
               case, "P4")
    p2 = p2_judge(case, obs, lambda exp: reference_layout(case, exp=exp))
    if p2 is not None:
        _assert_ok(p2, f"P2 {case.id}", case, "P2")
    assert obs[1 % case.world_size]["full_legacy_rank0_only"] == ({} if case.world_size > 1
                                                                  else obs[0]["full_legacy_rank0_only"])
    return obs


MODELS = ["mlp", "tied", "frozen", "unused", "buffers", "conv"]


@pytest.mark.parametrize("ws", [1, 2, 3, 4])
@pytest.mark.parametrize("orig", [False, True], ids=["flat", "orig"])
@pytest.mark.parametrize("model", MODELS)
def test_zoo_models_all_world_sizes(rank_pool, model, orig, ws):
    _check_same_layout(rank_pool, Case(model=model, plan="nested", optimizer="adam",
                                       use_orig_params=orig, world_size=ws))


@pytest.mark.parametrize("ws", [2, 3])
@pytest.mark.parametrize("orig", [False, True], ids=["flat", "orig"])
@pytest.mark.parametrize("opt", ["sgd", "sgd_momentum", "adamw", "adadelta", "adagrad",
                                 "rmsprop"])
def test_optimizers(rank_pool, opt, orig, ws):
    _check_same_layout(rank_pool, Case(model="mlp", plan="nested", optimizer=opt,
                                       use_orig_params=orig, world_size=ws, groups=2))


@pytest.mark.parametrize("strategy,ws", [("SHARD_GRAD_OP", 3), ("NO_SHARD", 2),
                                         ("HYBRID_SHARD", 4)])
@pytest.mark.parametrize("orig", [False, True], ids=["flat", "orig"])
def test_sharding_strategies(rank_pool, strategy, ws, orig):
    _check_same_layout(rank_pool, Case(model="mlp", plan="nested", optimizer="adam",
                                       use_orig_params=orig, world_size=ws, strategy=strategy))


@pytest.mark.parametrize("strategy", ["NO_SHARD", "HYBRID_SHARD"])
def test_replicas_that_disagree_pass_p1_and_fail_p2(rank_pool, strategy):
    """P1/P3/P4 judge each replica on its own (a NO_SHARD rank, an HSDP shard group), so a
    bug that trains the replicas apart leaves them consistent there; P2 must fail it. One
    element of the last rank's state nudged wherever that rank reports it (its local dict
    and its full dicts, as a replica that trained apart would) passes P1 and fails P2,
    naming that rank and no other."""
    ws = 2 if strategy == "NO_SHARD" else 4
    # (SGD with momentum: Adam's full dicts with original params carry the aliasing bug)
    case = Case(model="mlp", plan="nested", optimizer="sgd_momentum", use_orig_params=True,
                world_size=ws, strategy=strategy)
    obs = rank_pool(ws).run(fsdp1.observe, case, seed=case.seed)
    layout = reference_layout(case)
    clean = p2_judge(case, obs, lambda exp: layout)(EXACT)
    assert clean.status == "pass", clean.detail
    last = ws - 1
    for key in ("local", "full_legacy", "full_current"):
        st = obs[last][key]["state"]
        fqn = next(k for k in sorted(st) if st[k]["momentum_buffer"].numel())
        t = st[fqn]["momentum_buffer"].clone()
        t.view(-1)[0] += 1e-3
        st[fqn] = {**st[fqn], "momentum_buffer": t}
    if strategy == "NO_SHARD":  # HSDP: the full dict is gathered over the shard group
        assert p1_saved(FSDP1, layout, [o["local"] for o in obs],
                        saved_dicts(obs, "full_legacy")).status == "pass"
    v = p2_judge(case, obs, lambda exp: layout)(EXACT)
    assert v.status == "fail" and f"rank {last}:" in v.detail, v.detail
    assert not any(f"rank {r}:" in v.detail for r in range(last)), v.detail


@pytest.mark.parametrize("src,dst", list(itertools.product([1, 2, 3, 4], repeat=2)))
@pytest.mark.parametrize("orig", [False, True], ids=["flat", "orig"])
def test_save_at_n_load_at_m(rank_pool, src, dst, orig):
    case = Case(model="mlp", plan="nested", optimizer="adam", use_orig_params=orig,
                world_size=src, load_world_size=dst, load_plan="block",
                groups=1)  # FSDP1 needs a flat unit in one param group: "block" joins both
    saved = rank_pool(src).run(fsdp1.observe, case)
    full = saved[0]["full_legacy"]
    assert "error" not in full, full.get("error")
    loaded = rank_pool(dst).run(fsdp1.load_full, case, full)
    layout = reference_layout(case, load_side=True)
    _assert_ok(p0_layout(FSDP1, [LayoutSide(layout=layout, observations=loaded)]),
               f"P0 load side {case.id}")
    _assert_ok(p3_loaded(FSDP1, layout, loaded_states(full, loaded, own_locals=False)),
               f"P3 {case.id}")


def test_a_second_failure_on_a_known_pair_is_not_accepted():
    """_assert_ok accepts a known pair's failure only as the entry records it: another
    failure there (a second bug) fails the test."""
    from fsdp_conformance.properties.verdict import error

    case = Case(api="fsdp1.sharded", optimizer="sgd", world_size=2)
    assert known_for(case, "P3").key == "dcp-drops-empty-optimizer-state"
    _assert_ok(error('load failed: ValueError: `optim_state_dict` must have the keys "state"'
                     'to be valid'), "P3", case, "P3")
    with pytest.raises(AssertionError, match="not as known limitation"):
        _assert_ok(error("load failed: KeyError: 'brand-new'"), "P3", case, "P3")
