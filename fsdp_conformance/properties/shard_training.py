"""What FSDP1 makes of an optimizer that is not elementwise: each rank steps its own 1-D
shards. The single-process baseline of P2 and P6 under the known entry that models it
(``Effect.trains_on_shards``, entry ``fsdp1-optimizer-steps-flat-shards``).

Rule: FSDP1 hands a rank's optimizer its local shard of each unit's flat parameter
(``use_orig_params=False``: one 1-D tensor of ``shard_numel`` elements, right-padded with
zeros; the whole flat parameter where FSDP1 does not shard, world size 1 included) or its 1-D
piece of each original parameter (``True``; a param with no element on the rank gets no
gradient and is not stepped; unsharded, each param in its own shape). Each step, the gradient FSDP's reduce-scatter
averages (the single-process gradient of the global batch, up to rounding) is cut into
those shards by the reference layout (reference/layout.py ``param_pieces``), one optimizer
per rank steps its shards, and the updated elements are what the ranks hold. An optimizer
whose update of an element reads more than that element's param, gradient and state
(Adafactor: second moments factored over a 2-D param's rows and columns, an update scaled
by the RMS of the whole tensor it steps) trains otherwise than on the whole params; an
elementwise one trains alike (``zoo.optimizers.ELEMENTWISE``: no entry models those).

The save is the reference's gather of the ranks' local dicts (reference/gather.py: what
FSDP1's full optimizer dict is); the resumed run starts each load rank from the reference's
shard of the state a load leaves (reference/shard.py), on the load side's layout, and trains
the resumed steps the same way. Only the first replica is stepped (HYBRID_SHARD's other
replicas and NO_SHARD's other ranks hold copies of it). Not modelled (a ``ValueError``:
the model explains nothing): two param groups (the zoo names FSDP1's flat params by their
unit), an LR scheduler, mixed precision, a model that freezes params at the save.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..cases import Case
from ..reference import gather_full, shard_full
from ..reference.keys import to_ids, to_named
from ..zoo import build_model, build_optimizer, loss_of, make_batch
from ..zoo.models import model_spec
from .layouts import reference_layout


@dataclass(frozen=True, kw_only=True)
class ShardRun:
    """The run as FSDP1's ranks step their shards (module rules); dicts are FQN-keyed full
    dicts (the reference's gather), params by FQN."""

    losses: tuple[float, ...]
    """The loss of the global batch at every step, the resumed ones included."""
    params_at_save: dict
    """The params the ranks hold together at the save point."""
    optim_at_save: dict
    """The full dict of the ranks' states at the save point."""
    params_at_end: dict | None
    """The params at the end of the resumed run (None: no resumed steps)."""
    optim_at_end: dict | None
    """The full dict at the end of the resumed run, gathered on the load side's layout."""


class _Ranks:
    """One optimizer per stepped rank of ``layout``, over its 1-D shards of the params."""

    def __init__(self, case: Case, layout, params: dict):
        self.layout = layout
        self.keys = layout.optimizer_keys()
        sharded = any(u.sharded for u in layout.units)
        self.stepped = range(layout.shard_world_size if sharded else 1)
        self.locals: list[list[torch.nn.Parameter]] = []
        self.optims: list[torch.optim.Optimizer] = []
        for r in self.stepped:
            tensors = [torch.nn.Parameter(self._cut(params, k, r, like=params)) for k in self.keys]
            self.locals.append(tensors)
            self.optims.append(build_optimizer(case.optimizer, list(zip(self.keys, tensors)),
                                               case.groups, impl=case.impl))

    def pieces(self, key: str, rank: int) -> tuple[int, list[tuple[str, int, int, int]]]:
        """``(local numel, [(fqn, start in param, end in param, start in local)])`` of the
        optimizer key ``key`` on ``rank``."""
        unit = self.layout.unit_by_key(key)
        sr = self.layout.shard_rank(rank)
        if unit is not None:  # a flat parameter: the rank's padded shard of the unit
            return unit.shard_numel, [tuple(pc) for pc in unit.param_pieces(sr)]
        unit, slot = self.layout.find(key)
        if unit is None or not unit.sharded:
            return slot.numel, [(slot.fqn, 0, slot.numel, 0)]
        for pc in unit.param_pieces(sr):
            if pc.fqn == slot.fqn:
                return pc.numel, [(slot.fqn, pc.start_in_param, pc.end_in_param, 0)]
        return 0, []

    def _cut(self, whole: dict, key: str, rank: int, like: dict) -> torch.Tensor:
        """Rank ``rank``'s tensor of optimizer key ``key`` cut from ``whole`` (by FQN): 1-D,
        but an original param FSDP1 does not shard (NO_SHARD, world size 1) keeps its shape."""
        numel, pieces = self.pieces(key, rank)
        ref = like[pieces[0][0]] if pieces else next(iter(like.values()))
        out = torch.zeros(numel, dtype=ref.dtype)
        for fqn, s, e, o in pieces:
            out[o:o + e - s] = whole[fqn].detach().reshape(-1)[s:e]
        if self.layout.unit_by_key(key) is None:
            unit, slot = self.layout.find(key)
            if unit is None or not unit.sharded:
                return out.reshape(slot.shape)
        return out

    @torch.no_grad()
    def step(self, params: dict, grads: dict) -> None:
        """Every stepped rank steps its shards on ``grads``; ``params`` (whole, by FQN) get
        the updated elements."""
        for r, tensors, optim in zip(self.stepped, self.locals, self.optims):
            optim.zero_grad(set_to_none=True)
            for k, t in zip(self.keys, tensors):
                numel, pieces = self.pieces(k, r)
                have = [fqn for fqn, *_ in pieces if grads.get(fqn) is not None]
                if self.layout.unit_by_key(k) is None and not have:
                    continue  # an original param with no element here or no gradient:
                    # FSDP1 leaves its grad None (a flat shard, padding only or not, gets
                    # the reduce-scatter's output)
                t.grad = self._cut({f: grads[f] if grads.get(f) is not None
                                    else torch.zeros_like(params[f]) for f, *_ in pieces},
                                   k, r, like=params)
            optim.step()
        for r, tensors in zip(self.stepped, self.locals):
            for k, t in zip(self.keys, tensors):
                for fqn, s, e, o in self.pieces(k, r)[1]:
                    params[fqn].view(-1)[s:e] = t.reshape(-1)[o:o + e - s]

    def full_dict(self) -> dict:
        """The reference's gather of every rank's local dict (an unstepped replica rank
        holds its first-replica peer's)."""
        named = [to_named(o.state_dict(), self.keys, rank=r)
                 for r, o in zip(self.stepped, self.optims)]
        per_rank = [named[self.layout.shard_rank(r) if len(named) > 1 else 0]
                    for r in range(self.layout.world_size)]
        return gather_full(self.layout, per_rank)

    def load(self, full: dict) -> None:
        """Every stepped rank's optimizer holds the reference's shard of ``full``, each
        state tensor exactly as the shard holds it (the baseline is the correct run)."""
        for r, optim in zip(self.stepped, self.optims):
            local = to_ids(shard_full(self.layout, full, r), self.keys, rank=r)
            optim.load_state_dict(local)
            params = [p for g in optim.param_groups for p in g["params"]]
            for pid, st in local["state"].items():
                for name, v in st.items():
                    if isinstance(v, torch.Tensor):
                        optim.state[params[pid]][name] = v.clone()


def _check_modelled(case: Case) -> None:
    problems = []
    if case.family != "fsdp1":
        problems.append(f"family {case.family!r} (FSDP1 only)")
    if case.groups != 1:
        problems.append(f"{case.groups} param groups")
    if case.scheduler:
        problems.append(f"LR scheduler {case.scheduler!r}")
    if case.mixed_precision:
        problems.append("mixed precision")
    if model_spec(case.model).freeze_at_save:
        problems.append(f"model {case.model!r} freezes params at the save")
    if problems:
        raise ValueError("an optimizer stepping FSDP1's shards is not modelled with "
                         + ", ".join(problems))


def shard_run(case: Case, start_of: Callable[[dict], dict]) -> ShardRun:
    """Train ``case`` as FSDP1's ranks step their shards (module rules); the resumed run
    starts from ``start_of(the full dict saved)`` (the state a load leaves)."""
    _check_modelled(case)
    model = build_model(case.model, case.seed, case.torch_dtype)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    ranks = _Ranks(case, reference_layout(case), params)
    losses: list[float] = []
    saved = None
    for step in range(case.steps + case.resume_steps):
        if step == case.steps:
            saved = ({n: t.clone() for n, t in params.items()}, ranks.full_dict())
            ranks = _Ranks(case, reference_layout(case, load_side=True), params)
            ranks.load(start_of(saved[1]))
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(params[n])
        model.zero_grad(set_to_none=True)
        loss = loss_of(model, make_batch(case.model, case.seed, step, case.batch,
                                         case.torch_dtype))
        loss.backward()
        losses.append(float(loss.detach().to(torch.float64)))
        ranks.step(params, {n: p.grad for n, p in model.named_parameters()})
    if saved is None:
        return ShardRun(losses=tuple(losses), params_at_save=params,
                        optim_at_save=ranks.full_dict(), params_at_end=None, optim_at_end=None)
    return ShardRun(losses=tuple(losses), params_at_save=saved[0], optim_at_save=saved[1],
                    params_at_end=params, optim_at_end=ranks.full_dict())
