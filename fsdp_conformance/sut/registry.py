"""The registry of API paths: every save/load path the conformance run drives, found by name.

Rules
- A path is one ``ApiPath`` record here and one module that holds its rank functions
  ``save_side(ctx, case, workdir) -> SaveRecord`` and ``load_side(ctx, case, workdir) ->
  LoadRecord`` (the ``PathSides`` protocol; ``sut.records``). Adding a path is one module
  and one line in ``PATHS``.
- Code that must treat paths differently asks the record (``family``, ``writes``,
  ``rekeys``, ``resizable``), never the path's name: no ``api.startswith("fsdp2")``.
- This module imports neither torch nor the path modules: ``ApiPath.sides()`` imports the
  path's module when a case needs it (on the controller to pass the rank function to the
  pool, on the ranks to run it).
- Besides the run's paths, two differential observers (``"fsdp1"``, ``"fsdp2"``: every path
  of that API on one rank pool, suites/differential) and a user's own path
  (``"custom:<name>"`` under FSDP1, ``"fsdp2.custom:<name>"`` under ``fully_shard``: the
  plugin) have a family too (``family_of``).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from .records import LoadRecord, SaveRecord

FAMILIES = ("fsdp1", "fsdp2")
CUSTOM_PREFIX = "custom:"
# A user's own save/load under FSDP2 (``fully_shard``): ``"fsdp2.custom:<name>"``.
CUSTOM_PREFIXES = {"fsdp1": CUSTOM_PREFIX, "fsdp2": "fsdp2." + CUSTOM_PREFIX}


def custom_api(family: str, name: str) -> str:
    """The ``Case.api`` of a user's own save/load called ``name`` under ``family``."""
    return CUSTOM_PREFIXES[family] + name


def custom_family(api: str) -> str | None:
    """The family of a user's own path (``custom_api``), None for any other api."""
    for family, prefix in CUSTOM_PREFIXES.items():
        if api.startswith(prefix) and len(api) > len(prefix):
            return family
    return None


class PathSides(Protocol):
    """What a path module holds: the rank functions the pools run."""

    def save_side(self, ctx: Any, case: Any, workdir: str) -> "SaveRecord":
        """Train, save through the path, write the files; record what was saved."""

    def load_side(self, ctx: Any, case: Any, workdir: str) -> "LoadRecord":
        """Build fresh, load through the path, save again, resume; record it all."""


@dataclass(frozen=True, kw_only=True)
class ApiPath:
    """One save path of the conformance run and the load path that reads what it writes."""

    name: str
    """The path's name, ``Case.api`` (``"<family>.<what>"``)."""
    family: str
    """The FSDP API it belongs to: ``"fsdp1"`` (FullyShardedDataParallel, flat params) or
    ``"fsdp2"`` (``fully_shard``, per-parameter DTensors). Decides the model wrapping, the
    reference layout and the property family that judge the path."""
    module: str
    """Module (relative to ``fsdp_conformance.sut``) holding ``save_side`` / ``load_side``."""
    writes: str
    """What the save writes: ``"full"`` (one torch.save'd full dict), ``"per_rank"`` (one
    torch.save'd file per rank) or ``"dcp"`` (a DCP directory)."""
    rekeys: bool = False
    """The path rekeys the dict (P5 applies)."""
    resizable: bool = True
    """The load side may run at another world size or wrapping than the save."""
    calls: tuple[str, ...] = ()
    """The torch functions the path's save and load call by name (the last component of
    their qualified name, e.g. ``"full_optim_state_dict"``). A torch without one of them
    (missing, or raising that it was removed) makes the path's verdicts "removed"
    (run/removal.py)."""

    def sides(self) -> ModuleType:
        """The path's module (``PathSides``), imported on first use."""
        return importlib.import_module(f"fsdp_conformance.sut.{self.module}")

    @property
    def save_side(self) -> Callable[..., "SaveRecord"]:
        return self.sides().save_side

    @property
    def load_side(self) -> Callable[..., "LoadRecord"]:
        return self.sides().load_side


_FSDP1_NEW = ("optim_state_dict", "optim_state_dict_to_load", "state_dict_type")
_DSD = ("get_optimizer_state_dict", "set_optimizer_state_dict")
PATHS: tuple[ApiPath, ...] = (
    ApiPath(name="fsdp1.legacy_full", family="fsdp1", module="paths", writes="full",
            calls=("full_optim_state_dict", "shard_full_optim_state_dict")),
    ApiPath(name="fsdp1.legacy_scatter", family="fsdp1", module="paths", writes="full",
            calls=("full_optim_state_dict", "scatter_full_optim_state_dict")),
    ApiPath(name="fsdp1.legacy_sharded", family="fsdp1", module="paths", writes="per_rank",
            resizable=False,
            calls=("sharded_optim_state_dict", "flatten_sharded_optim_state_dict")),
    ApiPath(name="fsdp1.full", family="fsdp1", module="paths", writes="full",
            calls=_FSDP1_NEW),
    ApiPath(name="fsdp1.sharded", family="fsdp1", module="paths", writes="dcp",
            calls=_FSDP1_NEW + ("load_sharded_optimizer_state_dict",)),
    ApiPath(name="fsdp1.rekey", family="fsdp1", module="paths", writes="full", rekeys=True,
            calls=("full_optim_state_dict", "rekey_optim_state_dict",
                   "shard_full_optim_state_dict")),
    ApiPath(name="fsdp1.dsd_full", family="fsdp1", module="paths", writes="full",
            calls=_DSD),
    ApiPath(name="fsdp1.dsd_sharded", family="fsdp1", module="paths", writes="dcp",
            calls=_DSD),
    ApiPath(name="fsdp2.full", family="fsdp2", module="fsdp2_paths", writes="full",
            calls=_DSD),
    ApiPath(name="fsdp2.sharded", family="fsdp2", module="fsdp2_paths", writes="dcp",
            calls=_DSD),
)
PATH_NAMES: tuple[str, ...] = tuple(p.name for p in PATHS)
_BY_NAME = {p.name: p for p in PATHS}


def api_path(name: str) -> ApiPath:
    """The registered path called ``name``; a KeyError naming the registered ones otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no API path {name!r}; registered paths: {', '.join(PATH_NAMES)}") from None


def paths_of(family: str) -> tuple[str, ...]:
    """The registered paths of one FSDP API, in registry order."""
    return tuple(p.name for p in PATHS if p.family == family)


def family_of(api: str) -> str:
    """The FSDP API a ``Case.api`` runs under: a registered path's family, a differential
    observer's own name, and a user's own path's (``custom_family``)."""
    if api in _BY_NAME:
        return _BY_NAME[api].family
    if api in FAMILIES:
        return api
    family = custom_family(api)
    if family is not None:
        return family
    raise KeyError(f"no API path {api!r}; registered paths: {', '.join(PATH_NAMES)}, "
                   f"observers {', '.join(FAMILIES)}, or "
                   f"{' / '.join(p + '<name>' for p in CUSTOM_PREFIXES.values())}")
