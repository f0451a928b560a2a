"""accelerate 1.15.0 (examples/accelerate_trainer.py) under the suite, with FSDP2 and FSDP1
(``fsdp_version`` 2 and 1): its ``save_fsdp_optimizer`` / ``load_fsdp_optimizer`` with FULL
and SHARDED state dicts, and ``Accelerator.save_state`` / ``load_state`` with the scheduler
and step, each at the same world size and at another. Installed by the set-up (the
``trainers`` extra).

What the suite finds, asserted exactly (CPU, gloo, torch 2.13):
- FSDP2: every path passes.
- FSDP1 FULL ``save_fsdp_optimizer``: passes with ``use_orig_params=False``; with
  ``use_orig_params=True`` the loaded ``exp_avg`` holds ``exp_avg_sq`` (P3, P6 known: torch's
  aliasing of FULL optimizer state on CPU, recognised in accelerate's code by its effect).
- FSDP1 SHARDED (``save_fsdp_optimizer`` and ``save_state``): the load into a fresh optimizer
  restores no optimizer state (P3 "missing"): accelerate builds the DCP load target from the
  fresh optimizer's empty state (accelerate/utils/fsdp_utils.py:418). An optimizer that has
  state already (``prime``) loads exactly, at 2 and 2 -> 3 ranks.
- FSDP1 FULL ``save_state``: the model state dict (offload_to_cpu=True, forced by
  fsdp_utils.py:139-141) raises on rank 0 in torch (``use_orig_params=False``), or kills
  rank 0 with SIGSEGV (``use_orig_params=True``): notes/repro/fsdp1_full_model_sd_offload_cpu.py.
"""
from functools import partial

import pytest

from fsdp_conformance import size_id

pytest.importorskip("accelerate", reason="the `trainers` extra (scripts/setup-env installs it)")

from examples import accelerate_trainer as acc  # noqa: E402
from fsdp_conformance.user import RoundtripFailure, check  # noqa: E402

SIZES = ["2", "2->3"]
FULL, SHARDED = "FULL_STATE_DICT", "SHARDED_STATE_DICT"
V1 = dict(fsdp_version=1, plan=["body"])
"""FSDP1: the suite wraps ``body`` and the root (``shard_fn`` is FSDP2-only)."""


def _optimizer_fns(version: int, state_dict_type: str) -> dict:
    """The round trip's keyword arguments for ``save_fsdp_optimizer`` / ``load_fsdp_optimizer``
    under FSDP ``version``."""
    if version == 2:
        shard = acc.shard_full if state_dict_type == FULL else acc.shard_sharded
        return dict(fsdp_version=2, shard_fn=shard, save_fn=acc.save_optimizer,
                    load_fn=acc.load_optimizer)
    return dict(V1, save_fn=partial(acc.save_optimizer_v1, state_dict_type),
                load_fn=partial(acc.load_optimizer_v1, state_dict_type))


def _failing(**kw) -> list:
    """The CaseResults of a round trip the suite finds failing (``check`` raises)."""
    with pytest.raises(RoundtripFailure) as info:
        check(acc.Net, acc.batch, optimizer=acc.make_optimizer, **kw)
    return info.value.results


def _decided(result) -> dict:
    """Property -> status, for the properties this case decides."""
    return {p: v.status for p, v in result.properties.items() if v.status != "n/a"}


P3_P6_FAIL = {"P0": "pass", "P2": "pass", "P3": "fail", "P6": "fail", "P7": "pass",
              "P11": "pass"}
SAVE_RAISED = {"P0": "pass", "P2": "pass", "P3": "fail", "P6": "fail", "P7": "fail",
               "P10": "fail", "P11": "fail"}


@pytest.mark.parametrize("version,state_dict_type", [(2, FULL), (2, SHARDED), (1, FULL)],
                         ids=["v2-full", "v2-sharded", "v1-full"])
def test_save_fsdp_optimizer(fsdp_roundtrip, version, state_dict_type):
    fsdp_roundtrip(acc.Net, acc.batch, optimizer=acc.make_optimizer, world_sizes=SIZES,
                   **_optimizer_fns(version, state_dict_type))


def test_fsdp1_sharded_load_into_a_fresh_optimizer_restores_nothing():
    """accelerate's SHARDED load builds its DCP target from the fresh optimizer
    (fsdp_utils.py:418: no state yet), so DCP fills nothing and every param's state is
    missing after the load, silently."""
    for r in _failing(world_sizes=SIZES, **_optimizer_fns(1, SHARDED)):
        p = r.properties
        assert _decided(r) == P3_P6_FAIL, (r.case.id, _decided(r))
        assert "state['body._flat_param']: missing" in p["P3"].detail
        assert "state['_flat_param']: missing" in p["P3"].detail
        assert p["P3"].known == "" and "losses after resuming differ" in p["P6"].detail


def test_fsdp1_sharded_load_into_a_primed_optimizer_passes(fsdp_roundtrip):
    """The same checkpoint loaded into an optimizer that has state (``prime``): exact, on
    another world size too."""
    fsdp_roundtrip(acc.Net, acc.batch, optimizer=acc.make_optimizer, world_sizes=["2->3"],
                   save_fn=partial(acc.save_optimizer_v1, SHARDED),
                   load_fn=partial(acc.load_optimizer_v1_primed, SHARDED), **V1)


def test_fsdp1_full_optimizer_with_orig_params_inherits_torchs_aliasing():
    """``use_orig_params=True``: the FULL file's ``exp_avg`` holds ``exp_avg_sq`` (torch's
    orig-params-full-osd-aliasing on CPU, offload_to_cpu=True by accelerate's default). The
    load (P3) and the resumed run (P6) are exactly what that entry predicts, so they are
    known, naming the entry; nothing else differs."""
    [r] = check(acc.Net, acc.batch, optimizer=acc.make_optimizer, world_sizes=["2"],
                use_orig_params=True, **_optimizer_fns(1, FULL))
    p = r.properties
    assert _decided(r) == {**P3_P6_FAIL, "P3": "known", "P6": "known"}, _decided(r)
    assert {p["P3"].known, p["P6"].known} == {"orig-params-full-osd-aliasing"}
    assert "state['body.0.weight']['exp_avg']: value" in p["P3"].detail
    assert "['exp_avg_sq']" not in p["P3"].detail
    assert "as through the built-in path fsdp1.full" in p["P3"].detail


def test_save_state_fsdp2(fsdp_roundtrip):
    fsdp_roundtrip(acc.Net, acc.batch, fsdp_version=2, shard_fn=acc.shard_sharded,
                   optimizer=acc.make_optimizer, save_fn=acc.save_state,
                   load_fn=acc.load_state, world_sizes=SIZES)


def test_save_state_fsdp1_sharded_restores_step_and_scheduler_but_no_optimizer_state():
    for r in _failing(world_sizes=SIZES, save_fn=partial(acc.save_state_v1, SHARDED),
                      load_fn=partial(acc.load_state_v1, SHARDED), **V1):
        p = r.properties
        assert _decided(r) == P3_P6_FAIL, (r.case.id, _decided(r))
        assert "state['body._flat_param']: missing" in p["P3"].detail
        assert "step 2 and the scheduler restored" in p["P11"].detail


def test_save_state_fsdp1_full_raises_in_the_model_state_dict():
    """FULL ``save_state`` gathers the model with offload_to_cpu=True (forced at >1 process,
    fsdp_utils.py:139-141); on CPU torch frees the "CPU copy" (FlatParamHandle.to_cpu,
    _flat_param.py:1750-1751) and rank 0 raises; rank 1, waiting in a collective, is
    reported with it. Only the save runs, so one world size."""
    [r] = _failing(world_sizes=["2"], save_fn=partial(acc.save_state_v1, FULL),
                   load_fn=partial(acc.load_state_v1, FULL), **V1)
    assert _decided(r) == SAVE_RAISED, _decided(r)
    detail = r.properties["P3"].detail
    assert detail.startswith("the save function raised:\nrank 0: RuntimeError: setStorage:")
    assert "storage of size 0" in detail and "rank(s) [1]: stuck-after-error" in detail


def test_save_state_fsdp1_full_with_orig_params_kills_rank_0():
    """The same save with ``use_orig_params=True``: rank 0 dies of SIGSEGV in torch; the
    verdict names the dead rank and how it died first, with its log's last lines (the
    faulthandler stack), then rank 1's broken connection that follows from it."""
    [r] = _failing(world_sizes=["2"], use_orig_params=True,
                   save_fn=partial(acc.save_state_v1, FULL),
                   load_fn=partial(acc.load_state_v1, FULL), **V1)
    assert _decided(r) == SAVE_RAISED, _decided(r)
    detail = r.properties["P3"].detail
    assert detail.startswith("the save function raised:\nrank 0: died, killed by SIGSEGV "
                             "(exit code -11)\nrank 1: RuntimeError:"), detail
    assert "rank 0's log, where it died:" in detail and "param_hook" in detail, detail
    # a death is run once more on a fresh pool; it came again, so the verdicts stand
    assert r.rerun.rstrip().endswith("(second attempt: a rank died again)"), r.rerun


@pytest.mark.parametrize("sizes", ["2", "2->3", "3->2", "2x2->2"], ids=size_id)
@pytest.mark.parametrize("state_dict_type", [FULL, SHARDED], ids=["full", "sharded"])
def test_save_state_under_the_setup_hook(fsdp_roundtrip, state_dict_type, sizes):
    """The trainer's own construction (issue 45): the suite builds and shards, then
    ``setup_fn`` runs ``accelerator.prepare(model, optimizer, scheduler)`` and registers the
    step, as a trainer does; ``Accelerator.save_state`` / ``load_state`` checkpoint it,
    through a chain of two checkpoints. SHARDED passes every property; FULL inherits
    ``dsd-full-load-tuple-to-list`` (P6, P11 known), nothing else."""
    setup = acc.setup_full if state_dict_type == FULL else acc.setup_sharded
    [r] = fsdp_roundtrip(acc.Net, acc.batch, fsdp_version=2, optimizer=acc.make_optimizer,
                         setup_fn=setup, save_fn=acc.save_prepared, load_fn=acc.load_prepared,
                         world_sizes=[sizes])
    assert f"custom:save_prepared@{setup.__name__}/" in r.case.id, r.case.id
    assert r.setup["scheduler"].startswith("the zoo's") and r.setup["checkpoints_in_chain"] == 2
    known = {p: v.known for p, v in r.properties.items() if v.status == "known"}
    assert known == ({} if state_dict_type == SHARDED else
                     {"P6": "dsd-full-load-tuple-to-list", "P11": "dsd-full-load-tuple-to-list"})
    assert "held at checkpoint 2 of the chain" in r.properties["P3"].detail


def test_the_zoo_through_the_trainers_own_construction(fsdp_roundtrip):
    """``fsdp_roundtrip.zoo(..., setup_fn=...)``: the suite's zoo models go through
    accelerate's ``prepare`` and ``save_state``; the unused param's missing DCP key
    (accelerate's key prefix ``optimizer.``) and the FSDP-ignored module whose per-rank
    weights and state come back as the copy of the rank whose DCP file holds them
    (accelerate's own checkpoint directories, read by the entry's effect) are the known
    torch limitations they touch."""
    results = fsdp_roundtrip.zoo(acc.save_prepared, acc.load_prepared, setup_fn=acc.setup_sharded,
                                 models=["mlp", "tied", "unused", "buffers"], world_sizes=["2"])
    unused = next(r for r in results if "/unused." in r.case.id)
    assert unused.properties["P3"].known == "dcp-template-dummy-state-missing-key"
    assert "optimizer.state.unused.weight" in unused.properties["P3"].detail
    buffers = next(r for r in results if "/buffers." in r.case.id)
    p3 = buffers.properties["P3"]
    assert (p3.status, p3.known) == ("known", "dcp-dedups-unsynchronised-ignored-state"), p3
    assert "weights not restored" in p3.detail  # what the entry's effect explains, shown


def test_a_second_bug_behind_the_ignored_modules_known_limitation_fails():
    """The same accelerate load with one more wrong value planted (the loaded lr 1% off):
    nothing is excused, the ignored module's difference included."""
    from fsdp_conformance.user.driver import check_zoo

    with pytest.raises(RoundtripFailure) as info:
        check_zoo(acc.save_prepared, acc.load_prepared_lr_off, setup_fn=acc.setup_sharded,
                  models=["buffers"], world_sizes=["2"])
    p = info.value.results[0].properties
    assert p["P11"].status == "fail" and "['lr']" in p["P11"].detail, p["P11"].detail
    assert (p["P3"].status, p["P3"].known) == ("fail", ""), p["P3"]
