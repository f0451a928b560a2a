"""Re-exports of :mod:`fsdp_conformance.inspect.cli` and ``.render`` at the old path, kept until integration."""
from __future__ import annotations

from .inspect.cli import COMMANDS, add_parser, main, run  # noqa: F401
from .inspect.render import (DEFAULT_LIMIT, group_row, header_line, param_row, render,  # noqa: F401
                             render_text, size_str)
