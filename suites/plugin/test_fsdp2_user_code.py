"""A user's own FSDP2 app-state save/load under the plugin: each bug planted into the
example trainer (examples/fsdp2_trainer.py; suites/plugin/fsdp2_userfns.py) fails, naming
the property and the param, group or key; the correct asynchronous save passes. Real
``fully_shard`` on a gloo CPU mesh, real DCP."""
import pytest

from examples.fsdp2_trainer import (TinyTransformerish, batch, load_checkpoint,
                                    make_optimizer, make_scheduler, save_checkpoint, shard)
from fsdp_conformance.user import RoundtripFailure, check
from suites.plugin import fsdp2_userfns as bug

TRAINER = dict(fsdp_version=2, shard_fn=shard, optimizer=make_optimizer,
               scheduler=make_scheduler)


def _failure(save, load, sizes="2->3", **kw) -> str:
    with pytest.raises(RoundtripFailure) as info:
        check(TinyTransformerish, batch, save_fn=save, load_fn=load, world_sizes=[sizes],
              **{**TRAINER, **kw})
    return str(info.value)


def _verdict(message: str, prop: str) -> str:
    """The lines of one property's verdict in a failure message."""
    lines = message.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith(f"{prop} ("))
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].startswith("  ") and not lines[i].startswith("    ")), len(lines))
    return "\n".join(lines[start:end])


def test_a_save_that_drops_a_groups_lr_fails_p11():
    v = _verdict(_failure(bug.save_drops_lr, bug.load_drops_lr), "P11")
    assert "FAIL" in v and "param_groups after loading differ" in v and "[0]['lr']" in v
    assert "likely cause: the param groups after the load hold the fresh optimizer's " \
        "hyperparameters" in v, v


def test_state_rounded_to_bf16_fails_p3_naming_the_param():
    msg = _failure(bug.save_rounds_bf16, load_checkpoint)
    v = _verdict(msg, "P3")
    assert "FAIL" in v and "state['blocks.0.ff.0.weight']['exp_avg']" in v, v


def test_a_skipped_scheduler_fails_p11_and_p6():
    msg = _failure(bug.save_skips_scheduler, bug.load_skips_scheduler, "2")
    p11 = _verdict(msg, "P11")
    assert "FAIL" in p11 and "scheduler after the load vs at the save: 'last_epoch': " \
        "expected 2, got 0" in p11, p11
    assert "likely cause: the LR scheduler was not restored" in p11, p11
    assert "scheduler after resuming vs the uninterrupted run" in _verdict(msg, "P6")


def test_a_step_counter_left_at_zero_is_named():
    msg = _failure(save_checkpoint, bug.load_skips_step, "2")
    p11 = _verdict(msg, "P11")
    assert "the step after the load is 0, expected 2" in p11, p11
    assert "likely cause: the training step counter was not restored" in p11, p11


def test_state_a_load_skipped_is_named():
    msg = _failure(bug.save_full_optim, bug.load_full_optim_skipping, "2", scheduler=None)
    p3 = _verdict(msg, "P3")
    assert "FAIL" in p3 and "likely cause: 2 of 16 param(s) had optimizer state at the save " \
        "and have none, or a fresh all-zero one, after the load" in p3, p3
    assert "'out.bias'" in p3 and "strict=False" in p3


def test_an_unwaited_async_save_fails_p7():
    v = _verdict(_failure(bug.save_async_unwaited, load_checkpoint, "2"), "P7")
    assert "FAIL" in v and "still being written when save_fn returned" in v
    assert "AsyncCheckpointExecutor" in v or "torch.distributed.checkpoint" in v


def test_a_waited_async_save_passes():
    results = check(TinyTransformerish, batch, save_fn=bug.save_async_waited,
                    load_fn=load_checkpoint, world_sizes=["2->3"], **TRAINER)
    p = results[0].properties
    assert {k: p[k].status for k in ("P3", "P6", "P7", "P11")} == dict.fromkeys(
        ("P3", "P6", "P7", "P11"), "pass")
    assert "step 2 and the scheduler restored" in p["P11"].detail


def test_a_known_torch_limitation_is_recognised_in_user_code_by_its_effect():
    """A user's full-dict load through DSD turns AdamW's betas into a list (the entry
    dsd-full-load-tuple-to-list): known, by its exact effect, naming the entry."""
    r = check(TinyTransformerish, batch, save_fn=bug.save_full_optim,
              load_fn=bug.load_full_optim, world_sizes=["2->3"], fsdp_version=2,
              shard_fn=shard, optimizer=make_optimizer)[0]
    p = r.properties
    assert (p["P11"].status, p["P11"].known) == ("known", "dsd-full-load-tuple-to-list")
    assert "as through the built-in path fsdp2.full" in p["P11"].detail
    assert p["P3"].status == "pass"


def test_a_second_bug_behind_a_known_one_fails():
    """The same load with one momentum element off: the known effect no longer explains
    everything, so nothing is known and P3 fails naming the param."""
    msg = _failure(bug.save_full_optim, bug.load_full_optim_nudged, scheduler=None)
    v = _verdict(msg, "P3")
    assert "FAIL" in v and "state['out.weight']['exp_avg']" in v, v
    assert "FAIL" in _verdict(msg, "P11")  # the betas are no longer excused either


def test_a_known_torch_exception_is_recognised_in_user_code():
    """A stateless SGD through the user's full-dict DSD load: torch's
    _load_optim_state_dict asserts (dsd-stateless-full-load). Every property the failed load
    decides is known by that entry's exception, naming the built-in path."""
    r = check(TinyTransformerish, batch, save_fn=bug.save_full_optim,
              load_fn=bug.load_full_optim, world_sizes=["2"], fsdp_version=2,
              shard_fn=shard, optimizer="sgd")[0]
    p = r.properties
    assert {k: (v.status, v.known) for k, v in p.items() if v.status not in ("n/a", "pass")} \
        == dict.fromkeys(("P3", "P6", "P7", "P10", "P11"), ("known", "dsd-stateless-full-load"))
    assert "raised exactly this entry's exception, as through the built-in path fsdp2.full" \
        in p["P3"].detail


def test_the_same_message_raised_by_user_code_is_not_torchs():
    """The same exception type and message raised from the user's own function, not from
    torch's: not the entry's exception, so it fails."""
    with pytest.raises(RoundtripFailure) as info:
        check(TinyTransformerish, batch, save_fn=bug.save_full_optim,
              load_fn=bug.load_raising_the_same_message, world_sizes=["2"], fsdp_version=2,
              shard_fn=shard, optimizer="sgd")
    p3 = info.value.results[0].properties["P3"]
    assert (p3.status, p3.known) == ("fail", ""), p3
    assert "in load_raising_the_same_message" in p3.detail, p3.detail


def test_a_scheduler_rebuilt_from_the_step_passes_with_its_restarted_counter_shown():
    """torchtune's recipe does not checkpoint its LambdaLR and rebuilds it from the step:
    ``_step_count`` restarts, which LambdaLR never reads (properties/scheduler_probe.py).
    Every lr is right, so P6 and P11 pass, and the difference is shown as information."""
    results = check(TinyTransformerish, batch, save_fn=bug.save_rebuilds_scheduler,
                    load_fn=bug.load_rebuilds_scheduler, world_sizes=["2", "2->3"], **TRAINER)
    for r in results:
        p11, p6 = r.properties["P11"], r.properties["P6"]
        assert p11.status == "pass" and p6.status == "pass", (p11.detail, p6.detail)
        assert "'_step_count': expected 3, got 1 (information: LambdaLR does not read it" \
            in p11.detail, p11.detail
        assert "'_step_count'" in p6.detail and "information" in p6.detail, p6.detail


def test_a_scheduler_rebuilt_one_step_short_fails_naming_last_epoch_and_the_lr():
    msg = _failure(bug.save_rebuilds_scheduler, bug.load_rebuilds_scheduler_one_short, "2")
    p11 = _verdict(msg, "P11")
    assert "FAIL" in p11 and "'last_epoch': expected 2, got 1 (LambdaLR reads it: the lr of " \
        "group 0 after 1 step(s) would be" in p11, p11


def test_a_load_that_skips_the_weights_fails_p3_and_p6():
    """Nothing is restored on the load's behalf (issue 45): the fresh model keeps its
    initialisation when the user's training-state load leaves the model out."""
    msg = _failure(save_checkpoint, bug.load_skips_weights, "2->3")
    p3, p6 = _verdict(msg, "P3"), _verdict(msg, "P6")
    assert "FAIL" in p3 and "the model weights right after the load are not the saved ones " \
        "(weights not restored): 16 of 16 params differ on rank 0" in p3, p3
    assert "FAIL" in p6 and "likely cause: the load did not restore the model's weights" \
        in p6, p6


def shard_scaled(model, mesh):
    from torch.distributed.fsdp import fully_shard

    fully_shard(model.inp, mesh=mesh)
    fully_shard(model, mesh=mesh)


def test_a_load_that_turns_a_buffer_into_a_parameter_is_named_as_the_cause():
    """Issue 45: a load that wraps a persistent float buffer in nn.Parameter was reported as
    'the load skipped what it did not match'; the cause named is the changed model."""
    with pytest.raises(RoundtripFailure) as info:
        check(bug.Scaled, batch, save_fn=save_checkpoint, load_fn=bug.load_buffer_to_param,
              world_sizes=["2"], fsdp_version=2, shard_fn=shard_scaled,
              optimizer=make_optimizer, scheduler=make_scheduler)
    msg = str(info.value)
    assert "likely cause: the load changed the model's parameters (rank(s) [0, 1]; rank 0: " \
        "added ['scale'] (['scale'] were buffers before it: wrapped in nn.Parameter))" in msg, msg
    assert "skipped what it did not match" not in msg, msg


def test_a_second_scheduler_that_breaks_the_step_is_named_and_the_order_can_be_said():
    """Issue 45: a load that builds its own scheduler (and counts steps by re-binding
    optimizer.step) on the optimizer the suite gave a scheduler before load_fn breaks the
    resumed optimizer.step() (torchtune's tester saw this TypeError); the failure names the
    construction order as the cause. Said with scheduler_after_load=True, the step works and
    what remains is the load's own: DCP restores only the keys of its template, so the
    rebuilt LambdaLR(last_epoch=step - 1) starts from the loaded lr as its initial_lr (the
    class of the known limitation dsd-load-drops-group-keys-the-optimizer-lacks)."""
    msg = _failure(bug.save_rebuilds_scheduler, bug.load_rebuilds_scheduler_counting, "2")
    p6 = _verdict(msg, "P6")
    assert "TypeError: 'AdamW' object is not callable" in p6, p6
    assert "likely cause: load_fn built another LR scheduler (LambdaLR) on an optimizer that " \
        "already had one" in p6 and "scheduler_after_load=True" in p6, p6
    msg = _failure(bug.save_rebuilds_scheduler, bug.load_rebuilds_scheduler_counting, "2",
                   scheduler_after_load=True)
    assert "+sched@load" in msg and "not callable" not in msg and "raised" not in msg, msg
    assert "param_groups[0]['initial_lr']: value; expected 0.003, got 0.002" in msg, msg


def test_p0_judges_the_pieces_on_the_mesh_the_model_is_on():
    """Issue 45, P0 by pieces: an HSDP case's one-replica side sharded by the user on an
    equivalent 1-D mesh (identical local pieces) passes; P0 read the case's own 2-D mesh
    before and failed every placement."""
    results = check(TinyTransformerish, batch, save_fn=save_checkpoint, load_fn=load_checkpoint,
                    world_sizes=["2x2->2"], **{**TRAINER, "shard_fn": bug.shard_on_own_mesh})
    p0 = results[0].properties["P0"]
    assert p0.status == "pass", p0.detail


def test_the_report_describes_the_users_setup_as_it_is(tmp_path):
    """Issue 45, item 8: the JSON report said "scheduler": "exp" and "app_state": false for a
    user's own setup; each user case now carries ``setup``: whose pieces ran and what the
    checkpoint holds."""
    import json

    from fsdp_conformance.report.run_report import build_report

    [r] = check(TinyTransformerish, batch, save_fn=save_checkpoint, load_fn=load_checkpoint,
                world_sizes=["2"], **TRAINER)
    entry = next(c for c in build_report([r], tier="quick", backend="gloo", seed=0,
                                         world_sizes=[2], wall_time_s=1.0, argv=[],
                                         selection=None, tolerances={})["cases"])
    setup = json.loads(json.dumps(entry["setup"]))
    assert setup["scheduler"] == "examples.fsdp2_trainer:make_scheduler", setup
    assert setup["checkpoint"] == "the training state (model, optimizer, scheduler, step)"
    assert setup["scheduler_built"] == "before load_fn, which restores it"
    assert setup["save_fn"] == "examples.fsdp2_trainer:save_checkpoint"
    assert setup["checkpoints_in_chain"] == 2 and setup["shard_fn"] == "examples.fsdp2_trainer:shard"


def test_whether_the_load_restored_the_random_number_states_is_reported():
    """Issue 45: RNG states restored or not are reported, as information (the suite's
    training draws none): the example trainer's DCP app state holds no RNG, so its load
    leaves them fresh; a load that restores them (bug.save_with_rng) is seen to."""
    for save, load, want in ((save_checkpoint, load_checkpoint,
                              ["python not restored on rank(s) [0, 1]",
                               "torch not restored on rank(s) [0, 1]"]),
                             (bug.save_with_rng, bug.load_with_rng,
                              ["python restored on rank(s) [0, 1]",
                               "torch restored on rank(s) [0, 1]"])):
        [r] = check(TinyTransformerish, batch, save_fn=save, load_fn=load, world_sizes=["2"],
                    **TRAINER)
        p6 = r.properties["P6"]
        assert p6.ok and "(information: random-number states as at the save: " in p6.detail
        assert all(w in p6.detail for w in want), p6.detail
    [r] = check(TinyTransformerish, batch, save_fn=bug.save_with_rng, load_fn=bug.load_with_rng,
                world_sizes=["2->3"], **TRAINER)
    assert "rank(s) [2] had no rank of their own at the save" in r.properties["P6"].detail


def test_state_dropped_for_params_frozen_at_the_load_is_named():
    """Issue 45, item 5: a staged trainer freezes a layer and then loads; DSD keeps saved
    state only for params that require grad, so the frozen layer's state is dropped (and
    unfreezing it later resumes from a fresh state). The cause names the frozen params, not
    'the load skipped what it did not match'."""
    msg = _failure(save_checkpoint, bug.load_frozen_first, "2")
    p3 = _verdict(msg, "P3")
    assert "likely cause: 2 param(s) frozen (requires_grad=False) when the checkpoint loaded " \
        "had optimizer state at the save and have none after the load (e.g. ['inp.bias', " \
        "'inp.weight'])" in p3, p3
    assert "state['inp.weight']: missing" in p3 and "skipped what it did not match" not in msg


def shard_frozen_input(model, mesh):
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def test_a_users_frozen_layer_with_adagrad_is_the_known_limitation_it_touches():
    """Issue 45, item 12: the entries of the zoo's `frozen` model match a user's model with a
    layer frozen from the start (its trait, read in the controller), not the zoo's name: DCP
    drops the frozen layer's Adagrad state at the first load, and what that leaves at the
    chain's second load (DCP's 'Missing key') is exactly the next entry's exception."""
    [r] = check(bug.FrozenInput, batch, save_fn=save_checkpoint, load_fn=load_checkpoint,
                world_sizes=["2"], fsdp_version=2, shard_fn=shard_frozen_input,
                optimizer="adagrad", scheduler=make_scheduler)
    assert r.setup["traits"] == ["frozen_from_start"], r.setup
    p3 = r.properties["P3"]
    assert (p3.status, p3.known) == ("known", "dsd-sharded-load-drops-frozen-state"), p3.detail
    assert "what it leaves is exactly 'dsd-dropped-frozen-state-breaks-next-dcp-load'" \
        in p3.detail, p3.detail
