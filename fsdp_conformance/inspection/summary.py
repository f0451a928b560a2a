"""The records ``inspect`` reports (:class:`Summary` and its parts) and their JSON form.

Rules
-----
Records are frozen, keyword-only dataclasses. ``Summary.to_json`` writes every field
(schema ``SCHEMA``) plus ``counts``; ``Summary.from_json`` reads exactly that back and
raises ValueError naming the field otherwise. Sizes: see ``describe``'s docstring.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

SCHEMA = "fsdp-conformance/inspect/1"
SHARDED_KINDS = ("sharded tensor", "dtensor")


@dataclass(frozen=True, kw_only=True)
class Chunk:
    """One stored piece of a tensor: the rank that wrote it (None: unknown), where it starts
    and its size, per dim."""

    rank: int | None
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class StateInfo:
    """One state value of one param (sizes: see ``describe``'s docstring). ``kind`` is "tensor",
    "scalar tensor" (0-dim), "sharded tensor", "dtensor", "int", "float", "bool", "str",
    "none", "unread" or "other:<type>"; ``nonfinite`` is the NaN/Inf count (None: values not
    read); ``value`` is set for scalars (0-dim tensors and Python numbers); ``world_size`` is
    the one a ShardedTensor or DTensor records; ``placements`` a DTensor's; ``rank_numel``
    the element count of each rank's piece (per-rank files; one file's own piece of a
    ShardedTensor or DTensor)."""

    name: str
    kind: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    numel: int = 0
    nbytes: int = 0
    value: Any = None
    nonfinite: int | None = None
    rank_numel: tuple[int | None, ...] | None = None
    chunks: tuple[Chunk, ...] = ()
    world_size: int | None = None
    placements: str | None = None

    @property
    def per_element(self) -> bool:
        """A tensor with one value per element of its param (not a 0-dim ``step``)."""
        return self.kind in ("tensor",
                             ) + SHARDED_KINDS and (self.shape is None or len(self.shape) > 0)


@dataclass(frozen=True, kw_only=True)
class ParamInfo:
    """A param key (FQN or int id) with its state, the groups that list it and its step
    (``step_kind``: "tensor", "int" or "float"); ``ranks_with_state`` for per-rank files."""

    key: str | int
    groups: tuple[int, ...]
    state: tuple[StateInfo, ...]
    step: Any = None
    step_kind: str | None = None
    ranks_with_state: tuple[int, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class GroupInfo:
    """One param group: its position, hyperparameters (JSON-safe values) and param keys."""

    index: int
    hyper: dict[str, Any]
    params: tuple[str | int, ...]


@dataclass(frozen=True, kw_only=True)
class Finding:
    """Something worth saying: ``level`` "warning" (suspicious) or "note" (normal for what
    it names); ``code`` a stable name (``no-state``, ``step-disagree`` ...)."""

    level: str
    code: str
    message: str


@dataclass(frozen=True, kw_only=True)
class Summary:
    """Everything ``inspect`` reports about one checkpoint (see the package docstring).
    ``format`` is "file", "rank-files" or "dcp"; ``key_type`` "fqn", "int", "mixed" or
    "none"; ``world_size`` None when nothing in the input says it."""

    path: str
    format: str
    description: str
    location: str
    key_type: str
    optimizer: str | None
    params: tuple[ParamInfo, ...]
    groups: tuple[GroupInfo, ...]
    world_size: int | None
    layout: tuple[str, ...]
    state_bytes: int
    values_read: bool
    unsafe_loaded: bool
    files: tuple[str, ...]
    findings: tuple[Finding, ...] = field(default=())

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.level == "warning")

    def counts(self) -> dict[str, int]:
        """Params with state, listed in groups, listed without state, with state in no group."""
        listed = {k for g in self.groups for k in g.params}
        with_state = {p.key for p in self.params if p.state}
        return {"with_state": len(with_state), "in_groups": len(listed),
                "in_groups_without_state": len(listed - with_state),
                "with_state_in_no_group": len(with_state - listed)}

    def to_json(self) -> dict:
        """Every field (schema ``SCHEMA``), plus ``counts``; :meth:`from_json` reads it back."""
        return {"schema": SCHEMA, "path": self.path, "format": self.format,
                "description": self.description, "location": self.location,
                "key_type": self.key_type, "optimizer": self.optimizer,
                "world_size": self.world_size, "layout": list(self.layout),
                "counts": self.counts(), "state_bytes": self.state_bytes,
                "values_read": self.values_read, "unsafe_loaded": self.unsafe_loaded,
                "files": list(self.files),
                "params": [_param_json(p) for p in self.params],
                "param_groups": [{"index": g.index, "hyperparameters": g.hyper,
                                  "params": list(g.params)} for g in self.groups],
                "findings": [{"level": f.level, "code": f.code, "message": f.message}
                             for f in self.findings]}

    @classmethod
    def from_json(cls, doc: Mapping) -> "Summary":
        """The Summary :meth:`to_json` wrote; ValueError naming the field when ``doc`` is not
        one (another schema, a missing field)."""
        if not isinstance(doc, Mapping) or doc.get("schema") != SCHEMA:
            got = doc.get("schema") if isinstance(doc, Mapping) else type(doc).__name__
            raise ValueError(f"schema {got!r}, expected {SCHEMA!r}")
        try:
            return cls(path=doc["path"], format=doc["format"], description=doc["description"],
                       location=doc["location"],
                       key_type=doc["key_type"], optimizer=doc["optimizer"],
                       params=tuple(_param_from_json(p) for p in doc["params"]),
                       groups=tuple(GroupInfo(index=g["index"], hyper=dict(g["hyperparameters"]),
                                              params=tuple(g["params"]))
                             for g in doc["param_groups"]),
                       world_size=doc["world_size"], layout=tuple(doc["layout"]),
                       state_bytes=doc["state_bytes"],
                       values_read=doc["values_read"], unsafe_loaded=doc["unsafe_loaded"],
                       files=tuple(doc["files"]),
                       findings=tuple(Finding(level=f["level"], code=f["code"],
                                              message=f["message"]) for f in doc["findings"]))
        except (KeyError, TypeError) as e:
            raise ValueError(f"not an inspect summary: missing or malformed field {e}") from None


def _param_json(p: ParamInfo) -> dict:
    def state(s: StateInfo) -> dict:
        return {"name": s.name, "kind": s.kind, "dtype": s.dtype,
                "shape": None if s.shape is None else list(s.shape), "numel": s.numel,
                "nbytes": s.nbytes, "value": s.value, "nonfinite": s.nonfinite,
                "rank_numel": None if s.rank_numel is None else list(s.rank_numel),
                "chunks": [{"rank": c.rank, "offsets": list(c.offsets), "sizes": list(c.sizes)}
                           for c in s.chunks],
                "world_size": s.world_size, "placements": s.placements}

    return {"key": p.key, "groups": list(p.groups), "step": p.step, "step_kind": p.step_kind,
            "ranks_with_state": None if p.ranks_with_state is None else list(p.ranks_with_state),
            "state": [state(s) for s in p.state]}


def _param_from_json(d: Mapping) -> ParamInfo:
    def opt_tuple(v):
        return None if v is None else tuple(v)

    state = tuple(StateInfo(name=s["name"], kind=s["kind"], dtype=s["dtype"],
                            shape=opt_tuple(s["shape"]), numel=s["numel"],
                            nbytes=s["nbytes"], value=s["value"], nonfinite=s["nonfinite"],
                            rank_numel=opt_tuple(s["rank_numel"]),
                            chunks=tuple(Chunk(rank=c["rank"], offsets=tuple(c["offsets"]),
                                               sizes=tuple(c["sizes"]))
                                  for c in s["chunks"]), world_size=s["world_size"],
                            placements=s["placements"])
                  for s in d["state"])
    return ParamInfo(key=d["key"], groups=tuple(d["groups"]), state=state, step=d["step"],
                     step_kind=d["step_kind"],
                     ranks_with_state=opt_tuple(d["ranks_with_state"]))
