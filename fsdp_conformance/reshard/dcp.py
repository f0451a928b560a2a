"""A ``torch.distributed.checkpoint`` (DCP) directory's optimizer dict, read per param
without a process group.

Rules
-----
The directory holds an FQN-keyed optimizer dict (FSDP1 SHARDED/FULL ``optim_state_dict``,
FSDP2 ``get_optimizer_state_dict``, or any dict with ``state``/``param_groups``), alone or
under a top-level key (``{"optim": osd}``; ``key`` picks one when several hold an optimizer
dict). DCP stores global tensors, so this is a full dict read a few params at a time
(``_load_state_dict_from_keys``). Wrapper prefixes are removed from names. Unreadable
metadata or data, no optimizer dict, or a ``key`` that selects none is a
:class:`~.errors.UsageError`.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Collection, Mapping, Sequence

import torch

from .errors import UsageError
from .inputs import clean_name


class DcpFull:
    """A DCP checkpoint's optimizer dict, read per param (see the module docstring)."""

    def __init__(self, path: str | os.PathLike, key: str | None = None,
                 option: str = "--dcp-key"):
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        self.path = Path(path)
        try:
            md = FileSystemReader(str(self.path)).read_metadata()
        except Exception as e:  # noqa: BLE001
            raise UsageError(f"cannot read DCP metadata: {type(e).__name__}: {e}", path=self.path) from e
        pdata = md.planner_data or {}
        found: dict[tuple, dict] = {}
        for flat, meta in md.state_dict_metadata.items():
            path_ = tuple(pdata.get(flat, (flat,)))
            for i, part in enumerate(path_):
                if part == "state" and len(path_) >= i + 3:
                    d = found.setdefault(path_[:i], {"state": {}, "groups": []})
                    fqn, name = str(path_[i + 1]), path_[i + 2]
                    # an element of a list or dict value (LBFGS's history lists: one DCP
                    # entry per element, read back as the whole value) counts as a
                    # non-tensor value of its state name
                    nested = len(path_) > i + 3
                    ndim = len(meta.size) if isinstance(meta, TensorStorageMetadata) \
                        and not nested else -1
                    d["state"].setdefault(fqn, []).append((flat, name, ndim))
                    break
                if part == "param_groups" and len(path_) > i + 1 and isinstance(path_[i + 1], int):
                    found.setdefault(path_[:i], {"state": {}, "groups": []})["groups"].append(flat)
                    break
        if key is not None:
            sel = [p for p in found if ".".join(map(str, p)) == key]
        else:
            sel = list(found)
        names = sorted(".".join(map(str, p)) or "<top level>" for p in found)
        if len(sel) != 1:
            if not found:
                raise UsageError("no optimizer state ('state'/'param_groups') in this DCP checkpoint; "
                                 f"its keys start {sorted(md.state_dict_metadata)[:6]}", path=self.path)
            raise UsageError(f"{option} {key!r} selects {len(sel)} of the optimizer dicts found "
                             f"({names}); pass one of them", path=self.path)
        self.metadata = md  # torch.distributed.checkpoint Metadata (shapes, dtypes, chunks)
        self.prefix = sel[0]
        # what a trainer keeps beside its optimizer (an app state's scheduler, step, epoch):
        # every entry outside the optimizer dicts that is no positive-dim tensor
        optims = {f for d in found.values() for v in d["state"].values() for f, _, _ in v}
        optims |= {f for d in found.values() for f in d["groups"]}
        self._beside = {flat: tuple(pdata.get(flat, (flat,)))
                        for flat, meta in md.state_dict_metadata.items()
                        if flat not in optims
                        and not (isinstance(meta, TensorStorageMetadata) and len(meta.size))}
        entry = found[self.prefix]
        self._state_keys = {clean_name(f): v for f, v in entry["state"].items()}
        self._raw_fqn = {clean_name(f): f for f in entry["state"]}
        self._group_keys = entry["groups"]

    def fqns(self) -> list[str]:
        return list(self._state_keys)

    def entries(self) -> dict[str, list[tuple[str, str, int]]]:
        """``{fqn: [(DCP flat key, state name, ndim or -1 for a non-tensor), ...]}``; a list
        or dict value has one entry per element, each with its state name and -1."""
        return {f: list(v) for f, v in self._state_keys.items()}

    def per_element(self) -> set[str]:
        """State names stored as a positive-dim tensor for some param."""
        return {n for v in self._state_keys.values() for _, n, nd in v if nd > 0}

    def first_dtype(self) -> torch.dtype | None:
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        md = FileSystemReader(str(self.path)).read_metadata()
        for v in self._state_keys.values():
            for flat, _, nd in v:
                m = md.state_dict_metadata[flat]
                if nd > 0 and isinstance(m, TensorStorageMetadata) and m.properties.dtype.is_floating_point:
                    return m.properties.dtype
        return None

    def _load(self, keys: set[str]) -> dict:
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

        if not keys:
            return {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                sd = _load_state_dict_from_keys(keys, checkpoint_id=str(self.path))
            except Exception as e:  # noqa: BLE001
                raise UsageError(f"cannot read {sorted(keys)[:3]}...: {type(e).__name__}: {e}",
                                 path=self.path) from e
        for part in self.prefix:
            sd = sd[part]
        return sd

    def param_groups(self) -> list[dict]:
        groups = self._load(set(self._group_keys)).get("param_groups", [])
        if isinstance(groups, Mapping):  # a list saved with int keys
            groups = [groups[i] for i in sorted(groups)]
        out = []
        for g in groups:
            g2 = dict(g)
            if "params" in g2:
                g2["params"] = [clean_name(k) if isinstance(k, str) else k for k in g2["params"]]
            out.append(g2)
        return out

    def beside(self) -> dict[str, dict]:
        """What the checkpoint holds beside its optimizer dicts that is no positive-dim
        tensor (an app state's LR scheduler, step, epoch), read: ``{dotted path of its
        holder: {field: value}}`` (``{"app": {"step": 3}, "app.scheduler": {...}}``)."""
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

        if not self._beside:
            return {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                sd = _load_state_dict_from_keys(set(self._beside), checkpoint_id=str(self.path))
            except Exception as e:  # noqa: BLE001
                raise UsageError(f"cannot read {sorted(self._beside)[:3]}...: "
                                 f"{type(e).__name__}: {e}", path=self.path) from e
        out: dict[str, dict] = {}
        for flat, path_ in sorted(self._beside.items()):
            value = sd
            for part in path_:
                value = value[part]
            holder = ".".join(map(str, path_[:-1]))
            out.setdefault(holder, {})[str(path_[-1])] = value
        return out

    def fetch(self, fqns: Sequence[str], skip: Collection[str] = ()) -> dict[str, dict]:
        """``{fqn: state}`` for those of ``fqns`` that have state, without the state names
        in ``skip`` (one DCP read)."""
        want = [f for f in fqns if f in self._state_keys]
        sd = self._load({flat for f in want for flat, n, _ in self._state_keys[f]
                         if n not in skip}).get("state", {})
        return {f: dict(sd[self._raw_fqn[f]]) for f in want if self._raw_fqn[f] in sd}


__all__ = ["DcpFull"]
