"""The named resume causes (user/diagnosis.py) on real torch objects, one process: the ones a
CPU-only FSDP run cannot plant end to end (state on another device; state loaded in another
dtype, which torch's own Optimizer.load_state_dict casts back). The others are planted in a
user's save/load on real FSDP2 ranks: suites/plugin/test_fsdp2_user_code.py and
examples/test_fsdp2_checkpointer.py."""
from types import SimpleNamespace

import torch
from torch import nn

from fsdp_conformance.properties.verdict import fail, passed
from fsdp_conformance.user.diagnosis import (after_load, likely_causes, model_names,
                                            stateless_at_save, untied, untied_cause,
                                            with_causes)


def _trained():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).pow(2).mean().backward()
    opt.step()
    return model, opt


def test_assign_true_leaves_the_optimizer_holding_the_old_parameters():
    model, opt = _trained()
    assert after_load(model, opt) == {"unheld": [], "stray": 0, "off_device": [], "frozen": [],
                                      "scheduler_replaced": "", "untied": []}
    model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
    seen = after_load(model, opt)
    assert seen["unheld"] == ["weight", "bias"] and seen["stray"] == 2
    text = likely_causes([], [SimpleNamespace(rank=0, diagnosis=seen, loaded=None, params_loaded=None,
                                              step_loaded=None, sched_loaded=None)],
                         fresh_groups=[], fresh_sched=None, saved_step=None)
    assert text and text[0].startswith("the optimizer no longer holds the model's parameters")


def test_state_on_another_device_than_its_param_is_named():
    model, opt = _trained()
    opt.state[model.weight]["exp_avg"] = torch.empty(2, 3, device="meta")
    assert after_load(model, opt)["off_device"] == ["weight.exp_avg: on meta, its param on cpu"]


def test_state_loaded_in_another_dtype_is_named_and_written_first_in_failures():
    def osd(dtype):
        return {"state": {"w": {"step": torch.tensor(2.0),
                                "exp_avg": torch.ones(2, dtype=dtype)}},
                "param_groups": [{"lr": 0.1, "params": ["w"]}]}

    save = [SimpleNamespace(rank=0, local=osd(torch.float64), sched=None)]
    load = [SimpleNamespace(rank=0, loaded=osd(torch.float32), diagnosis=None, params_loaded=None,
                            step_loaded=None, sched_loaded=None)]
    causes = likely_causes(save, load, fresh_groups=[{"lr": 0.1, "params": [0]}],
                           fresh_sched=None, saved_step=None)
    assert causes == ["optimizer state loaded in another dtype than saved (e.g. "
                      "['w.exp_avg: torch.float32, saved torch.float64'])"]
    out = with_causes({"P3": fail("differs"), "P6": passed("ok")}, causes)
    assert out["P3"].detail.startswith("likely cause: optimizer state loaded in another dtype")
    assert out["P6"].detail == "ok"


def test_a_zoo_model_is_judged_at_the_dtype_it_asks_for():
    from fsdp_conformance.cases import Case
    from fsdp_conformance.properties.precision import judged_dtype, tolerance_note

    case = Case(api="fsdp1.full")
    assert judged_dtype(case) == ("fp64", "")
    assert tolerance_note(case).startswith("tolerance: fp64 (rtol 1e-09, atol 1e-12), the dtype "
                                           "the case runs and computes in")
    assert judged_dtype(Case(api="fsdp2.full", mixed_precision="bf16", dtype="fp32")) == ("bf16", "")


def test_a_load_that_changes_the_parameters_is_named_and_not_blamed_on_a_skip():
    """A buffer wrapped in nn.Parameter by the load (issue 45): params +1, buffers -1, and
    the 'skipped what it did not match' cause is not said for it."""
    model, opt = _trained()
    model.register_buffer("scale", torch.ones(3))
    before = model_names(model)
    scale = model._buffers.pop("scale")
    model.scale = torch.nn.Parameter(scale)
    seen = after_load(model, opt, before)
    assert seen["added"] == ["scale"] and seen["from_buffers"] == ["scale"] \
        and seen["removed"] == [] and seen["unheld"] == ["scale"], seen
    text = likely_causes([], [SimpleNamespace(rank=0, diagnosis=seen, loaded=None,
                                              params_loaded=None, step_loaded=None,
                                              sched_loaded=None)],
                         fresh_groups=[], fresh_sched=None, saved_step=None)
    assert text[0].startswith("the load changed the model's parameters (rank(s) [0]; rank 0: "
                              "added ['scale'] (['scale'] were buffers before it: wrapped in "
                              "nn.Parameter))"), text


def test_tied_weights_an_assigning_load_unties_are_named():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(4, 3)
            self.out = torch.nn.Linear(3, 4, bias=False)
            self.out.weight = self.emb.weight

    model = Tied()
    before = model_names(model)
    assert before["tied"] == [["emb.weight", "out.weight"]] and before["params"] == ["emb.weight"]
    assert untied(model, before) == []
    model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
    assert untied(model, before) == [["emb.weight", "out.weight"]]
    text = untied_cause(untied(model, before))
    assert "['emb.weight', 'out.weight'] are separate nn.Parameters" in text
    assert "model.out.weight = model.emb.weight" in text


def test_params_without_state_at_the_save_are_named_only_for_an_error_naming_them():
    save = [SimpleNamespace(rank=r, keys=["a", "unused"],
                            local={"state": {"a": {"step": torch.tensor(1.0)}}})
            for r in range(2)]
    found = stateless_at_save(save, "RuntimeError: Missing optimizer state for parameter "
                                    "'unused' in checkpoint")
    assert len(found) == 1 and "(never given a gradient: ['unused'])" in found[0]
    assert stateless_at_save(save, "RuntimeError: something else") == []
    nothing = [SimpleNamespace(rank=0, keys=["a"], local={"state": {}})]  # no step yet
    assert stateless_at_save(nothing, "'a'") == []


def test_a_replaced_scheduler_is_a_cause_only_where_training_after_the_load_raised():
    seen = {"unheld": [], "stray": 0, "off_device": [], "scheduler_replaced": "LambdaLR"}

    def load(losses):
        return [SimpleNamespace(rank=0, diagnosis=seen, loaded=None, params_loaded=None,
                                step_loaded=None, sched_loaded=None, losses=losses)]

    def causes(losses):
        return likely_causes([], load(losses), fresh_groups=[], fresh_sched=None,
                             saved_step=None)

    assert causes(None) and causes(None)[0].startswith(
        "load_fn built another LR scheduler (LambdaLR) on an optimizer that already had one")
    assert causes([0.5, 0.4]) == []  # replacing it is legitimate when training works


def test_weights_of_ignored_modules_alone_get_their_own_cause():
    save = [SimpleNamespace(rank=0, params={"side.weight": torch.ones(2), "inp.weight": torch.ones(2)},
                            local=None, sched=None)]

    def load(side):
        return [SimpleNamespace(rank=0, params_loaded={"side.weight": torch.full((2,), side),
                                                       "inp.weight": torch.ones(2)},
                                diagnosis=None, loaded=None, step_loaded=None, sched_loaded=None)]

    causes = likely_causes(save, load(2.0), fresh_groups=[], fresh_sched=None, saved_step=None,
                           ignored=("side",))
    assert causes[0].startswith("only params of FSDP-ignored modules ['side'] differ right "
                                "after the load (e.g. ['side.weight'])"), causes
    other = likely_causes(save, load(2.0), fresh_groups=[], fresh_sched=None, saved_step=None)
    assert other[0].startswith("the load did not restore the model's weights"), other
    assert likely_causes(save, load(1.0), fresh_groups=[], fresh_sched=None,
                         saved_step=None, ignored=("side",)) == []
