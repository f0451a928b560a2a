"""Differential tests: real FSDP2 (``fully_shard`` + ``torch.distributed.checkpoint.state_dict``)
on the rank pool (gloo) against the reference, bitwise; and DTensor input to the reference's
``flatten_sharded`` (FSDP1 with ``device_mesh=``, SHARDED_STATE_DICT).

Per case: the optimizer's key order and every param's dim-0 rows (P0), the full dict on every
rank, rank 0 only, and flattened (P1), every ``set_optimizer_state_dict`` path -- full dict
with and without ``broadcast_from_rank0``, strict and not, flattened, sharded -- against
``reference.fsdp2_shard`` and the rank's own state (P3), their ``param_groups`` (P11), and the
sharded DTensor dict against the local state (P4); for the zoo models (tied weights, frozen
params, a param without gradients, an ignored module, conv), the common optimizers, 1-D,
HSDP and replicate-only meshes, world sizes 1-4 and every save->load pair among them.
Known torch limitations must still fail, with their recorded symptom (``known/entries.py``)."""
from __future__ import annotations

import itertools

import pytest

from fsdp_conformance.cases import Case
from fsdp_conformance.harness.errors import RankError
from fsdp_conformance.known.entries import known_all
from fsdp_conformance.properties import fsdp2_props as P
from fsdp_conformance.properties.families import FSDP1, FSDP2
from fsdp_conformance.properties.flatten import p4_flatten
from fsdp_conformance.properties.groups import p11_groups
from fsdp_conformance.properties.loaded import p3_loaded
from fsdp_conformance.properties.saved import p1_saved
from fsdp_conformance.properties.sharding import LayoutSide, p0_layout
from fsdp_conformance.properties.layouts import fsdp2_reference_layout, reference_layout
from fsdp_conformance.sut import fsdp1_dtensor, fsdp2

from .known_pairs import assert_ok as _assert_ok

TIMEOUT = 60
LOAD_PATHS = P.FULL_LOAD_PATHS + ("set_flattened",)


def _broadcast_twin_known(case, path):
    """A broadcast path is skipped (n/a) when its non-broadcast twin failed to load: allowed
    only when that failure is a recorded one."""
    twin = path.replace("_broadcast", "")
    return twin != path and bool(known_all(case, f"P3:{twin}"))


def _check_same_layout(rank_pool, case, nonstrict=False, extras=True):
    """Every check at the save side's own world size and plan. ``nonstrict``: also the
    strict=False load paths (they differ from the strict ones only where the checkpoint lacks
    state: the 'unused' model; elsewhere they would only cost time). ``extras``: also the
    rank-0-only, offloaded and flattened dicts (and loading the flattened one)."""
    obs = rank_pool(case.world_size).run(fsdp2.observe, case, nonstrict, extras, seed=case.seed,
                                         timeout=TIMEOUT)
    layout = fsdp2_reference_layout(case)
    _assert_ok(p0_layout(FSDP2, [LayoutSide(layout=layout, observations=obs)]),
               f"P0 {case.id}", case, "P0:fsdp2")
    for path in ("full", "full_rank0", "flattened") if extras else ("full",):
        _assert_ok(p1_saved(FSDP2, layout, [o["local"] for o in obs], P.saved_dicts(obs, path)), f"P1 {path} {case.id}", case, f"P1:{path}")
    full = obs[0]["full"]
    paths = [p for p in LOAD_PATHS if (nonstrict or "nonstrict" not in p)
             and (extras or p != "set_flattened")]
    for path in paths:
        na_ok = _broadcast_twin_known(case, path)
        _assert_ok(lambda exp: p3_loaded(FSDP2, layout, P.loaded_states(full, obs, paths=(path,)),
                                         exp=exp), f"P3 {path} {case.id}",
                   case, f"P3:{path}", allow_na=na_ok)
        _assert_ok(lambda exp: p11_groups(full, P.groups_after(obs, path), exp=exp),
                   f"P11 {path} {case.id}", case, f"P11:{path}",
                   allow_na=True)
    _assert_ok(p3_loaded(FSDP2, layout, P.reloaded_states(obs)), f"P3 set_sharded {case.id}", case, "P3:set_sharded")
    _assert_ok(lambda exp: p11_groups(full, P.groups_after(obs, "set_sharded"), exp=exp),
               f"P11 set_sharded {case.id}", case,
               "P11:set_sharded", allow_na=True)
    for path in ("sharded", "sharded_offload") if extras else ("sharded",):
        _assert_ok(p4_flatten(FSDP2, layout, P.sharded_ranks(layout, obs, path)), f"P4 {path} {case.id}", case, f"P4:{path}")
    return obs


MODELS = ["mlp", "tied", "frozen", "unused", "buffers", "conv"]


@pytest.mark.parametrize("ws", [1, 2, 3, 4])
@pytest.mark.parametrize("model", MODELS)
def test_zoo_models_all_world_sizes(rank_pool, model, ws):
    _check_same_layout(rank_pool, Case(api="fsdp2", model=model, plan="nested", optimizer="adam",
                                       world_size=ws), nonstrict=model == "unused",
                       extras=ws in (2, 3))


@pytest.mark.parametrize("ws", [2, 3])
@pytest.mark.parametrize("opt", ["sgd", "sgd_momentum", "adamw", "adadelta", "adagrad", "rmsprop"])
def test_optimizers(rank_pool, opt, ws):
    _check_same_layout(rank_pool, Case(api="fsdp2", model="mlp", plan="nested", optimizer=opt,
                                       world_size=ws, groups=2))


@pytest.mark.parametrize("opt", ["sgd_momentum", "rmsprop"])
def test_param_without_grad_other_optimizers(rank_pool, opt):
    """The strict / dummy-step limitations hold beyond Adam (every lazily-initialised optimizer)."""
    _check_same_layout(rank_pool, Case(api="fsdp2", model="unused", plan="nested", optimizer=opt,
                                       world_size=3), nonstrict=True)


@pytest.mark.parametrize("strategy,ws", [("SHARD_GRAD_OP", 3), ("HYBRID_SHARD", 4),
                                         ("NO_SHARD", 2)])
def test_meshes(rank_pool, strategy, ws):
    """SHARD_GRAD_OP: reshard_after_forward=False; HYBRID_SHARD: a (2, 2) mesh, placements
    (Replicate(), Shard(0)); NO_SHARD: a (ws, 1) mesh, every param replicated."""
    obs = _check_same_layout(rank_pool, Case(api="fsdp2", model="mlp", plan="nested",
                                             optimizer="adam", world_size=ws, strategy=strategy))
    want = {"SHARD_GRAD_OP": (ws,), "HYBRID_SHARD": (2, 2), "NO_SHARD": (ws, 1)}[strategy]
    assert all(tuple(o["mesh_shape"]) == want for o in obs)


def test_tied_weights_across_groups_rejected(rank_pool):
    """FSDP2 refuses a tied param whose users sit in different fully_shard groups, naming the
    param and the fix (FSDP1 silently unties it: known/entries.py 'tied-param-split-across-units')."""
    case = Case(api="fsdp2", model="tied", plan="split", optimizer="adam", world_size=2)
    with pytest.raises(RankError, match="embed.weight' is shared with a parameter already "
                                        "managed by another FSDP group"):
        rank_pool(2).run(fsdp2.observe, case, timeout=TIMEOUT)


_SAVED: dict = {}


@pytest.mark.parametrize("src,dst", list(itertools.product([1, 2, 3, 4], repeat=2)))
def test_save_at_n_load_at_m(rank_pool, src, dst):
    """Rank 0's full dict saved at world size ``src`` loads at ``dst`` through every full-dict
    path (another wrapping plan too: FSDP2's layout does not depend on it)."""
    case = Case(api="fsdp2", model="mlp", plan="nested", optimizer="rmsprop", groups=2,
                world_size=src, load_world_size=dst, load_plan="block")
    if src not in _SAVED:
        saved = rank_pool(src).run(fsdp2.save_full, case, timeout=TIMEOUT)
        _assert_ok(p1_saved(FSDP2, fsdp2_reference_layout(case), [o["local"] for o in saved],
                            P.saved_dicts(saved, "full")),
                   f"P1 full {case.id}", case, "P1:full")
        _SAVED[src] = saved[0]["full"]
    full = _SAVED[src]
    loaded = rank_pool(dst).run(fsdp2.load_full, case, full, False, timeout=TIMEOUT)
    layout = fsdp2_reference_layout(case, load_side=True)
    _assert_ok(p0_layout(FSDP2, [LayoutSide(layout=layout, observations=loaded)]),
               f"P0 load side {case.id}", case, "P0:fsdp2")
    for path in ("set_full", "set_full_broadcast"):
        _assert_ok(p3_loaded(FSDP2, layout, P.loaded_states(full, loaded, paths=(path,),
                                                    own_locals=False)),
                   f"P3 {path} {case.id}", case, f"P3:{path}")
        _assert_ok(lambda exp: p11_groups(full, P.groups_after(loaded, path), exp=exp),
                   f"P11 {path} {case.id}", case, f"P11:{path}")


# --- DTensor input to the reference flatten: FSDP1 with device_mesh=, SHARDED ------------------
@pytest.mark.parametrize("model,orig,ws,strategy", [
    ("mlp", False, 2, "FULL_SHARD"), ("mlp", True, 3, "FULL_SHARD"),
    ("mlp", False, 3, "FULL_SHARD"), ("mlp", True, 4, "HYBRID_SHARD"),
    ("buffers", True, 2, "FULL_SHARD"), ("conv", False, 4, "FULL_SHARD"),
], ids=lambda v: str(v) if not isinstance(v, bool) else ("orig" if v else "flat"))
def test_dtensor_input_to_reference_flatten(rank_pool, model, orig, ws, strategy):
    """torch 2.13 does produce DTensors here (FSDP1 chunks each state with _ext_chunk_dtensor
    when it has a device mesh); the reference reads them on the rank (``to_pieces``), and
    ``flatten_sharded`` of every rank's pieces equals ``optim_state_dict_to_load`` and the
    rank's own flat state, bitwise."""
    case = Case(model=model, plan="nested", optimizer="adam", use_orig_params=orig, world_size=ws,
                strategy=strategy)
    obs = rank_pool(ws).run(fsdp1_dtensor.observe, case, seed=case.seed, timeout=TIMEOUT)
    assert "DTensor" in obs[0].get("value_types", []), obs[0].get("value_types", obs[0].get("sharded"))
    v = p4_flatten(FSDP1, reference_layout(case), P.dtensor_ranks(obs))
    assert v.status == "pass", f"P4 DTensor flatten {case.id}: {v.status}\n{v.detail}"
