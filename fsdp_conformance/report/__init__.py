"""Reports: atomic writing, machine information, the run report (JSON schema
``fsdp-conformance/run/1``, terminal matrix, Markdown)."""
from .io import machine_info, write_json_atomic, write_text_atomic
from .run_report import SCHEMA as RUN_SCHEMA
from .run_report import (CaseResult, ReportFormatError, build_report, load_report,
                         render_markdown, render_table, summary_rows, write_run_report)

__all__ = [
    "RUN_SCHEMA", "CaseResult", "ReportFormatError", "build_report", "load_report", "machine_info",
    "render_markdown", "render_table", "summary_rows", "write_json_atomic", "write_run_report",
    "write_text_atomic",
]
