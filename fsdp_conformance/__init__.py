"""fsdp-conformance: reference implementation, multi-process harness, pytest plugin and
conformance suite for optimizer-state checkpointing under PyTorch FSDP."""
from .harness import (RankContext, RankDied, RankError, RankPool, RankTimeout, attach,
                      close_pools, get_pool)
from .report.diff import Comparison, Thresholds, compare_files
from .report.html import render_html
from .golden import FixtureError, golden_cases
from .golden import generate as generate_fixtures
from .inspect import Finding as InspectFinding
from .inspect import Summary as CheckpointSummary
from .inspect import inspect_path
from .inspect.render import render_text as render_inspect

__version__ = "0.1.0"

__all__ = [
    "RankContext", "RankDied", "RankError", "RankPool", "RankTimeout", "attach",
    "close_pools", "get_pool", "__version__",
    "Comparison", "Thresholds", "compare_files", "render_html",
    "FixtureError", "generate_fixtures", "golden_cases",
    "CheckpointSummary", "InspectFinding", "inspect_path", "render_inspect",
]
