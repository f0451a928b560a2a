"""The registry of API paths: every save/load path the conformance run drives, found by name.

Rules
- A path is one ``ApiPath`` record here and one module that holds its own steps (save,
  write, load and its P9 flip: the ``PathSteps`` protocol of ``sut/roundtrip.py``), which
  the one round trip (``sut.roundtrip.save_side`` / ``load_side``, the rank functions the
  pools run: ``PathSides``) runs. Adding a path is one module and one line in ``PATHS``.
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
from typing import Any, Callable, Literal, Protocol

Record = Any
"""A rank's record of one side (``sut.records.SaveRecord`` / ``LoadRecord``): named, not
imported, since this registry sits below the rank side and imports nothing of it."""

FAMILIES = ("fsdp1", "fsdp2")
ROUND_TRIP = "fsdp_conformance.sut.roundtrip"
"""The module of the one round trip every path runs (its ``save_side`` / ``load_side``)."""

# Where a round trip's save writes, under the case's work directory (``ApiPath.writes``):
FULL_FILE = "optim.pt"
"""The full dict a "full" path writes (rank 0)."""
MODEL_FILE = "model.pt"
"""The model's full params (rank 0; the load side loads them, not under test)."""
SCHED_FILE = "sched.pt"
"""The LR scheduler's state (rank 0), when the case has one."""
DCP_DIR = "dcp"
"""The DCP directory a "dcp" path writes."""
APP_KEY = "app"
"""The one key a DCP app state (sut/app_state.py) is saved under (the DCP keys are
``app.optim.state....``)."""


def rank_file(r: int) -> str:
    """The file rank ``r`` of a "per_rank" path writes."""
    return f"optim_rank{r}.pt"
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
    """What the one round trip (``ROUND_TRIP``) holds for every path: the rank functions the
    pools run (a path module holds its steps: ``sut.roundtrip.PathSteps``)."""

    def save_side(self, ctx: Any, case: Any, workdir: str, asks: Any = ...) -> Record:
        """Train, save through the path, write the files; record what was saved (``asks``:
        what the case's kind asks beyond that, ``sut.asks.SideAsks``)."""

    def load_side(self, ctx: Any, case: Any, workdir: str, asks: Any = ...) -> Record:
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
    """Module (relative to ``fsdp_conformance.sut``) holding the path's own steps (one
    module per path: sut/fsdp1_paths/, sut/fsdp2_paths/)."""
    writes: str
    """What the save writes: ``"full"`` (one torch.save'd full dict), ``"per_rank"`` (one
    torch.save'd file per rank) or ``"dcp"`` (a DCP directory)."""
    rekeys: bool = False
    """The path rekeys the dict (P5 applies): its file holds the PARAM_ID form of the
    unwrapped model (golden format "ids"), not FQN keys."""
    resizable: bool = True
    """The load side may run at another world size or wrapping than the save."""
    full_load: Literal["", "every_rank", "scatter", "broadcast"] = ""
    """A full path's load (``writes == "full"``): ``"every_rank"`` every rank reads the file
    and keeps its slice; ``"scatter"`` / ``"broadcast"`` only rank 0 reads it and sends the
    ranks their shares with that collective (its P13 floor). ``""`` for a sharded path."""
    axes: tuple[str, ...] = ()
    """The ``Case`` axes only this path's round trips take (``paths_with_axis``), e.g.
    ``"async_save"`` (a DCP write done by ``dcp.async_save``), ``"no_broadcast"``."""
    primary: bool = False
    """One of its family's primary paths (FSDP1: ``optim_state_dict`` full and sharded;
    FSDP2: both): a user's quick tier (user/spec.py) and the largest benchmark size run
    these."""
    bench: bool = True
    """The scaling benchmark (bench/scaling.py) measures it; False for the DSD paths on FSDP1,
    added after the benchmark's committed reports (their bounds cases measure them)."""
    fixtures: bool = True
    """The curated golden fixtures (golden/curated.py) save through this path; False where
    another path's fixtures already hold what it writes or its fixtures were never made."""
    calls: tuple[str, ...] = ()
    """The torch functions the path's save and load call by name (the last component of
    their qualified name, e.g. ``"full_optim_state_dict"``). A torch without one of them
    (missing, or raising that it was removed) makes the path's verdicts "removed"
    (run/removal.py)."""

    def sides(self) -> ModuleType:
        """The path's module (``sut.roundtrip.PathSteps``), imported on first use."""
        return importlib.import_module(f"fsdp_conformance.sut.{self.module}")

    @property
    def full(self) -> bool:
        """Its saved form is one full FQN-keyed dict, written by rank 0."""
        return self.writes == "full"

    @property
    def file_format(self) -> str:
        """The on-disk format golden fixtures of its saves have (golden/formats.py):
        ``"full"``, ``"ids"`` (a rekeyed full dict), ``"dcp"``, or per-rank files, whose
        form is the family's own: ``"rank_files"`` (FSDP1: ShardedTensors of flat
        params) or ``"dtensor_rank_files"`` (FSDP2: per-parameter DTensors), so neither
        family's load is handed the other's."""
        if self.rekeys:
            return "ids"
        if self.writes == "per_rank":
            return "rank_files" if self.family == "fsdp1" else "dtensor_rank_files"
        return {"full": "full", "dcp": "dcp"}[self.writes]

    def floor(self, phase: str) -> tuple[tuple[str, str], ...]:
        """The work no implementation of the path can avoid in ``phase`` (bounds/floors.py's
        rule): a full save all-gathers the state and rank 0 keeps a copy of all of it; a
        sharded save or load copies the rank's shard; a full load read by every rank keeps
        its slice; one read by rank 0 alone first sends every rank its share."""
        if phase == "save":
            return (("all_gather", "full"), ("copy", "full")) if self.full \
                else (("copy", "shard"),)
        if phase != "load":
            raise ValueError(f"phase must be 'save' or 'load', got {phase!r}")
        if self.full and self.full_load in ("scatter", "broadcast"):
            return ((self.full_load, "full"), ("copy", "shard"))
        return (("copy", "shard"),)

    @property
    def save_side(self) -> Callable[..., Record]:
        """The one round trip's save side (``sut.roundtrip.save_side``), the same for
        every path: its steps are ``sides()``."""
        return importlib.import_module(ROUND_TRIP).save_side

    @property
    def load_side(self) -> Callable[..., Record]:
        """The one round trip's load side (``sut.roundtrip.load_side``)."""
        return importlib.import_module(ROUND_TRIP).load_side


_FSDP1_NEW = ("optim_state_dict", "optim_state_dict_to_load", "state_dict_type")
_DSD = ("get_optimizer_state_dict", "set_optimizer_state_dict")
PATHS: tuple[ApiPath, ...] = (
    ApiPath(name="fsdp1.legacy_full", family="fsdp1", module="fsdp1_paths.legacy_full",
            writes="full", full_load="every_rank",
            calls=("full_optim_state_dict", "shard_full_optim_state_dict")),
    ApiPath(name="fsdp1.legacy_scatter", family="fsdp1", module="fsdp1_paths.legacy_scatter",
            writes="full", full_load="scatter", fixtures=False,  # legacy_full's save: its fixtures
            calls=("full_optim_state_dict", "scatter_full_optim_state_dict")),
    ApiPath(name="fsdp1.legacy_sharded", family="fsdp1", module="fsdp1_paths.legacy_sharded",
            writes="per_rank",
            # flatten_sharded_optim_state_dict takes the rank's own ShardedTensor shards,
            # which exist only for the saving world size and wrapping
            resizable=False,
            calls=("sharded_optim_state_dict", "flatten_sharded_optim_state_dict")),
    ApiPath(name="fsdp1.full", family="fsdp1", module="fsdp1_paths.full", writes="full",
            full_load="every_rank", primary=True, calls=_FSDP1_NEW),
    ApiPath(name="fsdp1.sharded", family="fsdp1", module="fsdp1_paths.sharded", writes="dcp",
            primary=True, calls=_FSDP1_NEW + ("load_sharded_optimizer_state_dict",)),
    ApiPath(name="fsdp1.rekey", family="fsdp1", module="fsdp1_paths.rekey", writes="full",
            rekeys=True, full_load="every_rank",
            calls=("full_optim_state_dict", "rekey_optim_state_dict",
                   "shard_full_optim_state_dict")),
    ApiPath(name="fsdp1.dsd_full", family="fsdp1", module="fsdp1_paths.dsd_full", writes="full",
            full_load="every_rank", fixtures=False, bench=False, calls=_DSD),
    ApiPath(name="fsdp1.dsd_full_broadcast", family="fsdp1",
            module="fsdp1_paths.dsd_full_broadcast", writes="full", full_load="broadcast",
            fixtures=False, bench=False, calls=_DSD),  # its save is dsd_full's
    ApiPath(name="fsdp1.dsd_sharded", family="fsdp1", module="fsdp1_paths.dsd_sharded",
            writes="dcp", fixtures=False, bench=False, calls=_DSD),
    ApiPath(name="fsdp2.full", family="fsdp2", module="fsdp2_paths.full", writes="full",
            full_load="broadcast", axes=("no_broadcast",), primary=True, calls=_DSD),
    ApiPath(name="fsdp2.sharded", family="fsdp2", module="fsdp2_paths.sharded", writes="dcp",
            axes=("async_save", "app_state"), primary=True, calls=_DSD),
    ApiPath(name="fsdp2.rank_files", family="fsdp2", module="fsdp2_paths.rank_files",
            writes="per_rank", resizable=False, fixtures=False, bench=False, calls=_DSD),
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


def full_paths() -> tuple[str, ...]:
    """The registered paths whose saved form is one full dict written by rank 0."""
    return tuple(p.name for p in PATHS if p.full)


def sharded_paths() -> tuple[str, ...]:
    """The registered paths whose saved form is sharded (per-rank files or DCP)."""
    return tuple(p.name for p in PATHS if not p.full)


def paths_writing(file_format: str) -> tuple[str, ...]:
    """The registered paths whose saves have ``file_format`` (``ApiPath.file_format``): the
    load paths that read a checkpoint of that format, in registry order."""
    return tuple(p.name for p in PATHS if p.file_format == file_format)


def paths_with_axis(axis: str) -> tuple[str, ...]:
    """The registered paths whose round trips take ``Case`` axis ``axis`` (``ApiPath.axes``)."""
    return tuple(p.name for p in PATHS if axis in p.axes)


def is_full_path(api: str) -> bool:
    """A registered path whose saved form is one full dict (False for any other api: a
    differential observer, a user's own path)."""
    return api in _BY_NAME and _BY_NAME[api].full


def resizable(api: str) -> bool:
    """Whether ``api`` can load at a world size or wrapping other than the saving one (a
    registered path's record; any other api can)."""
    return api not in _BY_NAME or _BY_NAME[api].resizable


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
