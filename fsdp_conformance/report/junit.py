"""A run report as JUnit XML (``run --junit-xml``, ``merge --junit-xml``): what CI systems
show as tests.

Rules
- One ``testcase`` per case: ``classname`` its API path (the id's first part), ``name`` the
  rest of its id, ``time`` its total seconds; one ``testsuite`` ("fsdp-conformance") holds
  them, with the counts.
- A case with a (case, property) verdict ``fail`` gets a ``failure``, one with ``error`` (and
  no fail) an ``error``: ``message`` names the properties, the text holds each one's detail
  and the command that reruns the case. Known limitations and n/a are not failures: they
  are listed in ``system-out`` (the entry's key per property), so a reader sees what passed
  as known.
- An incomplete run adds one ``error`` testcase, ``run/incomplete``, saying why; each planned
  case not decided is not invented.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

from .run_report import FAILING, prop_key, rerun_command

DETAIL_LIMIT = 4000
"""Characters of one property's detail kept in the XML (the JSON report holds all)."""


def to_junit(report: dict) -> str:
    """The report as a JUnit XML document (module rules)."""
    suite = ET.Element("testsuite", name="fsdp-conformance")
    failures = errors = 0
    for c in report["cases"]:
        path, _, rest = c["id"].partition("/")
        props = c.get("properties") or {}
        case = ET.SubElement(suite, "testcase", classname=path, name=rest or path,
                             time=f"{float((c.get('timings') or {}).get('total', 0.0)):.3f}")
        bad = {p: v for p, v in props.items() if v["status"] in FAILING}
        if bad:
            kind = "failure" if any(v["status"] == "fail" for v in bad.values()) else "error"
            failures += kind == "failure"
            errors += kind == "error"
            names = sorted(bad, key=prop_key)
            el = ET.SubElement(case, kind, message=f"{', '.join(names)} "
                               f"{'failed' if kind == 'failure' else 'errored'}",
                               type=kind)
            el.text = "\n\n".join(f"{p} {bad[p]['status']}: {bad[p]['detail'][:DETAIL_LIMIT]}"
                                  for p in names) + f"\n\nrerun: {rerun_command(c['id'])}"
        known = [f"{p}: known torch limitation {v.get('known')}" for p, v in
                 sorted(props.items(), key=lambda pv: prop_key(pv[0])) if v["status"] == "known"]
        if known:
            ET.SubElement(case, "system-out").text = "\n".join(known)
    if report.get("incomplete"):
        errors += 1
        case = ET.SubElement(suite, "testcase", classname="run", name="incomplete", time="0")
        ET.SubElement(case, "error", message="the run is incomplete",
                      type="incomplete").text = str(report["incomplete"])
    n = len(report["cases"]) + bool(report.get("incomplete"))
    suite.set("tests", str(n))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", "0")
    suite.set("time", f"{float(report.get('wall_time_s', 0.0)):.1f}")
    suite.set("timestamp", str(report.get("started", "")))
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
