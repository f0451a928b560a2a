"""The whole training state as trainers checkpoint it with DCP: a ``Stateful`` app state
(model, optimizer, LR scheduler, step) passed to ``dcp.save`` / ``dcp.async_save`` /
``dcp.load`` under one key (torch's DCP recipe; torchtitan's and accelerate's checkpointers
have this shape). Rank-side only (imports torch).

Rules
- ``state_dict()`` is ``get_state_dict(model, optim)`` (model and optimizer in one call) plus
  the scheduler's ``state_dict()`` and the step; DCP calls it when it saves, and for the
  template when it loads.
- ``load_state_dict(sd)`` is ``set_state_dict`` of the model and optimizer parts, the
  scheduler's ``load_state_dict`` and the step, in that order. A checkpoint without a part
  the app state holds (no "sched" while it has a scheduler) is a KeyError naming the part.
"""
from __future__ import annotations

from typing import Any


class AppState:
    """A DCP ``Stateful`` of one rank's training state (module rules)."""

    def __init__(self, model, optim, sched=None, step: int = -1, options=None):
        """``step``: the save side's current step; a load side leaves it -1 (none restored
        yet), so a load that does not restore it is seen."""
        self.model, self.optim, self.sched, self.step = model, optim, sched, step
        self.options = options

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optim, options=self.options)
        out = {"model": model_sd, "optim": optim_sd, "step": self.step}
        if self.sched is not None:
            out["sched"] = self.sched.state_dict()
        return out

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        missing = [k for k in ("model", "optim", "step") + (("sched",) if self.sched else ())
                   if k not in sd]
        if missing:
            raise KeyError(f"the checkpoint's app state has no {missing} (has {sorted(sd)})")
        set_state_dict(self.model, self.optim, model_state_dict=sd["model"],
                       optim_state_dict=sd["optim"], options=self.options)
        if self.sched is not None:
            self.sched.load_state_dict(sd["sched"])
        self.step = int(sd["step"])
