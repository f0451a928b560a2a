"""fsdp-conformance: reference implementation, multi-process harness, pytest plugin and
conformance suite for optimizer-state checkpointing under PyTorch FSDP.

The public names below load on first use (PEP 562): ``import fsdp_conformance`` imports
neither torch nor any submodule, so the pytest plugin (``fsdp_conformance.plugin``) costs
a session nothing until a test uses it.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> (module, attribute in it)
_EXPORTS = {
    # test your own model (fsdp_conformance.user)
    "check": ("fsdp_conformance.user.driver", "check"),
    "CheckOptions": ("fsdp_conformance.user.check_options", "CheckOptions"),
    "check_zoo": ("fsdp_conformance.user.driver", "check_zoo"),
    "check_scale": ("fsdp_conformance.scale.check", "check_scale"),
    "TrainState": ("fsdp_conformance.user.app_state", "TrainState"),
    "size_id": ("fsdp_conformance.user.spec", "size_id"),
    "Case": ("fsdp_conformance.cases", "Case"),
    # the conformance run, its verdicts and reports
    "run_cases": ("fsdp_conformance.run.execute", "run_cases"),
    "Verdict": ("fsdp_conformance.properties.verdict", "Verdict"),
    "PROPERTIES": ("fsdp_conformance.properties.catalogue", "CATALOGUE"),
    "CaseResult": ("fsdp_conformance.report.result", "CaseResult"),
    "load_report": ("fsdp_conformance.report.run_report", "load_report"),
    "Comparison": ("fsdp_conformance.report.diff", "Comparison"),
    "Thresholds": ("fsdp_conformance.report.diff", "Thresholds"),
    "compare_files": ("fsdp_conformance.report.diff", "compare_files"),
    "render_html": ("fsdp_conformance.report.html", "render_html"),
    # rank pools
    "RankContext": ("fsdp_conformance.harness", "RankContext"),
    "RankDied": ("fsdp_conformance.harness", "RankDied"),
    "RankError": ("fsdp_conformance.harness", "RankError"),
    "RankPool": ("fsdp_conformance.harness", "RankPool"),
    "RankTimeout": ("fsdp_conformance.harness", "RankTimeout"),
    "attach": ("fsdp_conformance.harness", "attach"),
    "close_pools": ("fsdp_conformance.harness", "close_pools"),
    "get_pool": ("fsdp_conformance.harness", "get_pool"),
    # golden fixtures
    "FixtureError": ("fsdp_conformance.golden", "FixtureError"),
    "generate_fixtures": ("fsdp_conformance.golden", "generate"),
    "golden_cases": ("fsdp_conformance.golden", "golden_cases"),
    # offline checkpoints: inspect and convert
    "CheckpointSummary": ("fsdp_conformance.inspection.summary", "Summary"),
    "InspectFinding": ("fsdp_conformance.inspection.summary", "Finding"),
    "inspect_path": ("fsdp_conformance.inspection.entry", "inspect_path"),
    "render_inspect": ("fsdp_conformance.inspection.render", "render_text"),
    "convert": ("fsdp_conformance.reshard.conversion", "convert"),
    "UsageError": ("fsdp_conformance.usage", "UsageError"),
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    target = _EXPORTS.get(name)
    if target is None:  # AttributeError lets ``from fsdp_conformance import <submodule>`` work
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
