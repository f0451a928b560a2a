"""P15's bad inputs: how the controller damages what a save side wrote (the judgement is
properties/fault_props.py).

Faults (``Case.fault``), applied by the controller to what the save side wrote:
    missing_fqn     a param that has state is removed from the state and its group
    extra_fqn       state and a group entry for ``"no_such.param"``
    shape           one state tensor loses its last element
    dtype           one state tensor is cast to float16
    mixed_keys      one state key becomes an int id while the others stay FQNs
    wrong_model     the dict of another zoo model (conv) replaces this model's; the error
                    must name a param of the conv net that this model does not have
    truncated_file  the saved file (a DCP data file for DCP paths) is cut in half
    corrupt_file    64 bytes in the middle of that file are flipped

Judgement (properties/fault_props.py): pass when every rank raised, quickly, and the error names the problem
(the param or key for dict faults; for file faults the file's name or a word that says the
file is damaged: corrupt, truncated, archive, EOF, checksum...). Fail when the load succeeded (a silent wrong load), when
some ranks raised while others were left waiting (a hang in the making), when it timed
out, or when the error does not name the offending param or key.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..cases import Case
from ..api_paths import DCP_DIR, FULL_FILE, is_full_path, rank_file
from ..api_paths import api_path
from ..zoo import build_model, build_optimizer, loss_of, make_batch

BOGUS = "no_such.param"


def _target_file(case: Case, workdir: Path) -> Path:
    if is_full_path(case.api):
        return workdir / FULL_FILE
    if api_path(case.api).writes == "dcp" and (workdir / DCP_DIR).is_dir():
        files = sorted((workdir / DCP_DIR).glob("*.distcp"))
        if files:
            return max(files, key=lambda p: p.stat().st_size)
    return workdir / rank_file(0)


def apply_fault(case: Case, workdir: Path) -> dict[str, Any]:
    """Damage what the save side wrote; return what was done (for the verdict)."""
    path = _target_file(case, workdir)
    kind = case.fault
    if kind in ("truncated_file", "corrupt_file"):
        data = bytearray(path.read_bytes())
        if kind == "truncated_file":
            data = data[: len(data) // 2]
        else:
            mid = len(data) // 2
            for i in range(mid, min(mid + 64, len(data))):
                data[i] ^= 0xFF
        path.write_bytes(bytes(data))
        return {"kind": kind, "file": path.name, "names": []}
    sd = torch.load(path, weights_only=True)
    state, groups = sd["state"], sd["param_groups"]
    victim = next(k for k, st in state.items() if any(
        isinstance(v, torch.Tensor) and v.dim() > 0 for v in st.values()))
    tensor_key = next(n for n, v in state[victim].items()
                      if isinstance(v, torch.Tensor) and v.dim() > 0)
    names = [victim]
    if kind == "missing_fqn":
        del state[victim]
        for g in groups:
            g["params"] = [p for p in g["params"] if p != victim]
    elif kind == "extra_fqn":
        state[BOGUS] = {n: (v.clone() if isinstance(v, torch.Tensor) else v)
                        for n, v in state[victim].items()}
        groups[0]["params"].append(BOGUS)
        names = [BOGUS]
    elif kind == "shape":
        state[victim][tensor_key] = state[victim][tensor_key].flatten()[:-1].clone()
    elif kind == "dtype":
        state[victim][tensor_key] = state[victim][tensor_key].to(torch.float16)
    elif kind == "mixed_keys":
        state[0] = state.pop(victim)
        for g in groups:
            g["params"] = [0 if p == victim else p for p in g["params"]]
    elif kind == "wrong_model":
        model = build_model("conv", case.seed, case.torch_dtype)
        named = list(model.named_parameters())
        opt = build_optimizer(case.optimizer, named)
        loss_of(model, make_batch("conv", case.seed, 0, 4, case.torch_dtype)).backward()
        opt.step()
        osd = opt.state_dict()
        fq = [n for n, _ in named]
        sd = {"state": {fq[k]: v for k, v in osd["state"].items()},
              "param_groups": [{**g, "params": [fq[i] for i in g["params"]]}
                               for g in osd["param_groups"]]}
        # the faulted params are the other model's own: a name both models have (the conv
        # net and the MLP both have head.weight) does not say which checkpoint this is
        own = {n for n, _ in build_model(case.model, case.seed, case.torch_dtype).named_parameters()}
        names = [n for n in fq if n not in own] or fq
    else:
        raise ValueError(f"unknown fault {kind!r}")
    torch.save(sd, path)
    return {"kind": kind, "file": path.name, "names": names, "state_key": tensor_key}
