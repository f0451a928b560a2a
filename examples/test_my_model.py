"""The whole test of a user's model: save/load its optimizer state through FSDP1's APIs at
several world sizes and check every property (P1-P11) of the round trip."""
import pytest

from examples.my_model import GatedNet, batch, loss, make_optimizer


@pytest.mark.fsdp(world_sizes=[1, 2, "2->3"])
def test_checkpoint_roundtrip(fsdp_roundtrip):
    fsdp_roundtrip(GatedNet, batch, plan=["body", "head"], optimizer=make_optimizer, loss=loss,
                   fsdp_version=1)


def test_roundtrip_with_orig_params(fsdp_roundtrip):
    fsdp_roundtrip(GatedNet, batch, plan=["body", "head"], optimizer=make_optimizer, loss=loss,
                   fsdp_version=1, use_orig_params=True, world_sizes=["2->1"])
