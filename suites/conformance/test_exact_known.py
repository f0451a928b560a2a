"""A known torch limitation explains exactly its own effect and nothing more (issue 15).

Each test plants a second, different bug into a configuration a known entry covers and
checks that the verdict is "fail" (naming the entry that explained the rest), not "known",
and that ``compare`` of the clean run against the planted one reports a regression. The
live tests run real FSDP on the rank pool and damage the saved file between the save and the
load; the model tests take an observation this suite recorded for the entry
(``known_observations.json``, from the quick tier on torch 2.13) and add a second failure to
it."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from fsdp_conformance.cases import Case
from fsdp_conformance.known.apply import apply_known, rejudge
from fsdp_conformance.known.entries import KNOWN, known_all
from fsdp_conformance.known.model import Effect, Outcome, Raises
from fsdp_conformance.properties.expectation import EXACT, Expectation
from fsdp_conformance.properties.roundtrip import round_trip_verdicts
from fsdp_conformance.properties.verdict import na
from fsdp_conformance.report.diff_runs import compare_runs
from fsdp_conformance.report.run_report import build_report
from fsdp_conformance.report.result import CaseResult
from fsdp_conformance import api_paths
from fsdp_conformance.api_paths import api_path

OBSERVED = json.loads((Path(__file__).parent / "known_observations.json").read_text())


# -- live: real FSDP, a second bug planted in the saved file -------------------------------

def _live(rank_pool, case: Case, tmp_path, mutate=None):
    """Save on real ranks, optionally damage the saved full file (``mutate``), load;
    ``(load records, judged)``, where ``judged()`` judges the case from the records as they
    are then, the known limitations applied as the run applies them (judged again under
    each Effect model). A test may edit a load record between two calls."""
    path = api_path(case.api)
    save = rank_pool(case.world_size).run(path.save_side, case, str(tmp_path), seed=case.seed)
    if mutate is not None:
        f = tmp_path / (api_paths.FULL_FILE if case.family == "fsdp2" else api_paths.FULL_FILE)
        sd = torch.load(f, weights_only=True)
        mutate(sd)
        torch.save(sd, f)
    load = rank_pool(case.dst_world_size).run(path.load_side, case, str(tmp_path),
                                              seed=case.seed)

    def judge(exp=EXACT):
        return round_trip_verdicts(case, save, load, tmp_path, exp=exp)

    def judged():
        verdicts = judge()
        return apply_known(case, verdicts, rejudge(case, verdicts, judge))

    return load, judged


def _judged(rank_pool, case: Case, tmp_path, mutate=None) -> dict:
    """Save, optionally damage the saved full file, load; the verdicts (``_live``)."""
    return _live(rank_pool, case, tmp_path, mutate)[1]()


def _report(case: Case, verdicts: dict) -> dict:
    full = {p: verdicts.get(p, na("not decided here")) for p in (f"P{i}" for i in range(16))}
    return build_report([CaseResult(case, full, {}, {})], tier="quick", backend="gloo",
                        seed=0, world_sizes=[1, 2, 3, 4], wall_time_s=1.0, argv=[])


def _first_param(sd: dict):
    return sorted(sd["state"], key=str)[0]


def _nudge_exp_avg_sq(sd):
    sd["state"][_first_param(sd)]["exp_avg_sq"].view(-1)[0] *= 1.5


def _zero_acc_delta(sd):
    sd["state"][_first_param(sd)]["acc_delta"].zero_()


def _nudge_momentum(sd):
    sd["state"][_first_param(sd)]["momentum_buffer"].view(-1)[0] += 1e-3


def _nudge_unused_exp_avg_sq(sd):
    sd["state"]["unused.weight"]["exp_avg_sq"].view(-1)[0] += 1e-3


def _double_weight_decay(sd):
    sd["param_groups"][0]["weight_decay"] *= 2


ALIASED = Case(api="fsdp1.full", optimizer="adam", use_orig_params=True, world_size=2)
LISTED = Case(api="fsdp2.full", optimizer="adamw", world_size=2)
UNUSED_ROOT = Case(api="fsdp1.full", optimizer="adam", model="unused", plan="root", world_size=2)
LATE_FROZEN = Case(api="fsdp2.full", optimizer="sgd_momentum", model="late_frozen", world_size=2,
                   load_world_size=3)


@pytest.mark.parametrize("case,mutate,prop,entry", [
    (ALIASED, _nudge_exp_avg_sq, "P3", "orig-params-full-osd-aliasing"),
    (dataclasses.replace(ALIASED, optimizer="adadelta"), _zero_acc_delta, "P3",
     "orig-params-full-osd-aliasing"),
    (LISTED, _double_weight_decay, "P11", "dsd-full-load-tuple-to-list"),
    (LATE_FROZEN, _nudge_momentum, "P3", "dsd-full-load-resets-frozen-state"),
    (UNUSED_ROOT, _nudge_unused_exp_avg_sq, "P6", "orig-params-unused-param-zero-grad-state"),
], ids=["aliasing+exp_avg_sq-nudged", "aliasing+acc_delta-zeroed", "tuple-to-list+wd-doubled",
        "frozen-state-reset+momentum-nudged", "unused-zero-grads+exp_avg_sq-nudged"])
def test_a_second_bug_on_a_known_pair_fails(rank_pool, tmp_path, case, mutate, prop, entry):
    clean = _judged(rank_pool, case, tmp_path / "clean")
    assert clean[prop].status == "known" and clean[prop].known == entry, clean[prop].detail
    assert clean[prop].digest
    planted = _judged(rank_pool, case, tmp_path / "planted", mutate)
    v = planted[prop]
    assert v.status == "fail", f"{prop} hid the planted bug: {v.status}\n{v.detail}"
    assert v.known == entry and f"known limitation {entry!r}" in v.detail
    assert "what it does not explain" in v.detail
    cmp = compare_runs(_report(case, clean), _report(case, planted))
    assert any(c.label == "newly failing" and c.item == prop for c in cmp.regressions), \
        [c for c in cmp.changes]


def test_the_modelled_effect_is_the_exact_effect(rank_pool, tmp_path):
    """The aliasing model predicts the saved dict bitwise (P1), the resumed run (P6) and
    the re-save (P7): the whole effect, not a filter over the detail."""
    v = _judged(rank_pool, ALIASED, tmp_path)
    for p in ("P1", "P2", "P6"):
        assert v[p].status == "known" and v[p].known == "orig-params-full-osd-aliasing", \
            f"{p}: {v[p].status}\n{v[p].detail}"


# -- model tests: a recorded observation, and the same with a second failure --------------

def _detailed(entry) -> bool:
    return not isinstance(entry.model, Effect)


def _planted(entry, detail: str) -> list[str]:
    """The observation with a second, different failure added."""
    wrong_value = ("\n1 difference:\n  param_groups[0]['lr']: value; expected 0.01, "
                   "got 0.0101")
    other_exc = "\nrank 1: KeyError: 'brand-new'"
    if isinstance(entry.model, Outcome):
        head, _, rest = detail.partition("\n")
        other_head = ("x in optim.pt: loaded silently on every rank: no error was raised"
                      if "loaded silently" not in head else
                      "x in optim.pt: rank(s) [0] raised but rank(s) [1] loaded silently:")
        return [head + "\n" + rest + other_exc, other_head + "\n" + rest]
    if isinstance(entry.model, Raises):
        return [detail + other_exc, detail + wrong_value]
    return [detail + wrong_value]


@pytest.mark.parametrize("key", sorted(OBSERVED))
def test_recorded_observation_is_explained_and_a_second_failure_is_not(key):
    entry = next(e for e in KNOWN if e.key == key)
    detail = OBSERVED[key]["detail"]
    assert entry.explains(detail), f"{key}: its model does not explain its own observation"
    for planted in _planted(entry, detail):
        assert not entry.explains(planted), f"{key}: the model also explains\n{planted}"


def test_every_entry_has_a_model_and_a_test():
    """No entry without a model; every entry judged by its detail has a recorded
    observation here (the ones only the differential tests reach were recorded from them,
    ``FSDPC_RECORD_KNOWN``, suites/differential/known_pairs.py)."""
    for e in KNOWN:
        assert e.model is not None
        if _detailed(e):
            assert e.key in OBSERVED, f"{e.key}: no recorded observation"


def test_known_pairs_carry_a_digest_and_compare_sees_a_changed_effect():
    """Same entry, another observed effect: ``compare`` reports "known changed"."""
    from fsdp_conformance.properties.verdict import fail

    case = Case(api="fsdp1.full", optimizer="adam", fault="shape", world_size=2)
    entry = "fsdp1-shape-error-unnamed"
    detail = OBSERVED[entry]["detail"]
    a = apply_known(case, {"P15": fail(detail)})["P15"]
    b = apply_known(case, {"P15": fail(detail.replace("torch.Size([9])", "torch.Size([8])"))})["P15"]
    assert a.status == b.status == "known" and a.known == b.known == entry
    assert a.digest and b.digest and a.digest != b.digest
    cmp = compare_runs(_report(case, {"P15": a}), _report(case, {"P15": b}))
    assert [c.label for c in cmp.regressions] == ["known changed"]
    shown = cmp.regressions[0].detail  # the two observations, not the entry's own text
    assert shown.startswith("BASE: ") and "torch.Size([9])" in shown
    assert "| NEW: " in shown and "torch.Size([8])" in shown
    same = compare_runs(_report(case, {"P15": a}), _report(case, {"P15": a}))
    assert not same.regressions


def test_observations_are_of_applicable_cases():
    """Each recorded observation comes from a case and property its entry applies to."""
    for key, rec in OBSERVED.items():
        case = Case(**rec["case"])
        assert key in [e.key for e in known_all(case, rec["prop"])], (key, case.id)


def test_the_digest_is_the_observation_as_the_model_reads_it():
    """Frames (their line numbers move with every torch release), the order the ranks
    report in and object reprs after the modelled part of a message do not change the
    digest; another modelled message, another headline or another value does."""
    from fsdp_conformance.known.model import Outcome, Raises, observation_digest

    tb = ('Traceback (most recent call last):\n  File "/x/torch/a.py", line {n}, in f\n'
          '    g()\nRuntimeError: torch function \'{op}\', with args: (ShardedTensor({r}))')
    raises = Raises(exc="RuntimeError", message=r"^torch function '(lerp_|mul_)', with args: "
                                                r"\(ShardedTensor\(")
    base = observation_digest(tb.format(n=1, op="lerp_", r="a"), raises)
    assert observation_digest(tb.format(n=99, op="lerp_", r="a, strides=None"), raises) == base
    assert observation_digest(tb.format(n=1, op="mul_", r="a"), raises) != base

    outcome = Outcome(headline=r".*: rank\(s\) \[\d\] raised but rank\(s\) \[\d\] were left .*",
                      raises=(Raises(exc="OSError", message=r"^\[Errno 22\]"),))
    head = "bad in f.pt: rank(s) [0] raised but rank(s) [1] were left waiting:\n"
    a = head + "rank 0: OSError: [Errno 22] Invalid argument\n" \
               '  File "/x/torch/c10d.py", line 3151 in broadcast'
    b = head + "rank 0: OSError: [Errno 22] Invalid argument\n" \
               '  File "/x/torch/c10d.py", line 4055 in broadcast'
    assert observation_digest(a, outcome) == observation_digest(b, outcome)
    other = a.replace("[0] raised but rank(s) [1]", "[1] raised but rank(s) [0]")
    assert observation_digest(other, outcome) != observation_digest(a, outcome)

    # interchangeable alternatives (which one shows depends on where a fault's bytes land):
    # one observation for the digest; a non-interchangeable model tells them apart; an
    # exception no alternative matches is not explained at all
    alts = (Raises(exc="UnpicklingError", message=r"^pickle stream refers to out-of-band"),
            Raises(exc="UnpicklingError", message=r"^pickle data was truncated$"))
    one = Outcome(headline=outcome.headline, raises=alts, interchangeable=True)
    apart = dataclasses.replace(one, interchangeable=False)
    c = head + "rank 0: _pickle.UnpicklingError: pickle stream refers to out-of-band data"
    d = head + "rank 0: _pickle.UnpicklingError: pickle data was truncated"
    assert one.explains(c) and one.explains(d)
    assert observation_digest(c, one) == observation_digest(d, one)
    assert observation_digest(c, apart) != observation_digest(d, apart)
    assert observation_digest(other.replace("OSError: [Errno 22] Invalid argument",
                                            "UnpicklingError: pickle data was truncated"),
                              one) != observation_digest(d, one)  # another headline
    assert not one.explains(head + "rank 0: KeyError: 'state'")

    x = "2 differences:\n  state['a']: value 1\n  state['b']: value 2"
    y = "2 differences:\n  state['b']: value 2\n  state['a']: value 1"
    assert observation_digest(x) == observation_digest(y)  # an Effect's residual-free detail
    assert observation_digest(x.replace("value 1", "value 3")) != observation_digest(x)


# -- a storage effect (P8): DCP's read-back of a saved dict ---------------------------------

def test_dcp_dropping_empty_state_is_known_by_its_effect_live(rank_pool, tmp_path):
    """A stateless SGD through fsdp2.sharded: DCP reads back the saved dict without its
    empty 'state' (dcp-drops-empty-state-dict), and nothing else differs."""
    v = _judged(rank_pool, Case(api="fsdp2.sharded", optimizer="sgd", world_size=2), tmp_path)
    assert (v["P8"].status, v["P8"].known) == ("known", "dcp-drops-empty-state-dict"), \
        v["P8"].detail


def test_a_storage_effect_explains_exactly_its_own_effect():
    """Under the model, DCP's read-back is the saved dict without its empty mappings; a
    read-back that also changed a hyperparameter fails, showing only that."""
    from fsdp_conformance.known.apply import expectation_of
    from fsdp_conformance.properties.run_props import p8_serialise

    case = Case(api="fsdp2.sharded", optimizer="sgd", world_size=2)
    [entry] = [e for e in known_all(case, "P8") if e.key == "dcp-drops-empty-state-dict"]
    groups = [{"lr": 0.01, "momentum": 0.0, "params": ["a.weight"]}]
    full = {"state": {}, "param_groups": groups}
    read = {"param_groups": groups}
    changed = {"param_groups": [{**groups[0], "lr": 0.0101}]}
    assert p8_serialise(case.api, [], [], full, read).status == "fail"
    exp = expectation_of(case, [entry])
    assert p8_serialise(case.api, [], [], full, read, exp=exp).status == "pass"
    v = p8_serialise(case.api, [], [], full, changed, exp=exp)
    assert v.status == "fail" and "1 difference:\n  param_groups[0]['lr']" in v.detail, v.detail


# -- a rekey effect (P5): torch's own rekey_optim_state_dict on a stateless dict ------------

def test_a_rekey_effect_explains_exactly_torchs_stateless_rekey():
    """torch's rekey_optim_state_dict(PARAM_ID) returns a dict without state unchanged
    (rekey-empty-state-is-a-noop): under the model P5 passes on what torch really returns;
    the same with a changed hyperparameter fails, showing only that."""
    import copy
    from types import SimpleNamespace

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import OptimStateKeyType

    from fsdp_conformance.known.apply import expectation_of
    from fsdp_conformance.properties.rekey_props import p5_rekey
    from fsdp_conformance.properties.run_props import rekey_seen
    from fsdp_conformance.reference.rekey import rekey_to_names
    from fsdp_conformance.zoo.plain import plain_model, plain_optimizer

    case = Case(api="fsdp1.rekey", optimizer="sgd", world_size=2)
    [entry] = [e for e in known_all(case, "P5") if e.key == "rekey-empty-state-is-a-noop"]
    model = plain_model(case)
    full = rekey_to_names(plain_optimizer(case, model).state_dict(), model)
    assert full["state"] == {} and isinstance(full["param_groups"][0]["params"][0], str)

    def p5(ids, exp=EXACT):
        obs = SimpleNamespace(rank=0, reread_ids=ids, reread=FSDP.rekey_optim_state_dict(
            ids, OptimStateKeyType.PARAM_NAME, model))
        return p5_rekey(case, to_plain=rekey_seen(case, full, [obs]), exp=exp)

    torchs = FSDP.rekey_optim_state_dict(copy.deepcopy(full), OptimStateKeyType.PARAM_ID, model)
    planted = copy.deepcopy(torchs)
    planted["param_groups"][0]["lr"] *= 1.01
    assert p5(torchs).status == "fail"  # the bug, as torch 2.13 has it
    exp = expectation_of(case, [entry])
    ok, bad = p5(torchs, exp), p5(planted, exp)
    assert ok.status == "pass", ok.detail
    assert bad.status == "fail" and "param_groups[0]['lr']: value" in bad.detail, bad.detail
    assert "type; expected int" not in bad.detail, bad.detail  # the modelled part is explained


# -- a load effect on the full dict (FSDP2): DSD's strict=False dummy state ----------------

def test_a_second_bug_behind_the_nonstrict_dummy_state_fails(rank_pool):
    """set_optimizer_state_dict(strict=False) gives the unused params the state of one
    zero-gradient, lr=0 step (dsd-nonstrict-dummy-state): known by that state exactly. A
    dummy state of two steps on one param is not that state: a fail naming the param."""
    import torch

    from fsdp_conformance.known.apply import explain_one
    from fsdp_conformance.properties import fsdp2_props as P
    from fsdp_conformance.properties.layouts import fsdp2_reference_layout
    from fsdp_conformance.sut import fsdp2

    case = Case(api="fsdp2", model="unused", plan="nested", optimizer="adam", world_size=2)
    prop, path = "P3:set_full_nonstrict", "set_full_nonstrict"
    obs = rank_pool(2).run(fsdp2.observe, case, True, False, seed=case.seed, timeout=60)
    layout, full = fsdp2_reference_layout(case), obs[0]["full"]

    def judge(exp=EXACT):
        from fsdp_conformance.properties.families import FSDP2
        from fsdp_conformance.properties.loaded import p3_loaded

        return p3_loaded(FSDP2, layout, P.loaded_states(full, obs, paths=(path,)), exp=exp)

    clean = explain_one(case, prop, judge(), judge)
    assert (clean.status, clean.known) == ("known", "dsd-nonstrict-dummy-state"), clean.detail
    obs[1][path]["state"]["unused.weight"]["step"] = torch.tensor(2.0)
    planted = explain_one(case, prop, judge(), judge)
    assert planted.status == "fail", planted.detail
    assert "rank 1" in planted.detail and "state['unused.weight']['step']" in planted.detail, \
        planted.detail


def test_the_aliasing_model_leaves_ignored_modules_alone():
    """The full tier found the aliasing model claiming too much: FSDP does not gather an
    ignored module's optimizer state through the reused buffer, so the ``buffers`` model's
    ``side`` params come back right (16 full-tier cases failed with the residual
    ``state['side.weight']['exp_avg']`` until the model excluded them)."""
    from fsdp_conformance.known.effects import alias_to_last_state

    st = {"exp_avg": torch.ones(2), "exp_avg_sq": torch.zeros(2), "step": torch.tensor(2.0)}
    d = {"state": {"side.weight": dict(st), "block.0.weight": dict(st)}, "param_groups": []}
    out = alias_to_last_state(d, Expectation(key="", case=Case(model="buffers")))
    assert torch.equal(out["state"]["side.weight"]["exp_avg"], torch.ones(2))
    assert torch.equal(out["state"]["block.0.weight"]["exp_avg"], torch.zeros(2))
    assert torch.equal(d["state"]["block.0.weight"]["exp_avg"], torch.ones(2))  # not mutated


def test_a_second_bug_behind_the_broken_tie_fails(rank_pool):
    """use_orig_params=False with the tied pair split across units: the run is the untied
    model's (tied-across-units-flat-untied, ``runs_as``), known by that run exactly. One
    element of out.weight's exp_avg nudged in torch's full dict is not that run: a fail
    naming the state, with the entry that explained the rest."""
    from fsdp_conformance.known.apply import explain_one
    from fsdp_conformance.properties.layouts import reference_layout
    from fsdp_conformance.properties.families import FSDP1
    from fsdp_conformance.properties.reference_props import saved_dicts
    from fsdp_conformance.properties.saved import p1_saved
    from fsdp_conformance.sut import fsdp1

    case = Case(api="fsdp1", model="tied", plan="split", optimizer="adam", world_size=2)
    obs = rank_pool(2).run(fsdp1.observe, case, seed=case.seed, timeout=60)

    def judge(exp=EXACT):
        return p1_saved(FSDP1, reference_layout(case, exp=exp), [o["local"] for o in obs],
                        saved_dicts(obs, "full_legacy"), exp=exp)

    clean = explain_one(case, "P1", judge(), judge)
    assert (clean.status, clean.known) == ("known", "tied-across-units-flat-untied"), clean.detail
    state = obs[0]["full_legacy"]["state"]
    key = next(k for k in state if "out.weight" in str(k))
    state[key]["exp_avg"].view(-1)[3] += 1e-3
    planted = explain_one(case, "P1", judge(), judge)
    assert planted.status == "fail", planted.detail
    assert "exp_avg" in planted.detail and "tied-across-units-flat-untied" in planted.detail, \
        planted.detail


def test_a_second_bug_behind_dcps_choice_of_the_ignored_state_fails(rank_pool, tmp_path):
    """fsdp2.sharded with ignored modules: DCP keeps the ignored params' state of the rank
    its planner picks (dcp-dedups-unsynchronised-ignored-state), read from the checkpoint's
    metadata and that rank's record of the save: known by that state exactly. One more
    element changed on one loading rank is not that state: P3 fails naming the rank and the
    state, with the entry that explained the rest."""
    case = Case(api="fsdp2.sharded", model="buffers", optimizer="adam", world_size=2,
                load_world_size=3, load_plan="root")
    load, judged = _live(rank_pool, case, tmp_path)
    clean = judged()
    for p in ("P3", "P7", "P8"):
        assert (clean[p].status, clean[p].known) == (
            "known", "dcp-dedups-unsynchronised-ignored-state"), f"{p}: {clean[p].detail}"
    load[2].loaded["state"]["side.weight"]["exp_avg"].view(-1)[5] += 1e-3
    planted = judged()
    v = planted["P3"]
    assert v.status == "fail", v.detail
    assert "rank 2" in v.detail and "state['side.weight']['exp_avg']" in v.detail, v.detail
    assert "dcp-dedups-unsynchronised-ignored-state" in v.detail, v.detail
    assert planted["P8"].status == "known"  # the checkpoint itself is as modelled
    assert compare_runs(_report(case, clean), _report(case, planted)).regressed


def test_a_second_bug_behind_the_flattened_empty_state_fails(rank_pool, tmp_path):
    """fsdp2.sharded, plain SGD, flatten_optimizer_state_dict: every param loads with state
    {} (dsd-flattened-load-empty-state-for-stateless, pytorch#192225), known by that effect
    exactly. A momentum buffer on one param of one loading rank is not that effect: P3 fails
    naming the rank and the param, with the entry that explained the rest."""
    import torch as _torch

    case = Case(api="fsdp2.sharded", optimizer="sgd", world_size=2, load_world_size=3,
                flatten_optimizer_state_dict=True)
    load, judged = _live(rank_pool, case, tmp_path)
    entry = "dsd-flattened-load-empty-state-for-stateless"
    clean = judged()
    for p in ("P3", "P6", "P10"):
        assert (clean[p].status, clean[p].known) == ("known", entry), f"{p}: {clean[p].detail}"
    assert load[1].loaded["state"]["head.bias"] == {}
    load[1].loaded["state"]["head.bias"] = {"momentum_buffer": _torch.zeros(1)}
    planted = judged()
    v = planted["P3"]
    assert v.status == "fail", v.detail
    assert "rank 1" in v.detail and "head.bias" in v.detail and entry in v.detail, v.detail
    assert compare_runs(_report(case, clean), _report(case, planted)).regressed


def test_a_second_bug_behind_the_dropped_initial_lr_fails(rank_pool, tmp_path):
    """fsdp2.full, scheduler built after the load, 2 -> 3: ranks 1 and 2 lose the
    checkpoint's initial_lr and the scheduler sets it to the loaded lr; rank 0 keeps it
    (dsd-load-drops-group-keys-the-optimizer-lacks, a rank-aware effect). P11 is known by
    that effect exactly. Rank 0 losing it too is not that effect: P11 fails naming rank 0
    and the entry; so does another wrong group key on a rank the effect covers."""
    case = Case(api="fsdp2.full", optimizer="sgd_momentum", groups=2, scheduler=True,
                scheduler_after_load=True, world_size=2, load_world_size=3)
    entry = "dsd-load-drops-group-keys-the-optimizer-lacks"
    for unseen in (dataclasses.replace(case, load_world_size=1),  # rank 0 alone keeps it
                   dataclasses.replace(case, steps=0)):  # lr is still initial_lr
        assert entry not in [e.key for e in known_all(unseen, "P11")]
    load, judged = _live(rank_pool, case, tmp_path)
    clean = judged()
    assert (clean["P11"].status, clean["P11"].known) == ("known", entry), clean["P11"].detail
    groups = {o.rank: o.loaded["param_groups"] for o in load}
    assert groups[0][0]["initial_lr"] != groups[0][0]["lr"]
    assert all(g["initial_lr"] == g["lr"] for r in (1, 2) for g in groups[r])
    for r, key, value in ((0, "initial_lr", groups[0][0]["lr"]), (2, "momentum", 0.5)):
        saved = dict(groups[r][0])
        groups[r][0][key] = value
        planted = judged()
        groups[r][0].clear()
        groups[r][0].update(saved)
        v = planted["P11"]
        assert v.status == "fail", v.detail
        assert f"rank {r}" in v.detail and key in v.detail and entry in v.detail, v.detail
        assert compare_runs(_report(case, clean), _report(case, planted)).regressed
    assert judged()["P11"].status == "known"


def test_ranks_of_one_copy_that_resume_at_their_own_lr_are_modelled_row_by_row(
        rank_pool, tmp_path, monkeypatch):
    """fsdp2.full, two groups, SequentialLR built after the load, 3 -> 2: rank 0 keeps the
    checkpoint's initial_lr, rank 1 does not, and the scheduler then gives each rank its own
    lr (dsd-load-drops-group-keys-the-optimizer-lacks with
    scheduler-built-after-load-resets-lr), so each rank steps its own rows of every param
    at its own lr. The baseline models that (each rank's rows from a copy trained at its
    lr, properties/baseline.py ``_stitch``) and P6 is known; one element of rank 1's rows
    of a param after resuming nudged by 1e-6 fails P6, naming the param; without the
    stitching (both ranks at rank 0's lr) P6 fails."""
    case = Case(api="fsdp2.full", optimizer="adamw", groups=2, scheduler="sequential",
                scheduler_after_load=True, world_size=3, load_world_size=2)
    load, judged = _live(rank_pool, case, tmp_path)
    v = judged()["P6"]
    assert v.status == "known", v.detail
    assert "scheduler-built-after-load-resets-lr" in v.detail, v.detail
    groups = {o.rank: o.loaded["param_groups"] for o in load}
    assert groups[0][0]["lr"] != groups[1][0]["lr"]  # the ranks resume apart
    t = load[0].final_params["head.weight"]
    rows = t.shape[0]
    t[rows - 1, 0] += 1e-6  # rank 1's rows (dim-0 chunks of 2): the last row
    v = judged()["P6"]
    t[rows - 1, 0] -= 1e-6
    assert v.status == "fail" and "head.weight" in v.detail.split("as observed:")[0], v.detail
    assert judged()["P6"].status == "known"
    from fsdp_conformance.properties import baseline

    baseline._replicas_run.cache_clear()
    monkeypatch.setattr(baseline, "_stitch", lambda *a: None)  # every row at rank 0's lr
    try:
        v = judged()["P6"]
    finally:
        baseline._replicas_run.cache_clear()
    assert v.status == "fail" and "params after resuming differ" in v.detail, v.detail


def test_a_second_bug_behind_the_state_dtype_cast_fails(rank_pool, tmp_path):
    """fsdp2.full, float32 state for bfloat16 params (sgd_momentum_fp32state), 2 -> 3: every
    load casts the state to bfloat16 (optim-load-casts-state-to-param-dtype, pytorch#43706),
    known by that effect exactly on P3/P7. A loaded value off by more than the cast's
    rounding is not that effect: P3 fails naming the rank, the param and the entry."""
    import torch as _torch

    case = Case(api="fsdp2.full", optimizer="sgd_momentum_fp32state", dtype="bf16",
                world_size=2, load_world_size=3)
    load, judged = _live(rank_pool, case, tmp_path)
    entry = "optim-load-casts-state-to-param-dtype"
    clean = judged()
    for p in ("P3", "P7"):
        assert (clean[p].status, clean[p].known) == ("known", entry), f"{p}: {clean[p].detail}"
    buf = load[1].loaded["state"]["head.weight"]["momentum_buffer"]
    assert buf.dtype == _torch.bfloat16
    buf.view(-1)[0] += 1.0
    v = judged()["P3"]
    assert v.status == "fail", v.detail
    assert "rank 1" in v.detail and "head.weight" in v.detail and entry in v.detail, v.detail


def test_the_state_dtype_entry_covers_exactly_the_zoos_float32_state_optimizers():
    """The entry names the optimizers by hand (reading the entries imports no torch): they
    are exactly ``zoo.optimizers.STATE_DTYPE_OPTIMIZERS``, and each keeps float32 state for
    bfloat16 params through its own steps."""
    import torch as _torch

    from fsdp_conformance.known.entries import KNOWN
    from fsdp_conformance.zoo import build_model, build_optimizer, make_batch, train_step
    from fsdp_conformance.zoo.optimizers import OPTIMIZERS, STATE_DTYPE_OPTIMIZERS

    entry = next(e for e in KNOWN if e.key == "optim-load-casts-state-to-param-dtype")
    covered = {o for o in [*OPTIMIZERS, *STATE_DTYPE_OPTIMIZERS]
               if entry.applies(Case(api="fsdp2.full", optimizer=o, dtype="bf16"))}
    assert covered == set(STATE_DTYPE_OPTIMIZERS)
    for name in STATE_DTYPE_OPTIMIZERS:  # float32 params: the state is their dtype already
        assert not entry.applies(Case(api="fsdp2.full", optimizer=name, dtype="fp32"))
        with pytest.raises(ValueError, match="one implementation"):
            build_optimizer(name, [("w", _torch.nn.Parameter(_torch.zeros(2)))], impl="fused")
    for name in STATE_DTYPE_OPTIMIZERS:
        model = build_model("mlp", 0, _torch.bfloat16)
        optim = build_optimizer(name, list(model.named_parameters()))
        for step in range(2):
            train_step(model, optim, make_batch("mlp", 0, step, 12, _torch.bfloat16))
        dtypes = {v.dtype for st in optim.state.values() for v in st.values()}
        assert dtypes == {_torch.float32}, (name, dtypes)
        fresh = build_optimizer(name, list(model.named_parameters()))
        fresh.load_state_dict(optim.state_dict())  # torch's own cast, the entry's mechanism
        assert {v.dtype for st in fresh.state.values() for v in st.values()} == {_torch.bfloat16}


def test_a_second_bug_behind_the_nonstrict_dummy_state_in_the_run_fails(rank_pool, tmp_path):
    """fsdp2.full loaded with strict=False (Case.nonstrict), Adam on the ``unused`` model,
    2 -> 3: the params without state in the checkpoint load with a dummy step's state
    (dsd-nonstrict-dummy-state), known by that effect exactly on P3 and its consequences.
    The same load with strict=True refuses the checkpoint instead (the option reaches
    set_optimizer_state_dict). A dummy state with step 2 is not that effect: P3 fails naming
    the rank, the param and the entry."""
    from fsdp_conformance.sut.fsdp2 import load_options as _load_options

    assert _load_options(Case(api="fsdp2.full", nonstrict=True)).strict is False
    assert _load_options(Case(api="fsdp2.full")).strict is True
    case = Case(api="fsdp2.full", optimizer="adam", model="unused", world_size=2,
                load_world_size=3, nonstrict=True)
    load, judged = _live(rank_pool, case, tmp_path)
    entry = "dsd-nonstrict-dummy-state"
    clean = judged()
    assert (clean["P3"].status, clean["P3"].known) == ("known", entry), clean["P3"].detail
    st = load[1].loaded["state"]["unused.weight"]
    assert float(st["step"]) == 1.0
    st["step"] = st["step"] + 1
    v = judged()["P3"]
    assert v.status == "fail", v.detail
    assert "rank 1" in v.detail and "unused.weight" in v.detail and entry in v.detail, v.detail


# -- FSDP1 HYBRID_SHARD + DCP: the rank-dependent rows torch loads (P3 exact) -------------

HYBRID = Case(api="fsdp1.sharded", optimizer="adamw", strategy="HYBRID_SHARD", world_size=4)


def test_the_hybrid_load_model_rebuilds_each_groups_rows_by_hand():
    """T (5 x 2, n = 10) chunked 4 ways: rows [0:2], [2:4], [4:5], no fourth chunk; the
    2-way chunk size is ceil(5/2) * 10 // 5 = 6 elements. Group {0, 1} rebuilds
    [0 1 2 3 0 0 | 4 5 6 7 0 0][:10], group {2, 3} [8 9 0 0 0 0 | 0 0 0 0 0 0][:10];
    the 0-dim step is untouched."""
    from fsdp_conformance.known.effects import hybrid_rows_chunked_globally

    t = torch.arange(10, dtype=torch.float64).reshape(5, 2)
    d = {"state": {"w": {"exp_avg": t, "step": torch.tensor(2.0)}}, "param_groups": []}
    want = {0: [0, 1, 2, 3, 0, 0, 4, 5, 6, 7], 2: [8, 9, 0, 0, 0, 0, 0, 0, 0, 0]}
    for rank, group in ((0, 0), (1, 0), (2, 2), (3, 2)):
        got = hybrid_rows_chunked_globally(
            d, Expectation(key="", case=HYBRID).on_rank(rank))["state"]["w"]
        assert got["exp_avg"].shape == (5, 2)
        assert got["exp_avg"].reshape(-1).tolist() == want[group], rank
        assert got["step"] is d["state"]["w"]["step"]
    assert torch.equal(d["state"]["w"]["exp_avg"], t)  # the argument is not changed


def test_the_hybrid_load_is_known_by_its_exact_effect_and_a_second_bug_fails(rank_pool,
                                                                            tmp_path):
    """Live, 4 ranks: P3, P6 and P7 are known by the Effect model (every rank's loaded state
    equals the modelled rows bitwise; each shard group re-saves its own T'; the resumed run
    is the two replicas trained from their own T' on the mean gradient), P4 passes (each
    rank's flat state is the flattening of its own group's re-save). A second bug on top
    fails where it lands, naming the entry and the residual: one element of rank 3's loaded
    exp_avg (P3), of its re-saved shard (P7), of its state after resuming (P6), of rank 2's
    params after resuming (P6: the second replica's params are judged too), the resumed
    run's last loss (P6)."""
    entry = "dcp-sharded-optim-load-ignores-hybrid-groups"
    load, judged = _live(rank_pool, HYBRID, tmp_path)
    v = judged()
    for p in ("P3", "P6", "P7"):
        assert (v[p].status, v[p].known) == ("known", entry), f"{p}: {v[p].detail}"
    assert v["P4"].status == "pass", v["P4"].detail
    st = load[3].loaded["state"]
    key = sorted(k for k in st if st[k]["exp_avg"].numel())[0]
    st[key]["exp_avg"].view(-1)[0] += 1e-3
    v = judged()["P3"]
    assert v.status == "fail" and v.known == entry, v.detail
    assert "what it does not explain" in v.detail and "rank 3" in v.detail
    assert "rank 0 after loading" not in v.detail.split("as observed:")[0]
    st[key]["exp_avg"].view(-1)[0] -= 1e-3

    def nudged(prop, record, where, undo=True, rank=3):
        t = next(t for t in _tensors(where(load[rank])) if t.numel() > 1)
        t.view(-1)[0] += 1e-3
        got = judged()[prop]
        if undo:
            t.view(-1)[0] -= 1e-3
        assert got.status == "fail" and got.known == entry, f"{record}: {got.detail}"
        assert "what it does not explain" in got.detail, got.detail
        return got.detail.split("as observed:")[0]

    assert "ranks [2, 3]" in nudged("P7", "re-saved shard", lambda o: o.resaved["state"])
    assert "ranks [2, 3]" in nudged("P6", "state after resuming",
                                    lambda o: o.final_local["state"])
    assert "rank 2, the replica on ranks [2, 3]" in nudged(
        "P6", "params after resuming", lambda o: o.final_params, rank=2)
    assert judged()["P6"].status == "known"
    losses = load[0].losses
    losses[-1] += 1e-6
    v = judged()["P6"]
    assert v.status == "fail" and "losses after resuming differ" in v.detail, v.detail


def _tensors(x):
    """Every tensor in a nested record, depth first, in key order."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, dict):
        for k in sorted(x, key=str):
            yield from _tensors(x[k])
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


# -- FSDP1 NO_SHARD, a tied param's gradient left on each rank (the ranks train apart) -----

TIED_APART = Case(model="tied", plan="split_out", optimizer="adam", use_orig_params=True,
                  world_size=3, strategy="NO_SHARD")


def test_the_unreduced_tied_gradient_is_known_by_its_exact_effect_and_a_second_bug_fails(
        rank_pool):
    """Live, 3 ranks: every rank's full dict is its own state, and the ranks disagree, so
    P2 fails against the single-process run; the model (each rank adds its own rows'
    gradient through ``embed`` to the mean of the rest; the baseline trains one replica per
    rank) predicts every rank's state within P2's float64 tolerance, so P2 is known. One
    element of rank 2's embed.weight exp_avg, or of rank 1's layer.0.weight exp_avg, nudged
    by 1e-6 on top fails P2, naming the entry, the rank and the residual."""
    from fsdp_conformance.known.apply import explain_one
    from fsdp_conformance.properties.baseline import local_run
    from fsdp_conformance.properties.layouts import reference_layout
    from fsdp_conformance.properties.run_props import p2_trained
    from fsdp_conformance.sut import fsdp1

    case, entry = TIED_APART, "tied-across-units-orig-grad-not-reduced"
    obs = rank_pool(case.world_size).run(fsdp1.observe, case, seed=case.seed)

    def judge(exp=EXACT):
        return p2_trained(reference_layout(case, exp=exp), [o["full_legacy"] for o in obs],
                          local_run(case, exp), case.dtype, exp=exp)
    exact = judge()
    assert exact.status == "fail" and "embed.weight" in exact.detail, exact.detail
    v = explain_one(case, "P2", exact, judge)
    assert (v.status, v.known) == ("known", entry), v.detail
    for rank, fqn in ((2, "embed.weight"), (1, "layer.0.weight")):
        t = obs[rank]["full_legacy"]["state"][fqn]["exp_avg"]
        t.view(-1)[0] += 1e-6
        v = explain_one(case, "P2", judge(), judge)
        t.view(-1)[0] -= 1e-6
        assert v.status == "fail" and v.known == entry, v.detail
        residual = v.detail.split("as observed:")[0]
        assert "what it does not explain" in residual and f"rank {rank}:" in residual \
            and fqn in residual, v.detail
        assert not any(f"rank {q}:" in residual for q in range(3) if q != rank), v.detail


# -- portable digests (issue 32): the same effect on another CPU is the same digest ---------

BASELINE = Path(__file__).resolve().parents[2] / "reports" / "baseline-quick-torch2.13.0-cpu.json"


def _last_digits_moved(text: str) -> str:
    """``text`` as another CPU prints it: the last digits of every long float changed."""
    import re

    def moved(m):
        s = m.group(0)
        mant, e, exp = s.partition("e")
        d = mant[-1]
        return mant[:-1] + ("1" if d != "1" else "2") + e + exp
    return re.sub(r"(?<![\w.])-?\d+\.\d{5,}(?:e[-+]?\d+)?", moved, text)


def _observation(detail: str) -> str:
    """The failure a known verdict's detail quotes (known/apply.py ``_known``)."""
    return detail.split("\n\n", 1)[1]


def test_known_digests_do_not_see_the_last_digits_but_see_a_second_bug():
    """Every known pair of the committed baseline: its observation with every long float's
    last digit moved has the same digest (another CPU, other kernels); the same observation
    with another key named has another (a second bug behind the entry)."""
    from fsdp_conformance.known.model import observation_digest

    report = json.loads(BASELINE.read_text())
    by_key = {e.key: e for e in KNOWN}
    seen, with_floats = 0, 0
    for c in report["cases"]:
        for prop, v in c["properties"].items():
            if v["status"] != "known":
                continue
            model = by_key[v["known"]].model
            obs = _observation(v["detail"])
            moved = _last_digits_moved(obs)
            with_floats += moved != obs
            assert observation_digest(moved, model) == observation_digest(obs, model), (c["id"], prop)
            seen += 1
    assert seen > 300 and with_floats > 100, (seen, with_floats)


def test_a_second_bug_behind_a_float_effect_still_changes_the_digest():
    from fsdp_conformance.known.model import observation_digest

    obs = ("2 differences:\n  state['layers.0.weight']['exp_avg']: element 3: expected "
           "8.022065798524636e-07, got 1.3378810793338453e-06\n  param_groups[0]['lr']: "
           "expected 0.01, got 0.02")
    base = observation_digest(obs)
    assert observation_digest(_last_digits_moved(obs)) == base
    assert observation_digest(obs.replace("element 3", "element 4")) != base
    assert observation_digest(obs.replace("'exp_avg'", "'exp_avg_sq'")) != base
    assert observation_digest(obs.replace("param_groups[0]['lr']", "param_groups[0]['eps']")) != base


def test_compare_of_a_run_on_another_cpu_reports_no_regression():
    """The committed baseline against itself as another CPU writes it: every long float's
    last digit moved in the known details (digests recomputed as the run computes them), the
    timings 3x slower and a P13 over on the other machine: no regression; the timings and
    the P13 change are named as not compared / information. A planted second bug behind a
    known entry in the same comparison is still a regression."""
    import copy

    from fsdp_conformance.known.model import observation_digest

    base = json.loads(BASELINE.read_text())
    by_key = {e.key: e for e in KNOWN}
    for c in base["cases"]:  # digests as this version computes them
        for v in c["properties"].values():
            if v["status"] == "known":
                v["digest"] = observation_digest(_observation(v["detail"]), by_key[v["known"]].model)
    base["machine_info"]["fingerprint"] = "aaaaaaaaaaaa"
    new = copy.deepcopy(base)
    new["machine_info"].update(fingerprint="bbbbbbbbbbbb", cpu_model="another CPU")
    bounded = None
    for c in new["cases"]:
        for v in c["properties"].values():
            if v["status"] == "known":
                obs = _last_digits_moved(_observation(v["detail"]))
                v["detail"] = v["detail"].split("\n\n", 1)[0] + "\n\n" + obs
                v["digest"] = observation_digest(obs, by_key[v["known"]].model)
        for m in (c.get("measurements") or {}).values():
            for k in ("time_s", "cpu_s"):
                m[k] *= 3
        if c.get("measurements") and bounded is None and c["properties"]["P13"]["status"] == "pass":
            c["properties"]["P13"] = {"status": "fail", "detail": "work (CPU) over its bound"}
            bounded = c["id"]
    cmp = compare_runs(base, new)
    assert not cmp.regressions, [(x.label, x.subject, x.item) for x in cmp.regressions][:5]
    assert any("machines differ" in n and "not compared" in n for n in cmp.notes), cmp.notes
    assert [(x.label, x.subject) for x in cmp.changes if x.item == "P13"] == [("bounds changed", bounded)]

    planted = copy.deepcopy(new)
    for c in planted["cases"]:
        v = next((v for v in c["properties"].values() if v["status"] == "known"
                  and isinstance(by_key[v["known"]].model, Effect) and "state[" in v["detail"]), None)
        if v is not None:
            obs = _observation(v["detail"]).replace("state[", "state[0][", 1)
            v["digest"] = observation_digest(obs, by_key[v["known"]].model)
            break
    assert v is not None
    assert [x.label for x in compare_runs(base, planted).regressions] == ["known changed"]


def test_one_fingerprint_two_speeds_is_two_machines_for_timings():
    """Two VMs whose CPUs report one model name ("AMD EPYC") but run Python 3x apart share a
    fingerprint: the speed probes tell them apart, so 3x slower timings there are not
    "slower"; on a machine of the same speed they are."""
    import copy

    base = json.loads(BASELINE.read_text())
    base["machine_info"]["fingerprint"] = "aaaaaaaaaaaa"
    for c in base["cases"]:
        for m in (c.get("measurements") or {}).values():
            m["probe_cpu_s"] = {"python": 0.0007, "dispatch": 0.0012}

    def slowed(probe_factor):
        new = copy.deepcopy(base)
        for c in new["cases"]:
            for m in (c.get("measurements") or {}).values():
                for k in ("time_s", "cpu_s"):
                    m[k] *= 3
                m["times_s"] = [t * 3 for t in m["times_s"]]
                m["probe_cpu_s"] = {k: v * probe_factor for k, v in m["probe_cpu_s"].items()}
        return compare_runs(base, new)

    other = slowed(3.0)
    assert not other.regressions and any("another speed" in n for n in other.notes), other.notes
    same = slowed(1.0)
    assert {c.label for c in same.regressions} == {"slower"}
