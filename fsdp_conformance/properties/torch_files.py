"""The round-trip view of the run's API paths (properties/view.py): torch's own dicts and
files are seen, so every property P0-P11 is decided.

Rules
- The state the save wrote is the full dict the path saved (rank 0's, or the ranks' shards
  assembled: ``run_props.to_full``); a save that raised on a rank is every property's one
  verdict (one root cause). Where each rank writes and reads a file of its own, rank r's
  load meets the ranks' shards with its own copy of what every rank holds (P3).
- P1 judges that dict against the gather of the save side's local dicts, P4 the load side's
  flattened dicts (n/a where the path never flattens), P5 the rekeyed dict (n/a where the
  path does not rekey), P8 the files (a DCP directory read back without a process group),
  P9 the path's declared flip (``SaveRecord.flip``: sut/roundtrip.py ``Flip``).
- P7: the load side's save right after the load equals the saved dict; a load that raised
  is P7's error.
- The scheduler and the step are judged where the case has a scheduler, is not a golden
  load, and the load did not raise; the step where the case checkpoints an app state.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .. import reference as ref
from ..cases import Case
from ..sut.records import error_of
from ..api_paths import APP_KEY, DCP_DIR, api_path
from . import run_props as rp
from .catalogue import NO_REKEY
from .expectation import Expectation
from .family_refs import FamilyRefs
from .flags import p9_flags
from .flatten import p4_flatten
from .idempotent import p7_idempotent
from .rekey_props import p5_rekey
from .training_state import TrainingSeen
from .verdict import Verdict, error, na
from .view import Saved, training_seen


def read_dcp(path: Path, app_state: bool = False) -> dict | None:
    """A DCP directory's optimizer state as one full dict, read without a process group
    (``app_state``: the ``optim`` part of the app state saved under ``APP_KEY``)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = path.parent / "dcp_full.pt"
    try:
        dcp_to_torch_save(str(path), str(out))
        d = torch.load(out, weights_only=False)
        return d[APP_KEY]["optim"] if app_state else d["optim"]
    except Exception:  # noqa: BLE001  (P8 reports it as an error)
        return None


def _nested(flat: dict, full: dict) -> dict:
    """A flattened dict read back from DCP (``Case.flatten_optimizer_state_dict``) in the
    nested form, its groups those of the saved dict ``full``; as it is (P8 then shows how it
    differs) when it is not the flattening of such a dict."""
    try:
        return ref.unflatten_osd(flat, [g["params"] for g in full.get("param_groups", [])])
    except ValueError:
        return flat


def _own_copies(full: dict, saved: dict) -> dict:
    """``full`` with one rank's own copy (``saved``: its neutral sharded dict) of every state
    entry the rank holds whole rather than as a shard of a global tensor (what every rank
    holds: a step, the state of an ignored module's params)."""
    state = {fqn: dict(st) for fqn, st in full.get("state", {}).items()}
    for fqn, st in saved.get("state", {}).items():
        for name, v in st.items():
            if not (isinstance(v, dict) and "global_shape" in v):
                state.setdefault(fqn, {})[name] = v
    return {**full, "state": state}


def _load_error(load_obs: Sequence) -> str | None:
    return next((e for e in map(error_of, (o.loaded for o in load_obs)) if e), None)


@dataclass(frozen=True, kw_only=True)
class TorchFiles:
    """The view of a run's API path (module rules)."""

    workdir: Path | None
    """The case's files (the DCP directory P8 reads back)."""
    precision_always: bool = False
    """See ``RoundTripView.precision_always`` (True: a user's model through the path)."""

    def undecided(self, case: Case) -> dict[str, Verdict]:
        return {} if api_path(case.api).rekeys else {"P5": na(NO_REKEY)}

    def saved(self, case: Case, refs: FamilyRefs, save_obs: Sequence) -> Saved:
        full, bad = rp.to_full(case.api, save_obs)
        if full is None or api_path(case.api).writes != "per_rank":
            return Saved(full=full, bad=bad)
        # each rank reads its own file: the entries every rank holds are its own copy
        return Saved(full=full, per_rank={o.rank: _own_copies(full, o.saved) for o in save_obs})

    def stopped(self) -> Verdict | None:
        return None  # a save that raised never reaches the judge; a load's is recorded

    def resume_raised(self) -> Verdict | None:
        return None  # recorded in the load side's records (P6 says it)

    def of_torch(self, case: Case, refs: FamilyRefs, full: dict, save_obs: Sequence,
                 load_obs: Sequence, exp: Expectation) -> dict[str, Verdict]:
        api = case.api
        v = {"P1": refs.p1(full, save_obs, api)}
        why_flat = rp.no_flatten(api)
        v["P4"] = na(why_flat) if why_flat else p4_flatten(refs.family, refs.dst,
                                                           rp.flat_ranks(load_obs))
        if api_path(api).rekeys:
            v["P5"] = p5_rekey(case, to_plain=rp.rekey_seen(case, full, load_obs), exp=exp)
        dcp_full = read_dcp(self.workdir / DCP_DIR, case.app_state) \
            if api_path(api).writes == "dcp" and self.workdir is not None else None
        if dcp_full is not None and case.flatten_optimizer_state_dict:
            dcp_full = _nested(dcp_full, full)
        v["P8"] = rp.p8_serialise(api, save_obs, load_obs, full, dcp_full, exp=exp)
        from . import fsdp2_run_props as f2

        # the path's declared flip says what P9 judges (sut/roundtrip.py Flip)
        v["P9"] = p9_flags(f2.flags_seen(full, save_obs) if save_obs[0].flip == "offloaded"
                           else rp.flags_seen(refs.layout, api, save_obs, exp=exp))
        return v

    def p7(self, case: Case, refs: FamilyRefs, full: dict, save_obs: Sequence,
           load_obs: Sequence, exp: Expectation) -> Verdict:
        load_error = _load_error(load_obs)
        if load_error is not None:
            return error("load failed: " + load_error)
        pairs, summary = rp.resaved_pairs(case.api, full, load_obs,
                                          case.plan == case.dst_plan,
                                          refs.dst.shard_groups(), exp=exp)
        return p7_idempotent(pairs, summary=summary)

    def information(self, save_obs: Sequence, load_obs: Sequence) -> list[str]:
        return []

    def weights(self, save_obs: Sequence, load_obs: Sequence, exp: Expectation) -> list[str]:
        return []  # the run's round trip loads the weights itself (sut/roundtrip.py)

    def training(self, case: Case, save_obs: Sequence, load_obs: Sequence,
                 local) -> TrainingSeen | None:
        if not case.scheduler or case.golden or _load_error(load_obs) is not None:
            return None
        return training_seen(case, save_obs, load_obs, local,
                             case.steps if case.app_state else None)
