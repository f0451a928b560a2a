"""Re-exports of :mod:`fsdp_conformance.reshard` at the old path, kept until integration."""
from __future__ import annotations

from .reshard import *  # noqa: F401,F403
from .reshard import __all__
from .reshard.outputs import rename_noreplace as _rename_noreplace  # noqa: F401  (generate.py)
