"""The classic resume bugs of user checkpoint code, named: what the ranks see right after the
user's ``load_fn`` (``after_load``, on the rank) and what the controller reads from the
records (``likely_causes``), each cause in its own words.

Rules
- Each check looks for one cause and says it in one line that names the parameters, the
  keys or the ranks, what was expected and what was seen, and the usual fix:
    the optimizer no longer holds the model's parameters (``load_state_dict(...,
        assign=True)``, a model rebuilt inside the load): the resumed run would never
        update them;
    the param groups' hyperparameters are the fresh optimizer's, not the saved ones (the
        load did not restore ``param_groups``);
    the step counter or the LR scheduler not restored (still a fresh one's);
    optimizer state on another device than its parameter, or in another dtype than saved;
    params that had optimizer state at the save have none, or a fresh all-zero one (torch's
        ``strict=False`` loads initialise what they skip), after the load;
    the load added or removed parameters (a buffer wrapped in ``nn.Parameter``, a module
        replaced): the state lands on other parameters; it is the cause then, not a skip;
    a second LR scheduler built by the load on an optimizer that had one, where training
        after the load raised (construction order: ``scheduler_after_load``);
    tied weights untied by the load (``assign=True``): each name its own Parameter; a load
        that raises carries it as a note on its exception (``note_on_raise``);
    the saved state of params frozen when the checkpoint loads, dropped by the load (DSD
        keeps state only for params that require grad).
- A cause is a diagnosis, never a verdict: the properties fail on what they compare (P3, P6,
  P11), and a failing verdict of the custom path carries the causes found
  (``with_causes``), so the user reads the cause before the diff.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ..properties.verdict import Verdict

HYPERPARAMS_SKIPPED = ("params", "initial_lr")


def model_names(model) -> dict[str, list]:
    """The model's parameter and buffer names, and the names that share one parameter (tied
    weights, ``"tied"``): what a load may change (``after_load``)."""
    shared: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(p), []).append(n)
    return {"params": sorted(n for n, _ in model.named_parameters()),
            "buffers": sorted(n for n, _ in model.named_buffers()),
            "tied": sorted(names for names in shared.values() if len(names) > 1)}


def untied(model, before: dict | None) -> list[list[str]]:
    """The groups of names that shared one parameter before the load (``model_names``) and
    no longer do in ``model``."""
    if not before or not before.get("tied"):
        return []
    now = dict(model.named_parameters(remove_duplicate=False))
    return [names for names in before["tied"]
            if len({id(now[n]) for n in names if n in now}) > 1]


def untied_cause(groups: list[list[str]]) -> str:
    """The cause of a load that untied tied weights (``untied``)."""
    return (f"the load untied weights that were one parameter at the save: {groups[0]}"
            f"{f' (and {len(groups) - 1} more group(s))' if len(groups) > 1 else ''} are "
            f"separate nn.Parameters after it. A load with assign=True (set_model_state_dict "
            f"into a model built on the meta device assigns; torch 2.13 "
            f"distributed/checkpoint/state_dict.py:600-602) gives every key of the state dict "
            f"its own Parameter, so the optimizer built on the model holds both, while the "
            f"checkpoint (and fully_shard, which manages the tied weight once) has one. Tie "
            f"them again after loading the model, before building the optimizer (e.g. "
            f"model.{groups[0][1]} = model.{groups[0][0]})")


def after_load(model, optimizer, before: dict | None = None) -> dict:
    """On a rank, right after the user's load: ``{"unheld": [fqn...], "stray": n,
    "off_device": ["fqn.key: cpu, param on meta", ...], "added": [...], "removed": [...],
    "from_buffers": [...], "to_buffers": [...]}``: trainable params of the model the
    optimizer does not hold, how many of the optimizer's params are not the model's, state
    tensors not on their param's device, and, against ``before`` (``model_names`` of the
    fresh model before the load), the parameters the load added or removed and which of them
    were buffers before or are buffers after."""
    import torch

    mine = {id(p): n for n, p in model.named_parameters()}
    held = [p for g in optimizer.param_groups for p in g["params"]]
    held_ids = {id(p) for p in held}
    unheld = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in held_ids]
    stray = sum(1 for p in held if id(p) not in mine)
    off = []
    for p in held:
        for k, v in optimizer.state.get(p, {}).items():
            if isinstance(v, torch.Tensor) and v.dim() and v.device != p.device:
                off.append(f"{mine.get(id(p), '<not the model s>')}.{k}: on {v.device}, "
                           f"its param on {p.device}")
    out = {"unheld": unheld, "stray": stray, "off_device": off,
           "frozen": [n for n, p in model.named_parameters() if not p.requires_grad],
           "scheduler_replaced": (before or {}).get("scheduler_replaced", ""),
           "untied": untied(model, before)}
    if before is not None:
        now = model_names(model)
        added = sorted(set(now["params"]) - set(before["params"]))
        removed = sorted(set(before["params"]) - set(now["params"]))
        out.update(added=added, removed=removed,
                   from_buffers=[n for n in added if n in before["buffers"]],
                   to_buffers=[n for n in removed if n in now["buffers"]])
    return out


def stateless_at_save(save_obs: Sequence, raised: str) -> list[str]:
    """A load that raised (``raised``: its ranks' errors as text): the cause the save
    records show, if the error names one of them: trainable params the optimizer held with
    no state on any rank at the save (they never got a gradient), so the checkpoint has no
    state for them (a strict ``set_optimizer_state_dict`` rejects it: the suite's known
    limitation dsd-strict-param-without-grad on the built-in paths)."""
    keys = {k for o in save_obs for k in (o.keys or [])}
    held = {k for o in save_obs if isinstance(o.local, dict)
            for k in (o.local.get("state") or {})}
    none = sorted(keys - held)
    if not none or not held or not any(f"'{k}'" in raised for k in none):
        return []  # no state at all (a stateless optimizer, no step yet), or not this error
    return [f"{len(none)} param(s) the optimizer holds had no optimizer state at the save on "
            f"any rank (never given a gradient: {none[:4]}), so the checkpoint has none for "
            f"them; set_optimizer_state_dict with the default strict=True rejects such a "
            f"checkpoint ('Missing optimizer state for parameter', torch 2.13 "
            f"distributed/checkpoint/state_dict.py:1032-1040; the suite's known limitation "
            f"dsd-strict-param-without-grad). Leave such params out of the optimizer, or load "
            f"with StateDictOptions(strict=False) and check what it initialises for them"]


def rng_note(save_obs: Sequence, load_obs: Sequence) -> str:
    """Information (never a failure), where the save recorded them (``SaveRecord.rng``):
    which of each rank's random-number generators (torch, Python ``random``, numpy) the
    user's load left as they were at the save; "" where nothing was recorded."""
    saved = {o.rank: o.rng for o in save_obs if getattr(o, "rng", None)}
    if not saved:
        return ""
    kept: dict[str, list[int]] = {}
    lost: dict[str, list[int]] = {}
    extra = []
    for o in load_obs:
        if o.rank not in saved:
            extra.append(o.rank)
            continue
        for gen, d in sorted((o.rng_loaded or {}).items()):
            (kept if saved[o.rank].get(gen) == d else lost).setdefault(gen, []).append(o.rank)
    parts = [f"{gen} restored on rank(s) {ranks}" for gen, ranks in kept.items()]
    parts += [f"{gen} not restored on rank(s) {ranks}" for gen, ranks in lost.items()]
    if extra:
        parts.append(f"rank(s) {extra} had no rank of their own at the save (more ranks than "
                     f"saved): nothing to restore")
    tail = (": where the model or the data loader draws random numbers (dropout, shuffling), "
            "a resumed run whose states are not restored differs from an uninterrupted one"
            if lost or extra else "")
    return "(information: random-number states as at the save: " + "; ".join(parts) + tail + ")"


def note_on_raise(exc: BaseException, model, before: dict | None) -> None:
    """A load that raised, on a rank: the cause found in the model it left (tied weights
    untied), added to the exception as a note, which the failure shows with its
    traceback."""
    groups = untied(model, before)
    if groups and hasattr(exc, "add_note"):
        exc.add_note("likely cause: " + untied_cause(groups))


def _groups(d: dict | None) -> list[dict]:
    if not d:
        return []
    return [{k: v for k, v in g.items() if k not in HYPERPARAMS_SKIPPED}
            for g in d.get("param_groups", [])]


def unrestored_weights(save_obs: Sequence, load_obs: Sequence, exp=None) -> list[str]:
    """Where the user's load restores the weights (``LoadRecord.params_loaded``): the params
    whose value on rank 0 right after it is not the saved one (as a modelled bug's load
    leaves it: ``exp.weights``), bitwise (none where the suite restored them, an
    optimizer-only load)."""
    import torch

    got = next((o.params_loaded for o in load_obs if o.params_loaded is not None), None)
    if got is None:  # the suite restored the weights (an optimizer-only load)
        return []
    want = next((o.params for o in save_obs if o.params is not None), None)
    if want is None:
        return []
    if exp is not None:
        want = exp.weights(want)
    return [k for k in want if k not in got or not torch.equal(want[k], got[k])]


def weights_not_restored(save_obs: Sequence, load_obs: Sequence, exp=None) -> str:
    """"" when rank 0's params right after the user's load are the saved ones bitwise
    (``unrestored_weights``, under ``exp``), else what differs ("weights not restored")."""
    bad = unrestored_weights(save_obs, load_obs, exp)
    if not bad:
        return ""
    want = next(o.params for o in save_obs if o.params is not None)
    return (f"the model weights right after the load are not the saved ones (weights not "
            f"restored): {len(bad)} of {len(want)} params differ on rank 0, e.g. {bad[:3]}")


def likely_causes(save_obs: Sequence, load_obs: Sequence, *, fresh_groups: list[dict],
                  fresh_sched: dict | None, saved_step: int | None,
                  ignored: Sequence[str] = ()) -> list[str]:
    """The named causes (module rules) found in the records of a custom round trip:
    ``save_obs`` / ``load_obs`` (``SaveRecord`` / ``LoadRecord``: ``local`` at the save,
    ``loaded`` / ``diagnosis`` after the load), a fresh optimizer's param groups and
    scheduler state (what a load that restored nothing leaves), the step saved (None: the
    user's functions do not take the training state), the model's FSDP-ignored modules."""
    causes: list[str] = []
    replaced = [o for o in load_obs if o.diagnosis and o.diagnosis.get("scheduler_replaced")]
    if replaced and all(o.losses is None for o in load_obs):  # and training after it raised
        causes.append(
            f"load_fn built another LR scheduler ({replaced[0].diagnosis['scheduler_replaced']}) "
            f"on an optimizer that already had one: the suite builds scheduler(optimizer) "
            f"before load_fn unless the case builds it after the load, and every LRScheduler "
            f"wraps optimizer.step(), so the resumed optimizer.step() ran through both. If "
            f"your trainer builds its scheduler after the load (torchtune's recipes do, from "
            f"the step), pass scheduler_after_load=True: no scheduler exists while load_fn "
            f"runs, and the suite builds scheduler(optimizer, step) after it unless load_fn "
            f"sets state.scheduler")
    split = next((o.diagnosis["untied"] for o in load_obs
                  if o.diagnosis and o.diagnosis.get("untied")), None)
    if split:
        causes.append(untied_cause(split))
    changed = {o.rank: o.diagnosis for o in load_obs
               if o.diagnosis and (o.diagnosis.get("added") or o.diagnosis.get("removed"))
               and not split}  # the untied weight is the parameter added
    if changed:
        r, d = next(iter(changed.items()))
        what = [f"added {d['added']}" + (f" ({d['from_buffers']} were buffers before it: "
                                         f"wrapped in nn.Parameter)" if d["from_buffers"]
                                         else "")] if d.get("added") else []
        what += [f"removed {d['removed']}" + (f" ({d['to_buffers']} are buffers now)"
                                              if d["to_buffers"] else "")] \
            if d.get("removed") else []
        causes.append(
            f"the load changed the model's parameters (rank(s) {sorted(changed)}; rank {r}: "
            f"{'; '.join(what)}): the checkpoint and the optimizer were made for the model "
            f"as it was built, and a state dict is matched to parameters by name or "
            f"position, so what was saved for one parameter can land on another, or on "
            f"none. Load into the model as it was built (buffers stay buffers; register no "
            f"parameter in the load)")
    bad = unrestored_weights(save_obs, load_obs)
    own = tuple(f"{m}." for m in ignored)
    if bad and own and all(b.startswith(own) for b in bad):
        causes.append(f"only params of FSDP-ignored modules {list(ignored)} differ right after "
                      f"the load (e.g. {bad[:3]}): each rank trains its own copy of them, and a "
                      f"checkpoint that keeps one copy restores that one on every rank (DCP "
                      f"writes a key every rank holds once, from one rank: "
                      f"_dedup_save_plans.py:42-55; for their optimizer state the suite's known "
                      f"limitation dcp-dedups-unsynchronised-ignored-state)")
    elif bad:
        causes.append("the load did not restore the model's weights: the suite restores "
                      "nothing on the load's behalf, so a load of the training state (or a "
                      "model load function) must load the model too")
    swapped = {o.rank: o.diagnosis for o in load_obs
               if o.diagnosis and (o.diagnosis.get("unheld") or o.diagnosis.get("stray"))}
    if swapped:
        r, d = next(iter(swapped.items()))
        causes.append(
            f"the optimizer no longer holds the model's parameters after load_fn (rank(s) "
            f"{sorted(swapped)}; rank {r}: {len(d['unheld'])} trainable param(s) not in any "
            f"param group, e.g. {d['unheld'][:3]}, and {d['stray']} optimizer param(s) that "
            f"are not the model's): the load replaced the Parameter objects "
            f"(load_state_dict(..., assign=True), or a model rebuilt inside the load), so "
            f"optimizer.step() updates the old ones and the model never trains. Load the "
            f"model without assign=True, or build the optimizer after loading the model")
    off = {o.rank: o.diagnosis["off_device"] for o in load_obs
           if o.diagnosis and o.diagnosis.get("off_device")}
    if off:
        r, items = next(iter(off.items()))
        causes.append(f"optimizer state on another device than its param after the load "
                      f"(rank(s) {sorted(off)}; rank {r}: {items[:3]}): load the state onto "
                      f"the param's device (map_location, or let set_optimizer_state_dict "
                      f"place it)")
    saved = _groups(save_obs[0].local) if save_obs else []
    fresh = _groups({"param_groups": fresh_groups})
    for o in load_obs:
        got = _groups(o.loaded)
        if got and got != saved and got == fresh:
            causes.append(f"the param groups after the load hold the fresh optimizer's "
                          f"hyperparameters, not the saved ones (rank {o.rank}: e.g. lr "
                          f"{got[0].get('lr')!r}, saved {saved[0].get('lr')!r}): the load "
                          f"did not restore param_groups")
            break
    unstepped = [o for o in load_obs if saved_step is not None
                 and o.step_loaded != saved_step and o.step_loaded == 0]
    if unstepped:
        causes.append(f"the training step counter was not restored (state.step is 0 after "
                      f"the load on {_ranks(unstepped)}, the save was at step {saved_step}): "
                      f"the resumed run restarts its schedule")
    saved_sched = next((s.sched for s in save_obs if s.sched is not None), None)
    fresh = [o for o in load_obs if fresh_sched is not None and o.sched_loaded is not None
             and o.sched_loaded == fresh_sched and saved_sched != fresh_sched]
    if fresh:
        causes.append(f"the LR scheduler was not restored ({_ranks(fresh)}: its state after "
                      f"the load is a fresh scheduler's, last_epoch "
                      f"{fresh[0].sched_loaded.get('last_epoch')!r}; saved "
                      f"{(saved_sched or {}).get('last_epoch')!r})")
    saved_st = _state_union([o.local for o in save_obs])
    loaded_st = _state_union([o.loaded for o in load_obs])
    if saved_st and loaded_st is not None:
        had = _nonzero([o.local for o in save_obs])
        lost = sorted(had - _nonzero([o.loaded for o in load_obs]))
        frozen = sorted(set(lost) & {n for o in load_obs if o.diagnosis
                                     for n in o.diagnosis.get("frozen", [])})
        if frozen and not changed:
            causes.append(
                f"{len(frozen)} param(s) frozen (requires_grad=False) when the checkpoint "
                f"loaded had optimizer state at the save and have none after the load (e.g. "
                f"{frozen[:4]}): set_optimizer_state_dict keeps the saved state only of params "
                f"that require grad (torch 2.13 distributed/checkpoint/state_dict.py:1032-1034, in "
                f"_split_optim_state_dict), so unfreezing them later resumes them from a fresh "
                f"state. Load before freezing, or keep their state yourself")
            lost = [k for k in lost if k not in frozen]
        if lost and not changed:  # a changed model explains the loss (the cause above)
            causes.append(f"{len(lost)} of {len(saved_st)} param(s) had optimizer state at the "
                          f"save and have none, or a fresh all-zero one, after the load on "
                          f"every rank (e.g. {lost[:4]}): the load skipped what it did not "
                          f"match (strict=False, or keys renamed between the save and the "
                          f"load)")
        cast = [f"{k}.{n}: {loaded_st[k][n]}, saved {dt}" for k, names in saved_st.items()
                if k in loaded_st for n, dt in names.items()
                if n in loaded_st[k] and loaded_st[k][n] != dt]
        if cast:
            causes.append(f"optimizer state loaded in another dtype than saved (e.g. "
                          f"{cast[:3]})")
    return causes


def _ranks(records) -> str:
    """``rank 0`` / ``ranks [0, 1]``."""
    rs = sorted(o.rank for o in records)
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {rs}"


def _state_union(dicts) -> dict[str, dict[str, str]] | None:
    """``{param key: {state name: dtype}}`` over the ranks' optimizer dicts that hold a
    non-empty state (None: no rank recorded a dict)."""
    out: dict[str, dict[str, str]] = {}
    seen = False
    for d in dicts:
        if not isinstance(d, dict) or not isinstance(d.get("state"), dict):
            continue
        seen = True
        for k, st in d["state"].items():
            if st:
                out.setdefault(k, {}).update({n: str(getattr(v, "dtype", type(v).__name__))
                                              for n, v in st.items()})
    return out if seen else None


def _nonzero(dicts) -> set[str]:
    """The param keys whose state (``step`` aside) has a non-zero element on some rank."""
    out: set[str] = set()
    for d in dicts:
        if not isinstance(d, dict) or not isinstance(d.get("state"), dict):
            continue
        for k, st in d["state"].items():
            if any(n != "step" and hasattr(v, "any") and v.numel() and bool(v.any())
                   for n, v in st.items()):
                out.add(k)
    return out


def with_causes(verdicts: dict[str, Verdict], causes: list[str],
                props: Sequence[str] = ("P0", "P3", "P6", "P11")) -> dict[str, Verdict]:
    """``verdicts`` with the likely causes written first in each failing one of ``props``."""
    if not causes:
        return verdicts
    head = "\n".join(f"likely cause: {c}" for c in causes)
    return {p: replace(v, detail=f"{head}\n{v.detail}")
            if p in props and v.status == "fail" else v for p, v in verdicts.items()}
