"""Re-exports of :mod:`fsdp_conformance.inspect` at the old path, kept until integration."""
from __future__ import annotations

from .inspect.describe import FLAT_MARKER, describe_value, guess_optimizer  # noqa: F401
from .inspect.entry import inspect_path  # noqa: F401
from .inspect.findings import findings_for  # noqa: F401
from .inspect.load import LoadedFile, ShardedRecord, load_file  # noqa: F401
from .inspect.locate import (MAX_DEPTH, find_optimizer_dicts, is_optimizer_dict,  # noqa: F401
                             location_str, select_optimizer_dict)
from .inspect.summary import (SCHEMA, SHARDED_KINDS, Chunk, Finding, GroupInfo,  # noqa: F401
                              ParamInfo, StateInfo, Summary)
