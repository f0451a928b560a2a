"""Known torch limitations: failures of torch (not of the suite), each with the torch
versions it was seen on, the evidence, and the upstream issue where one is known.

Rule: a (case, property) that matches an entry and fails is reported "known"; one that
matches and *passes* is reported "fixed upstream?" so the entry can be retired."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .cases import Case


@dataclass(frozen=True)
class KnownLimitation:
    key: str
    props: tuple[str, ...]  # ("P1",), ...
    applies: Callable[[Case], bool]
    torch_versions: str
    reason: str
    upstream: str = "not yet reported upstream (found by this suite)"


KNOWN: tuple[KnownLimitation, ...] = (
    KnownLimitation(
        "orig-params-full-osd-aliasing", ("P1",),
        lambda c: c.use_orig_params and c.world_size > 1
        and c.optimizer in ("adam", "adamw", "adadelta")  # two or more tensor states
        and c.strategy != "NO_SHARD"
        and not (c.strategy == "HYBRID_SHARD" and c.shard_world_size == 1),
        "2.13 (CPU)",
        "full_optim_state_dict / optim_state_dict(FULL) with use_orig_params=True on CPU: every "
        "tensor state of a unit is gathered into one reused buffer and returned as views "
        "(_optim_utils.py:1555-1558); .cpu() on a CPU tensor does not copy (:1501-1507), so "
        "exp_avg comes back holding the values of exp_avg_sq (the last state gathered). "
        "Bitwise diff in the P1 detail; GPUs are not affected because .cpu() copies there."),
    KnownLimitation(
        "orig-params-frozen-full-osd", ("P1", "P4"),
        lambda c: c.use_orig_params and c.model == "frozen" and c.world_size == 1,
        "2.13",
        "full_optim_state_dict and sharded_optim_state_dict raise for a frozen param with use_orig_params=True at world "
        "size 1 (the frozen-params class of pytorch#110540).",
        "https://github.com/pytorch/pytorch/issues/110540 (same class)"),
    KnownLimitation(
        "adagrad-eager-state-empty-piece", ("P3", "P4"),
        lambda c: c.use_orig_params and c.optimizer == "adagrad" and c.world_size > 1,
        "2.13",
        "Adagrad creates state eagerly for every param, so with use_orig_params=True a rank "
        "holding none of a param still has {'step': 0, 'sum': empty} for it; the sharded dict "
        "a load path produces has no entry there, so a reload does not equal the rank's own "
        "optim.state_dict() (Adagrad's eager-state class in DESIGN.md)."),
)


def known_for(case: Case, prop: str) -> KnownLimitation | None:
    for k in KNOWN:
        if prop in k.props and k.applies(case):
            return k
    return None
