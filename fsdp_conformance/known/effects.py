"""The effects of the known entries' ``Effect`` models (known/model.py): each maps a
correct optimizer dict (FQN-keyed full dicts, or a rank's local dict) to what this torch
produces instead, given the expectation it is applied under (properties/expectation.py: the
case, the judged rank, the case's evidence), and never mutates its argument; ``untie_tied_model`` maps a case to the
case it runs as.
"""
from __future__ import annotations

import copy
import math
from typing import Any, Callable

from ..api_paths import DCP_DIR, PATH_NAMES, api_path


def _state_map(d: dict, fn: Callable[[dict], dict | None],
               untouched: tuple[str, ...] = ()) -> dict:
    """``d`` with ``fn`` applied to each param's state dict (None drops the param), except
    the params whose name starts with one of ``untouched``, kept as they are."""
    state = {}
    for k, st in d.get("state", {}).items():
        skip = isinstance(k, str) and k.startswith(untouched)
        new = fn(dict(st)) if isinstance(st, dict) and not skip else st
        if new is not None:
            state[k] = new
    return {**d, "state": state}


def _is_tensor(v: Any) -> bool:
    return hasattr(v, "dim") and hasattr(v, "clone")


def alias_to_last_state(d: dict, exp: Any = None) -> dict:
    """Every tensor state of positive dimension *is* the one whose name sorts last (the last
    one gathered: Adam: exp_avg := exp_avg_sq; Adadelta: acc_delta := square_avg): one
    storage, as torch returns views of one buffer; the step counter (a 0-dim tensor) is
    untouched. Not for the params of the case model's ignored modules: FSDP does not
    gather their state through that buffer, and it comes back right (seen on the zoo's
    ``buffers`` model, its ``side`` module, at 1-4 ranks). Idempotent."""
    case = None if exp is None else exp.case

    def one(st: dict) -> dict:
        names = sorted(n for n, v in st.items() if _is_tensor(v) and v.dim() > 0)
        if len(names) < 2:
            return st
        last = st[names[-1]].clone()
        return {n: (last if n in names else v) for n, v in st.items()}
    return _state_map(d, one, untouched=_ignored_prefixes(case))


def _ignored_prefixes(case: Any) -> tuple[str, ...]:
    """``"<module>."`` for each ignored module of the case's model (none without a case)."""
    if case is None:
        return ()
    from ..zoo import model_spec

    return model_spec(case.model).ignored_prefixes


def unshare_when_resharded(d: dict, exp: Any) -> dict:
    """A load at more than one rank copies each state into the rank's shard, so tensors that
    shared a storage in the loaded dict no longer do; at one rank the loaded tensors are
    kept as they are (shared storage and all)."""
    case = exp.case
    if case.dst_world_size <= 1:
        return d
    return _state_map(d, lambda st: {n: copy.deepcopy(v) for n, v in st.items()})


def tuples_to_lists(d: dict, exp: Any = None) -> dict:
    """Every tuple hyperparameter of every param group becomes a list."""
    return {**d, "param_groups": [{k: (list(v) if isinstance(v, tuple) else v)
                                   for k, v in g.items()}
                                  for g in d.get("param_groups", [])]}


def initial_lr_from_scheduler_built_after(d: dict, exp: Any) -> dict:
    """Each param group's ``initial_lr`` is the group's loaded ``lr`` (what an LR scheduler
    built after the load sets with ``setdefault`` when the group has none), on the ranks
    where torch's load dropped the key: every rank on ``fsdp2.sharded`` and
    ``fsdp1.dsd_sharded`` (a DCP template without the key); on ``fsdp2.full``
    every rank but 0 (``Expectation.judged_rank``; a full dict is rank 0's). Only groups that
    have ``initial_lr`` in the correct state change."""
    case = exp.case
    if (case.api in PATH_NAMES and api_path(case.api).full_load == "broadcast"
            and exp.judged_rank == 0):
        return d
    return {**d, "param_groups": [({**g, "initial_lr": g["lr"]} if "initial_lr" in g else g)
                                  for g in d.get("param_groups", [])]}


SCHEDULE_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")
"""The param-group keys an LR scheduler's constructor writes (OneCycleLR: all four)."""


def lr_set_by_scheduler_built_after(d: dict, exp: Any) -> dict:
    """Each param group's ``lr`` (and the other ``SCHEDULE_KEYS`` a schedule writes) is what
    building the case's LR schedule on the loaded optimizer sets: the constructor takes a
    first step (``LRScheduler.__init__`` -> ``_initial_step`` -> ``step``, torch 2.13
    lr_scheduler.py:174-180, :284-296) that writes the schedule's step-0 lr into every group,
    and the scheduler's ``load_state_dict`` that follows restores the scheduler's own fields,
    not the groups' (:192-199). Computed by torch itself: the same schedule built on a
    stand-in optimizer holding the loaded groups (a group without ``initial_lr`` gets its
    ``lr``, as the constructor's ``setdefault`` does)."""
    import torch

    from ..zoo import build_scheduler

    case = exp.case
    groups = d.get("param_groups", [])
    if not groups:
        return d
    stand_in = torch.optim.SGD(
        [{**{k: v for k, v in g.items() if k != "params"},
          "params": [torch.zeros(1, requires_grad=True)]} for g in groups], lr=groups[0]["lr"])
    build_scheduler(stand_in, case.model, case.scheduler)
    return {**d, "param_groups": [{**g, **{k: s[k] for k in SCHEDULE_KEYS if k in s}}
                                  for g, s in zip(groups, stand_in.param_groups)]}


def state_cast_to_param_dtype(d: dict, exp: Any) -> dict:
    """Every floating-point state tensor but ``step`` has the params' dtype (the case's
    ``dtype``: every zoo param has it), whatever dtype it was saved in; the values are the
    saved ones cast (``Tensor.to``)."""
    case = exp.case
    dtype = case.torch_dtype

    def one(st: dict) -> dict:
        return {n: (v.to(dtype) if _is_tensor(v) and v.is_floating_point() and n != "step"
                    else v) for n, v in st.items()}
    return _state_map(d, one)


def held_once_vectors_cut_to_their_param(d: dict, exp: Any) -> dict:
    """A full dict's state held once for all params (LBFGS: under the first param) as
    FSDP1's load with original params leaves it where it shards that param: each rank gets
    ``value.flatten()[start:end + 1]`` of every positive-dim tensor by the param's element
    range (_optim_utils.py ``_shard_orig_param_state``), so gathered again a vector over
    every param is its first ``numel`` elements in the param's shape; everything else
    (0-dim tensors, numbers, history lists) is kept."""
    from ..zoo import build_model

    shapes = {n: tuple(q.shape) for n, q in build_model(exp.case.model).named_parameters()}

    def cut(fqn: str, st: dict) -> dict:
        shape = shapes.get(fqn)
        if shape is None:
            return st
        n = math.prod(shape)
        return {k: (v.flatten()[:n].reshape(shape) if _is_tensor(v) and v.dim() > 0
                    and tuple(v.shape) != shape and v.numel() >= n else v)
                for k, v in st.items()}
    return {**d, "state": {k: (cut(k, st) if isinstance(st, dict) else st)
                           for k, st in d.get("state", {}).items()}}


def state_left_as_fresh(d: dict, exp: Any = None) -> dict:
    """Every param's state is what a fresh optimizer of ``EMPTY_STATE_AT_START`` holds: an
    empty entry (nothing of the saved state was loaded); the param groups are the saved
    ones."""
    return _state_map(d, lambda st: {})


def drop_empty_states(d: dict, exp: Any = None) -> dict:
    """A param whose every positive-dim tensor state is empty (a rank holds none of it) has
    no state at all."""
    def one(st: dict) -> dict | None:
        ts = [v for v in st.values() if _is_tensor(v) and v.dim() > 0]
        return None if ts and all(v.numel() == 0 for v in ts) else st
    return _state_map(d, one)


def empty_state_for_every_param(d: dict, exp: Any = None) -> dict:
    """Every param of the dict's param groups without state gets the empty state ``{}``
    (in the groups' order, after the params that have state)."""
    state = dict(d.get("state", {}))
    for g in d.get("param_groups", []):
        for fqn in g.get("params", []):
            state.setdefault(fqn, {})
    return {**d, "state": state}


def drop_frozen_state(d: dict, exp: Any) -> dict:
    """The params of the case's model that do not require grad at the save (frozen when
    built, or trained and then frozen) have no state. Keys are FQNs (a full dict, FSDP2,
    FSDP1 with ``use_orig_params``) or, in an FSDP1 rank's local dict without it, flat
    params: one whose params are all frozen has no state (FSDP1 flattens only params of
    one ``requires_grad`` together)."""
    from ..zoo import frozen_at_save

    case = exp.case
    frozen = set(frozen_at_save(case.model))
    if case.family == "fsdp1" and not case.use_orig_params:
        from ..properties.layouts import reference_layout

        layout = reference_layout(case, load_side=True, exp=exp)
        frozen |= {u.key for u in layout.units if u.fqns and set(u.fqns) <= frozen}
    return {**d, "state": {k: v for k, v in d.get("state", {}).items() if k not in frozen}}


def frozen_state_as_fresh(d: dict, exp: Any) -> dict:
    """The params of the case's model that do not require grad at the save hold what a
    freshly built optimizer holds for them before any step: Adagrad its construction-time
    state (``step`` 0, ``sum`` filled with ``initial_accumulator_value``), the others no
    state at all. Works on full and on per-rank local dicts (a fresh state tensor is a
    constant, filled to the shape found in ``d``)."""
    import torch

    from ..properties.baseline import fresh_training
    from ..zoo import frozen_at_save

    case = exp.case
    frozen = frozen_at_save(case.model)
    model, optim, _, _ = fresh_training(case)
    fresh = {n: dict(optim.state.get(p, {})) for n, p in model.named_parameters()}
    state = {}
    for k, st in d.get("state", {}).items():
        if k not in frozen:
            state[k] = st
            continue
        if not fresh.get(k):
            continue
        new = {}
        for name, v in fresh[k].items():
            if not _is_tensor(v) or v.dim() == 0:
                new[name] = v.clone() if _is_tensor(v) else v
                continue
            flat = v.reshape(-1)
            if flat.numel() and not bool((flat == flat[0]).all()):
                raise ValueError(f"{k}.{name}: a fresh {case.optimizer} state that is not a "
                                 f"constant cannot be modelled per shard")
            like = st.get(name, v) if isinstance(st, dict) else v
            new[name] = torch.full_like(like, float(flat[0]) if flat.numel() else 0.0)
        state[k] = new
    return {**d, "state": state}


def dummy_step_state(d: dict, exp: Any) -> dict:
    """Every trainable param named in the param groups that has no state gets the state the
    case's optimizer creates in one step with zero gradients and lr=0 (what DSD's
    ``_init_optim_state`` runs), computed here on the case's model."""
    import torch

    from ..properties.baseline import fresh_training, named_osd

    case = exp.case
    model, optim, _, names = fresh_training(case)
    lrs = [g["lr"] for g in optim.param_groups]
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    for g in optim.param_groups:
        g["lr"] = 0.0
    optim.step()
    for g, lr in zip(optim.param_groups, lrs):
        g["lr"] = lr
    dummy = named_osd(optim, names)
    wanted = [n for g in d.get("param_groups", []) for n in g.get("params", [])]
    state = dict(d.get("state", {}))
    for n in wanted:
        if n not in state and n in dummy["state"]:
            state[n] = dummy["state"][n]
    return {**d, "state": state}


def drop_empty_mappings(d: dict, exp: Any = None) -> dict:
    """Every mapping without a leaf is gone (a storage layer that records leaves only: an
    empty ``'state': {}``, a param's empty state), recursively: a mapping left empty by
    that is gone too. A mapping at the top stays (the read-back dict itself)."""
    def keep(v: Any) -> Any:
        if isinstance(v, dict):
            out = {k: keep(x) for k, x in v.items()}
            return {k: x for k, x in out.items() if not (isinstance(x, dict) and not x)}
        if isinstance(v, list):
            return [keep(x) for x in v]
        return v
    return keep(d)


def stateless_rekey_is_a_noop(d: dict, exp: Any) -> dict:
    """A PARAM_ID dict without state comes back as the FQN-keyed dict it was made from:
    its param groups list the params by name (the names of the case's unwrapped zoo model,
    in ``reference.rekey_to_names``'s order); a dict with state is rekeyed correctly."""
    case = exp.case
    if d.get("state"):
        return d
    from ..reference.rekey import rekey_to_names
    from ..zoo.plain import plain_model, plain_optimizer

    model = plain_model(case)
    return rekey_to_names(d, model, optim=plain_optimizer(case, model))


def unused_params_get_zero_grads(step: int, case: Any) -> frozenset:
    """The ``unused`` model's never-used params (``unused.*``) get a zero gradient at the
    steps where they share a FlatParameter with used params: before the save when the save
    side wraps them in the root unit (plan "root"), after it when the load side does; not
    at one rank with ``use_orig_params=True`` (each param keeps its own gradient there)."""
    if case.model != "unused":
        return frozenset()
    save = step < case.steps
    plan, ws = (case.plan, case.world_size) if save else (case.dst_plan, case.dst_world_size)
    if plan == "root" and (ws > 1 or not case.use_orig_params):
        return frozenset({"unused.weight", "unused.bias"})
    return frozenset()


def untie_tied_model(case: Any) -> Any:
    """The case on its model with the ties across units broken (zoo/ties.py
    ``untied_variant``: each unit's users of a tied tensor hold a copy of their own; the
    zoo's ``tied`` becomes ``tied_untied``, out.weight a parameter of its own), from the
    save's plan, else the load's; the case itself when it has no such tie."""
    import dataclasses

    from ..zoo.ties import untied_variant

    name = untied_variant(case.model, case.plan) or untied_variant(case.model, case.dst_plan)
    return case if name is None else dataclasses.replace(case, model=name)


def _dcp_dirs(workdir) -> list:
    """The DCP checkpoints under ``workdir``: the run's own (``DCP_DIR``), else every
    directory holding a ``.metadata`` (a user's own layout: accelerate writes the model and
    the optimizer into directories of their own)."""
    own = workdir / DCP_DIR
    if (own / ".metadata").exists():
        return [own]
    return sorted({m.parent for m in workdir.rglob(".metadata")})


def _dcp_writers(workdir, prefixes: tuple[str, ...]) -> tuple[dict, dict]:
    """Which rank's file (``__<rank>_<n>.distcp``, filesystem.py:673) holds each entry of
    the ignored params in the DCP checkpoints under ``workdir`` (``_dcp_dirs``): ``(state,
    weights)``, ``{(param, state name): rank}`` for optimizer state (a key ``<any
    prefix>state.<param>.<name>``: the run's ``optim.``, a trainer's ``optimizer.`` or
    ``app.optim.``) and ``{param: rank}`` for a model's own weights (a key ending in the
    param's FQN)."""
    import re

    from torch.distributed.checkpoint import FileSystemReader

    state: dict[tuple[str, str], int] = {}
    weights: dict[str, int] = {}
    for d in _dcp_dirs(workdir):
        meta = FileSystemReader(str(d)).read_metadata()
        for idx, info in meta.storage_data.items():
            m = re.match(r"__(\d+)_", info.relative_path)
            if m is None:
                raise ValueError(f"unexpected DCP file name {info.relative_path!r}")
            rank, fqn = int(m.group(1)), idx.fqn
            for s in re.finditer(r"(?:^|\.)state\.", fqn):
                rest = fqn[s.end():]
                if rest.startswith(prefixes):
                    name, _, state_name = rest.rpartition(".")
                    state[(name, state_name)] = rank
                    break
            else:
                for p in prefixes:
                    k = fqn.find(p)
                    if k == 0 or (k > 0 and fqn[k - 1] == "."):
                        weights[fqn[k:]] = rank
                        break
    return state, weights


def ignored_state_of_dcp_writer(d: dict, exp: Any) -> dict:
    """The state of the ignored modules' params as the ranks DCP chose to write it: DCP keeps
    one copy of each key every rank writes (dedup_save_plans, _dedup_save_plans.py:42-55),
    from the rank with the least data planned so far, not rank 0, so each state tensor of
    those params may come from another rank; that rank's file (``__<rank>_<n>.distcp``,
    filesystem.py:673) is what is read back and loaded. Each state's writer is read from the
    checkpoint's metadata (``_dcp_writers``: the run's own directory, or a user's own
    checkpoint), its value from that rank's record of the save (the case's evidence,
    ``Expectation.seen``); evidence missing is not this effect (LookupError)."""
    case = exp.case
    prefixes = _ignored_prefixes(case)
    if not prefixes:
        return d
    ev = exp.seen()
    by_rank = {o.rank: o.local.get("state", {}) for o in ev.save_obs}
    writer, _ = _dcp_writers(ev.workdir, prefixes)

    def one(name: str, st: dict) -> dict:
        if not name.startswith(prefixes):
            return st
        return {n: (copy.deepcopy(by_rank[writer[(name, n)]][name][n])
                    if (name, n) in writer else v) for n, v in st.items()}
    return {**d, "state": {name: one(name, st) for name, st in d.get("state", {}).items()}}


def ignored_weights_of_dcp_writer(params: dict, exp: Any) -> dict:
    """The weights of the ignored modules as a user's DCP load restores them: each from the
    rank whose file holds it (``_dcp_writers``), that rank's value at the save
    (``SaveRecord.ignored_params``, the case's evidence); evidence missing is not this
    effect (LookupError)."""
    prefixes = _ignored_prefixes(exp.case)
    if not prefixes:
        return params
    ev = exp.seen()
    by_rank = {o.rank: o.ignored_params for o in ev.save_obs}
    _, writer = _dcp_writers(ev.workdir, prefixes)
    out = dict(params)
    for name in params:
        if name.startswith(prefixes) and name in writer:
            held = by_rank[writer[name]]
            if held is None or name not in held:
                raise LookupError(f"rank {writer[name]} recorded no value of {name} at the save")
            out[name] = held[name].clone()
    return out


def hybrid_rows_chunked_globally(d: dict, exp: Any) -> dict:
    """The full dict the judged rank's shard group rebuilds on an FSDP1 HYBRID_SHARD
    sharded load (``Expectation.judged_rank``; entry
    ``dcp-sharded-optim-load-ignores-hybrid-groups``): every state tensor T of positive
    dimension (n elements, R rows) is chunked along dim 0 over the *global* world W
    (``torch.chunk(T, W)``: rank g holds chunk g, or nothing where T has fewer chunks); the
    group's S members' chunks, in rank order, are each flattened and zero-padded to the
    S-way chunk size ``ceil(R / S) * n // R``, concatenated and cut to n: T' =
    [chunk_a | zeros | chunk_b | zeros][:n], reshaped as T. 0-dim states (``step``) are
    loaded whole and stay as they are. The reference then shards T' in the group as it
    shards T (checked bitwise on all 4 ranks: notes/repro/fsdp1_hsdp_dcp_load_chunks.py)."""
    import math

    import torch

    case = exp.case
    world, size = case.dst_world_size, case.shard_world_size
    first = exp.judged_rank // size * size
    members = range(first, first + size)

    def rebuilt(t):
        if not _is_tensor(t) or t.dim() == 0:
            return t
        rows, n = t.shape[0], t.numel()
        chunks = torch.chunk(t, world, dim=0)
        width = math.ceil(rows / size) * n // rows if rows else 0
        parts = []
        for g in members:
            piece = chunks[g].reshape(-1) if g < len(chunks) else t.new_zeros(0)
            parts.append(torch.cat([piece, piece.new_zeros(max(width - piece.numel(), 0))]))
        return torch.cat(parts)[:n].reshape(t.shape).clone()

    return _state_map(d, lambda st: {k: rebuilt(v) for k, v in st.items()})
