"""Reading the reports to compare: :func:`load_any` (which kind, checked) and the facts the
header shows of each side.

Two kinds are compared: run reports (schema ``fsdp-conformance/run/1``) and benchmark
reports (``fsdp-conformance/bench/1``, pytest-benchmark's JSON plus that schema). Any other
file, or a run report against a benchmark report, is a :class:`ReportFormatError` naming the
file and what was expected (a usage error, exit code 2). The fields the comparison and the renderings read are checked with
their types, so a malformed report is refused naming the file and the field, never compared.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..properties.verdict import STATUSES
from .diff_model import BENCH_SCHEMA, RUN_SCHEMA
from .run_report import ReportFormatError, check_schema, machine_line


def _schema_kind(schema: Any) -> str | None:
    """"run" / "bench" for major version 1 of either schema (``.../1`` or ``.../1.x``)."""
    if not isinstance(schema, str):
        return None
    prefix, _, version = schema.rpartition("/")
    if version.split(".", 1)[0] != "1":
        return None
    return {"fsdp-conformance/run": "run", "fsdp-conformance/bench": "bench"}.get(prefix)


def load_any(path: str | os.PathLike) -> tuple[str, dict]:
    """("run" | "bench", the report) read from ``path``; ReportFormatError naming the file
    when it cannot be read, is not JSON, has another schema or lacks a required field."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ReportFormatError(f"{path}: cannot read the report: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportFormatError(f"{path}: not valid JSON ({e}); expected a run report "
                                f"({RUN_SCHEMA!r}) or a benchmark report ({BENCH_SCHEMA!r})") from None
    got = data.get("schema") if isinstance(data, dict) else None
    kind = _schema_kind(got)
    if kind is None:
        what = f"schema {got!r}" if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        hint = (" (a benchmark file from before the bench schema: rerun its "
                "`fsdp-conformance bench` to get a comparable one)"
                if isinstance(got, str) and got.startswith("fsdp-conformance/bench") else "")
        raise ReportFormatError(f"{path}: expected a run report (schema {RUN_SCHEMA!r}) or a "
                                f"benchmark report (schema {BENCH_SCHEMA!r}), got {what}{hint}")
    if kind == "run":
        check_schema(data, path)
        _check_run(data, path)
    else:
        _check_bench(data, path)
    return kind, data


def _need(obj: Any, key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise ReportFormatError(f"{where}: missing key {key!r}")
    v, types = obj[key], typ if isinstance(typ, tuple) else (typ,)
    if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
        names = "/".join(t.__name__ for t in types)
        raise ReportFormatError(f"{where}: {key!r} must be {names}, got {type(v).__name__}")
    return v


def _check_run(data: dict, path: Any) -> None:
    """The fields the comparison and the renderings read, with their types."""
    for key in ("torch_version", "backend", "tier"):
        _need(data, key, str, f"{path}")
    _need(_need(data, "summary", dict, f"{path}"), "by_path", dict, f"{path}: summary")
    seen: set[str] = set()
    for i, c in enumerate(_need(data, "cases", list, f"{path}")):
        where = f"{path}: cases[{i}]"
        cid = _need(c, "id", str, where)
        where = f"{path}: case {cid!r}"
        _need(c, "api", str, where)
        if cid in seen:
            raise ReportFormatError(f"{where}: appears twice")
        seen.add(cid)
        for prop, v in _need(c, "properties", dict, where).items():
            status = _need(v, "status", str, f"{where}: {prop}")
            if status not in STATUSES:
                raise ReportFormatError(f"{where}: {prop}: status {status!r} is not one of "
                                        f"{', '.join(STATUSES)}")
        for phase, m in (c.get("measurements") or {}).items():
            _need(m, "time_s", (int, float), f"{where}: measurements.{phase}")
    for key, s in (data.get("scaling") or {}).items():
        _need(s, "exponent", (int, float), f"{path}: scaling[{key!r}]")


def _check_bench(data: dict, path: Any) -> None:
    seen: set[str] = set()
    for i, b in enumerate(_need(data, "benchmarks", list, f"{path}")):
        name = _need(b, "name", str, f"{path}: benchmarks[{i}]")
        where = f"{path}: benchmark {name!r}"
        if name in seen:
            raise ReportFormatError(f"{where}: appears twice (benchmarks are matched by name)")
        seen.add(name)
        stats = _need(b, "stats", dict, where)
        for key in ("min", "median"):
            _need(stats, key, (int, float), f"{where}: stats")


def run_facts(report: dict) -> dict:
    """What the header says about a run report."""
    commit = (report.get("machine_info") or {}).get("commit_info") or {}
    return {"torch": report.get("torch_version"), "backend": report.get("backend"),
            "tier": report.get("tier"), "selection": report.get("selection"),
            "world_sizes": report.get("world_sizes"), "cases": len(report["cases"]),
            "ok": report.get("ok"), "machine": machine_line(report),
            "fingerprint": (report.get("machine_info") or {}).get("fingerprint"),
            "commit": commit.get("id"), "finished": report.get("finished"),
            "removed": (report.get("summary") or {}).get("removed") or {},
            "removed_fixtures": (report.get("summary") or {}).get("removed_fixtures") or []}


def bench_facts(report: dict) -> dict:
    """What the header says about a benchmark report."""
    m = report.get("machine_info") or {}
    commit = report.get("commit_info") or m.get("commit_info") or {}
    return {"torch": m.get("torch_version"), "benchmarks": len(report["benchmarks"]),
            "machine": machine_line(report), "fingerprint": m.get("fingerprint"),
            "commit": commit.get("id"), "datetime": report.get("datetime")}
