"""Test-only rank set-up (``FSDPC_RANK_SETUP=suites.conformance.removed_api:install``): the
torch of pytorch#191712 ("Complete expired FSDP deprecations", open), in which the five legacy
FSDP1 optimizer-state functions raise ``NotImplementedError`` with migration guidance instead
of running. Used by test_removed_api.py to show the run says "removed", not "error"."""
from __future__ import annotations

LEGACY = ("full_optim_state_dict", "sharded_optim_state_dict", "shard_full_optim_state_dict",
          "flatten_sharded_optim_state_dict", "scatter_full_optim_state_dict")


def _removed(name: str):
    def stub(*args, **kwargs):
        raise NotImplementedError(
            f"FSDP.{name} has been removed. Use FSDP.optim_state_dict / "
            f"FSDP.optim_state_dict_to_load with FSDP.state_dict_type instead.")
    stub.__name__ = stub.__qualname__ = name
    stub.__code__ = stub.__code__.replace(co_name=name)
    return staticmethod(stub)


def install() -> None:
    """Replace the five functions on ``FullyShardedDataParallel`` by raising stubs named as
    they are (so the traceback's last frame is ``in <name>``, as in the PR)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    for name in LEGACY:
        setattr(FSDP, name, _removed(name))
