"""A user's full-state-dict checkpoint code (``fsdp2_checkpointer.py``) under the plugin,
with the defaults (the model computes its loss in float32, so it runs in float32: case ids
end in ``/fp32`` and P2/P6 use float32's tolerance; ``dtype="fp64"`` asked for explicitly
keeps float64 params and says it judges at float32's tolerance):

- through torch's distributed state-dict API it round-trips at the same size, onto another
  size and from an HSDP mesh (torch's param-group tuple -> list is a known limitation), with
  and without a bf16 ``MixedPrecisionPolicy`` in its ``shard_fn``;
- the hand-written flavour fails, and the failure names the cause: the optimizer no longer
  holds the model's parameters after ``load_state_dict(..., assign=True)``;
- the zoo sweep (``fsdp_roundtrip.zoo``) runs the hand-written save on the suite's models and
  finds its crash on a plain buffer.
"""
import pytest

from fsdp_conformance import size_id

from examples.fsdp2_checkpointer import (Decoder, data, dsd_load, dsd_save, make_optimizer,
                                         manual_load, manual_load_model,
                                         manual_load_optimizer, manual_save, shard,
                                         shard_bf16)


@pytest.mark.parametrize("sizes", ["2", "2->3", "2x2->2"], ids=size_id)
@pytest.mark.parametrize("shard_fn, judged", [
    (shard, "within rtol=0.0001, atol=1e-06"),
    # a bf16 MixedPrecisionPolicy in the user's shard_fn: the single-process run does not
    # compute in bf16, so P2/P6 judge by bfloat16's rules, and say so
    (shard_bf16, "MixedPrecisionPolicy computing in bf16"),
], ids=["fp32", "bf16-mixed-precision"])
def test_dsd_checkpointer(fsdp_roundtrip, sizes, shard_fn, judged):
    results = fsdp_roundtrip(Decoder, data, fsdp_version=2, shard_fn=shard_fn,
                             optimizer=make_optimizer, save_fn=dsd_save, load_fn=dsd_load,
                             world_sizes=[sizes])
    p2 = results[0].properties["P2"]
    assert results[0].case.id.endswith("/fp32/links2") and f".by-{shard_fn.__name__}/" \
        in results[0].case.id
    assert p2.status == "pass" and judged in p2.detail, p2


def test_fp64_asked_for_a_float32_model_is_judged_at_float32_and_says_so(fsdp_roundtrip):
    results = fsdp_roundtrip(Decoder, data, fsdp_version=2, shard_fn=shard, dtype="fp64",
                             optimizer=make_optimizer, save_fn=dsd_save, load_fn=dsd_load,
                             world_sizes=["2->3"])
    p2 = results[0].properties["P2"]
    assert results[0].case.id.endswith("/fp64/links2")
    assert p2.status == "pass" and p2.detail.endswith(
        "(the model computes its loss in torch.float32 although the case runs in "
        "torch.float64, so it is judged at fp32's tolerance)"), p2


def test_manual_checkpointer_names_the_parameter_swap(fsdp_roundtrip):
    with pytest.raises(pytest.fail.Exception) as failure:  # the fixture fails the test
        fsdp_roundtrip(Decoder, data, fsdp_version=2, shard_fn=shard,
                       optimizer=make_optimizer, save_fn=manual_save, load_fn=manual_load,
                       world_sizes=["2"])
    text = str(failure.value)
    assert "likely cause: the optimizer no longer holds the model's parameters" in text
    assert "assign=True" in text
    assert "tolerance: fp32 (rtol 0.0001, atol 1e-06), the dtype the case runs and " \
        "computes in" in text



@pytest.mark.parametrize("sizes", ["2", "2->3"], ids=size_id)
def test_manual_checkpointer_with_the_optimizer_built_after_the_model_load(fsdp_roundtrip,
                                                                           sizes):
    """The same hand-written code, as a trainer that loads the model first and builds its
    optimizer afterwards: ``load_fn=(load_model, load_optimizer)`` builds the optimizer on
    the parameters the model holds after ``load_model``, and the round trip passes."""
    results = fsdp_roundtrip(Decoder, data, fsdp_version=2, shard_fn=shard,
                             optimizer=make_optimizer, save_fn=manual_save,
                             load_fn=(manual_load_model, manual_load_optimizer),
                             world_sizes=[sizes])
    assert {p: v.status for p, v in results[0].properties.items()
            if p in ("P3", "P6", "P7", "P11")} == dict.fromkeys(("P3", "P6", "P7", "P11"),
                                                                "pass")


def test_zoo_sweep_finds_the_buffer_crash_of_the_manual_save(fsdp_roundtrip):
    """The same save/load on the suite's zoo models: the hand-written save calls
    ``full_tensor()`` on every state-dict entry, and a plain buffer is no DTensor."""
    with pytest.raises(pytest.fail.Exception) as failure:
        fsdp_roundtrip.zoo(save_fn=manual_save, load_fn=manual_load,
                           models=("mlp", "buffers"), world_sizes=["2"])
    text = str(failure.value)
    buffers = text[text.index("case fsdp2.custom:manual_save/adamw/buffers.nested"):]
    assert "the save function raised" in buffers
    assert "AttributeError: 'Tensor' object has no attribute 'full_tensor'" in buffers
    assert "in manual_save" in buffers
