"""torchtitan 0.3.0 (examples/torchtitan_trainer.py) under the suite: its
``CheckpointManager.save(step)`` / ``load()`` of a ``fully_shard`` model, the AdamW of its
``OptimizersContainer`` (two param groups), the warm-up/decay ``LRSchedulersContainer`` and
the step, at the same world size, onto another one, and from an HSDP mesh (2 replicas x 2
shards) onto 2 ranks; every property the suite decides for a trainer's own checkpoint code
(P0, P2, P3, P6, P7, P10, P11 with the step and the scheduler) is judged: all pass.
What it finds in torchtitan, each asserted exactly: optimizer state read before ``load()``
makes the load restore no per-param state while returning True; a save before the first
step steps the optimizer (P7); a param without optimizer state at the save makes the load
raise (P10). Reproducers: notes/repro/torchtitan_*.py. Installed by the set-up (the
``trainers`` extra)."""
import pytest

from fsdp_conformance import size_id

pytest.importorskip("torchtitan", reason="the `trainers` extra (scripts/setup-env installs it)")

from fsdp_conformance.user import RoundtripFailure, check  # noqa: E402
from examples import torchtitan_trainer as tt  # noqa: E402

ARGS = dict(fsdp_version=2, shard_fn=tt.shard, optimizer=tt.make_optimizer,
            scheduler=tt.make_scheduler)


@pytest.mark.parametrize("sizes", ["2", "2->3", "2x2->2"], ids=size_id)
def test_checkpoint_manager(fsdp_roundtrip, sizes):
    [r] = fsdp_roundtrip(tt.TinyDecoder, tt.batch, **ARGS, save_fn=tt.save_checkpoint,
                         load_fn=tt.load_checkpoint, world_sizes=[sizes])
    decided = ("P0", "P2", "P3", "P6", "P7", "P10", "P11")
    statuses = {p: r.properties[p].status for p in decided}
    assert statuses == {**{p: "pass" for p in decided}, "P10": "n/a"}, statuses
    assert "step 2 and the scheduler restored" in r.properties["P11"].detail


def test_reading_optimizer_state_before_load_restores_nothing():
    """The trap of torchtitan's ``init_optim_state`` (optimizer/utils.py:40): after
    ``optimizer.state[p]`` was read on the fresh optimizer, ``load()`` returns True and
    restores the param groups but no per-param state; P3 names the missing state, P6 the
    training that diverges from there."""
    with pytest.raises(RoundtripFailure) as info:
        check(tt.TinyDecoder, tt.batch, **ARGS, save_fn=tt.save_checkpoint,
              load_fn=tt.load_after_reading_state, world_sizes=["2"])
    [r] = info.value.results
    v = r.properties
    p3 = v["P3"].detail
    assert v["P3"].status == "fail", p3
    assert "raised" not in p3, p3  # load() returned True: no exception anywhere
    for rank in (0, 1):  # every param's state is gone, on every rank
        assert f"rank {rank} after loading differs from reference.fsdp2_shard:\n18 differences" in p3
    assert "state['tok_embeddings.weight']: missing; expected {'step': tensor(2.)" in p3
    assert v["P6"].status == "fail", v["P6"].detail
    # ... while the param groups (lr, betas, weight_decay of both groups), the step and the
    # scheduler came back: only the per-param state is lost
    assert v["P11"].status == "pass", v["P11"].detail


@pytest.mark.fsdp_known(
    "P7", reason="torchtitan's OptimizersContainer.state_dict() runs init_optim_state, a "
    "zero-grad lr=0 step, on an optimizer without state (optimizer.py state_dict, "
    "optimizer/utils.py:29-67): AdamW then holds step 1 and zero moments",
    symptom="changed the optimizer state", strict=True)  # the save, and the save after the load
def test_save_before_the_first_step_steps_the_optimizer(fsdp_roundtrip):
    """A checkpoint before any training step (``steps=0``) changes the optimizer of the
    saving process: step 1 and zero moments on every param (P7), so its next real step
    bias-corrects as step 2 (notes/repro/torchtitan_save_before_first_step.py). The load
    side passes only because torchtitan loads a ``step-0`` checkpoint model-only
    (checkpointer/dcp.py:561-562: ``model_only = step == 0``), leaving the fresh optimizer
    as empty as the one saved."""
    [r] = fsdp_roundtrip(tt.TinyDecoder, tt.batch, **ARGS, save_fn=tt.save_checkpoint,
                         load_fn=tt.load_checkpoint, world_sizes=["2"], steps=0)
    v = r.properties
    assert v["P7"].status == "known", v["P7"].detail
    for rank in (0, 1):
        assert f"rank {rank}: the save function changed the optimizer state" in v["P7"].detail
    assert ("state['tok_embeddings.weight']: unexpected; expected <absent>, got {'step': "
            "tensor(1.), 'exp_avg': tensor([[0., 0.") in v["P7"].detail, v["P7"].detail
    others = {p: v[p].status for p in ("P0", "P2", "P3", "P6", "P10", "P11")}
    assert others == dict.fromkeys(others, "pass"), others


MISSING = "Missing key in checkpoint state_dict: optimizer.state.aux_head."


@pytest.mark.fsdp_known(
    "P3,P6,P7,P10,P11", reason="a trainable param without optimizer state at the save: "
    "init_optim_state creates state for every trainable param of the fresh optimizer "
    "(optimizer/utils.py:48-51 then a step), the checkpoint has none for it, DCP raises",
    symptom=MISSING, strict=True)
def test_param_without_state_fails_the_load(fsdp_roundtrip):
    """Partial optimizer state (P10): a head that got no gradient has no AdamW state at the
    save, and ``CheckpointManager.load()`` raises on every rank
    (notes/repro/torchtitan_load_partial_state.py)."""
    [r] = fsdp_roundtrip(tt.DecoderWithIdleHead, tt.batch, **ARGS, save_fn=tt.save_checkpoint,
                         load_fn=tt.load_checkpoint, world_sizes=["2"])
    v = r.properties
    detail = v["P10"].detail
    assert "the load function raised" in detail, detail
    for rank in (0, 1):
        assert f"rank {rank}: RuntimeError: {MISSING}" in detail, detail
    assert {p: v[p].status for p in ("P3", "P6", "P7", "P10", "P11")} == dict.fromkeys(
        ("P3", "P6", "P7", "P10", "P11"), "known")
    assert (v["P0"].status, v["P2"].status) == ("pass", "pass")
