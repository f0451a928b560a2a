"""accelerate 1.15.0 (FSDP2 on CPU, examples/accelerate_trainer.py) under the suite: its
``save_fsdp_optimizer`` / ``load_fsdp_optimizer`` with FULL and SHARDED state dicts, and
``Accelerator.save_state`` / ``load_state`` with the scheduler and step, each at the same
world size and at another. Installed by the set-up (the ``trainers`` extra)."""
import pytest

pytest.importorskip("accelerate", reason="the `trainers` extra (scripts/setup-env installs it)")

from examples import accelerate_trainer as acc  # noqa: E402

SIZES = ["2", "2->3"]


@pytest.mark.parametrize("shard", [acc.shard_full, acc.shard_sharded], ids=["full", "sharded"])
def test_save_fsdp_optimizer(fsdp_roundtrip, shard):
    fsdp_roundtrip(acc.Net, acc.batch, fsdp_version=2, shard_fn=shard,
                   optimizer=acc.make_optimizer, save_fn=acc.save_optimizer,
                   load_fn=acc.load_optimizer, world_sizes=SIZES)


def test_save_state(fsdp_roundtrip):
    fsdp_roundtrip(acc.Net, acc.batch, fsdp_version=2, shard_fn=acc.shard_sharded,
                   optimizer=acc.make_optimizer, save_fn=acc.save_state,
                   load_fn=acc.load_state, world_sizes=SIZES)
