"""Known torch limitations the scale mode meets (scale/check.py): what torch raises while it
shards a model at the world sizes users run, each with its evidence and an exact model.

Rules
- An entry's model says which parameters it concerns, read off the model's shapes alone
  (``concerns``), and what ``fully_shard`` raises for them (``raises``: a pattern whose
  ``param`` group names one of those parameters). Where an entry concerns some parameter,
  the scale check first shards the model as it is, on one rank of the save mesh: the verdict
  is "known" only when torch raises as modelled, naming one of the parameters the model
  named (by its attribute name, as torch does); it is a failure when torch raises otherwise (another message, another parameter)
  and when it does not raise at all (fixed upstream? retire the entry).
- The limitation explains exactly its own effect and nothing more: the check then shards the
  model with those parameters left to the ranks as plain tensors (``fully_shard``'s
  ``ignored_params``, what users do about it) and checks every other parameter, the plans and
  the cover on both meshes as for any model, so a second bug does not hide behind it.
- Imports nothing heavy: the entries are data.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping

Shapes = Mapping[str, tuple[int, ...]]


@dataclass(frozen=True, kw_only=True)
class ScaleLimitation:
    """One torch limitation the scale mode models (module rules)."""

    key: str
    """Stable name (reports, the known-limitations page)."""
    title: str
    """What torch does, in one line."""
    evidence: str
    """Where torch does it (file:line in the torch the entry was checked on) and what was
    seen."""
    upstream: str
    """The upstream issue or pull request, where one exists."""
    concerns: Callable[[Shapes], list[str]]
    """The parameters the limitation concerns, from the model's shapes (FQN order)."""
    raises: str
    """What ``fully_shard`` raises for them: a pattern searched in ``"<Type>: <message>"``,
    its ``param`` group the name of one of ``concerns`` in its module (torch names a
    parameter by its attribute, ``named_parameters(recurse=False)``)."""
    workaround: str
    """What the check does about it, as a user would, to go on checking the rest."""

    def judge(self, params: list[str], raised: str | None) -> tuple[str, str]:
        """``("known" | "fail", why)`` for what torch raised (None: nothing) when it sharded
        a model with ``params`` (module rules)."""
        if raised is None:
            return "fail", (f"torch sharded {params} without raising, which {self.key} says "
                            f"it cannot: fixed upstream? Retire the entry "
                            f"(fsdp_conformance/known/scale.py)")
        m = re.search(self.raises, raised)
        if m is None:
            return "fail", f"torch raised otherwise than {self.key} models: {raised}"
        if not any(p.rsplit(".", 1)[-1] == m.group("param") for p in params):
            return "fail", (f"torch raised as {self.key} models, but for {m.group('param')!r}, "
                            f"not one of the parameters it concerns {params}: {raised}")
        return "known", f"torch raised as modelled: {raised}"


SCALE_KNOWN: tuple[ScaleLimitation, ...] = (
    ScaleLimitation(
        key="fsdp2-scalar-param",
        title="fully_shard refuses a 0-dim (scalar) parameter",
        evidence=("torch/distributed/fsdp/_fully_shard/_fsdp_init.py:334-338 "
                  "(`_verify_managed_param`, called for every managed parameter at :359; "
                  "torch 2.13.0 and 2.15.0): a parameter of shape () raises ValueError "
                  "\"fully_shard doesn't support scalar parameters. Change <name> to a 1D "
                  "tensor with numel equal to 1.\" A scalar has no dim 0 to chunk. Seen here "
                  "under the fake process group at 16 ranks (suites/scale/test_scale_known.py) "
                  "on a model with a scalar beside a Linear."),
        upstream="pytorch/pytorch#130810 (the check was added by pytorch/pytorch#132934)",
        concerns=lambda shapes: [fqn for fqn, shape in shapes.items() if len(shape) == 0],
        raises=(r"ValueError: fully_shard doesn't support scalar parameters\. Change "
                r"(?P<param>\S+) to a 1D tensor"),
        workaround=("the scalar parameters are passed to fully_shard as ignored_params: each "
                    "rank keeps them whole as plain tensors, which DCP saves once"),
    ),
)
"""Every torch limitation the scale mode models."""


def applying(shapes: Shapes) -> list[tuple[ScaleLimitation, list[str]]]:
    """The entries that concern some parameter of ``shapes``, with those parameters."""
    out = []
    for entry in SCALE_KNOWN:
        params = entry.concerns(shapes)
        if params:
            out.append((entry, params))
    return out
