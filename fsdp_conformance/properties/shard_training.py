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
from .exact_load import load_exactly
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


@dataclass(frozen=True)
class _Cut:
    """What one optimizer key is on one rank: its local tensor's shape, and the pieces of
    params in it ``(fqn, start in param, end in param, start in the local tensor)``."""

    shape: tuple[int, ...]
    pieces: tuple[tuple[str, int, int, int], ...]
    flat: bool
    """A unit's flat parameter (it gets a gradient on every rank, padding only or not)."""


def _cut_of(layout, key: str, rank: int) -> _Cut:
    """Rank ``rank``'s tensor of optimizer key ``key`` (module rules): a flat parameter's
    padded shard, an original param's 1-D piece (empty where the rank holds none of it), or
    an original param FSDP1 does not shard (NO_SHARD, world size 1) in its own shape."""
    unit = layout.unit_by_key(key)
    sr = layout.shard_rank(rank)
    if unit is not None:
        return _Cut((unit.shard_numel,), tuple(tuple(pc) for pc in unit.param_pieces(sr)), True)
    unit, slot = layout.find(key)
    if unit is None or not unit.sharded:
        return _Cut(tuple(slot.shape), ((slot.fqn, 0, slot.numel, 0),), False)
    pc = next((pc for pc in unit.param_pieces(sr) if pc.fqn == slot.fqn), None)
    if pc is None:
        return _Cut((0,), (), False)
    return _Cut((pc.numel,), ((slot.fqn, pc.start_in_param, pc.end_in_param, 0),), False)


class _Ranks:
    """One optimizer per stepped rank of ``layout``, over its 1-D shards of the params."""

    def __init__(self, case: Case, layout, params: dict):
        self.layout = layout
        self.keys = layout.optimizer_keys()
        self.dtype = case.torch_dtype
        sharded = any(u.sharded for u in layout.units)
        self.stepped = range(layout.shard_world_size if sharded else 1)
        self.cuts = [[_cut_of(layout, k, r) for k in self.keys] for r in self.stepped]
        self.locals: list[list[torch.nn.Parameter]] = []
        self.optims: list[torch.optim.Optimizer] = []
        for cuts in self.cuts:
            tensors = [torch.nn.Parameter(self._cut(params, cut)) for cut in cuts]
            self.locals.append(tensors)
            self.optims.append(build_optimizer(case.optimizer, list(zip(self.keys, tensors)),
                                               case.groups, impl=case.impl))

    def _cut(self, whole: dict, cut: _Cut) -> torch.Tensor:
        """``cut``'s local tensor of ``whole`` (by FQN; zeros where it has no piece)."""
        out = torch.zeros(cut.shape, dtype=self.dtype)
        flat = out.view(-1)
        for fqn, s, e, o in cut.pieces:
            flat[o:o + e - s] = whole[fqn].detach().reshape(-1)[s:e]
        return out

    @torch.no_grad()
    def step(self, params: dict, grads: dict) -> None:
        """Every stepped rank steps its shards on ``grads``; ``params`` (whole, by FQN) get
        the updated elements."""
        for cuts, tensors, optim in zip(self.cuts, self.locals, self.optims):
            optim.zero_grad(set_to_none=True)
            for cut, t in zip(cuts, tensors):
                if not cut.flat and not any(grads.get(f) is not None for f, *_ in cut.pieces):
                    continue  # an original param with no element here or no gradient:
                    # FSDP1 leaves its grad None (a flat shard gets the reduce-scatter's
                    # output, padding only or not)
                t.grad = self._cut({f: grads[f] if grads.get(f) is not None
                                    else torch.zeros_like(params[f]) for f, *_ in cut.pieces},
                                   cut)
            optim.step()
        for cuts, tensors in zip(self.cuts, self.locals):
            for cut, t in zip(cuts, tensors):
                for fqn, s, e, o in cut.pieces:
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
            load_exactly(optim, to_ids(shard_full(self.layout, full, r), self.keys, rank=r))


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
