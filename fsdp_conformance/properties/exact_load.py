"""Loading an optimizer dict into the single-process baselines exactly as it is given."""
from __future__ import annotations

import torch


def load_exactly(optim: torch.optim.Optimizer, sd: dict) -> None:
    """``optim.load_state_dict(sd)``, then every state tensor exactly as ``sd`` holds it:
    torch's load casts floating-point state to its param's dtype (pytorch#43706, entry
    ``optim-load-casts-state-to-param-dtype``), and a baseline is the correct run, so it
    keeps the dtype it was given. ``sd`` is the optimizer's own id-keyed form; its tensors
    become the optimizer's (the caller passes a copy)."""
    optim.load_state_dict(sd)
    params = [p for g in optim.param_groups for p in g["params"]]
    for pid, st in sd["state"].items():
        mine = optim.state[params[pid]]
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and mine.get(k) is not None and \
                    mine[k].dtype != v.dtype:
                mine[k] = v
