"""``fsdp-conformance report`` and the HTML page: self-contained (no resource fetched from
anywhere, plots inline as PNG), escaped, complete failure details, plots when the report has
measurements, deterministic bytes, and the CLI's output rules (defaults next to the input,
never over the input)."""
from __future__ import annotations

import base64
import copy
import json
import re
import shutil

from fsdp_conformance.cli import main as cli_main
from fsdp_conformance.known.entries import KNOWN
from fsdp_conformance.properties.verdict import Verdict, fail, passed
from fsdp_conformance.report.html import render_html
from fsdp_conformance.report.run_report import CaseResult, load_report, render_markdown, rerun_command

from .test_compare import (A, B, BASELINE, KEY, _scaling, bench, make_report, meas,
                           with_measurements)

NASTY = "<script>alert('x')</script> & \"quoted\" </pre>"
LONG = "\n".join(f"state['w']['exp_avg'][{i}]: 0.{i} != 0.{i + 1}" for i in range(150))


def _report() -> dict:
    return make_report([
        CaseResult(A, {"P0": passed(), "P1": fail(NASTY), "P2": fail(LONG)}),
        CaseResult(B, {"P0": passed(), "P1": Verdict("known", "aliasing", KEY)}),
    ])


def _measured_report() -> dict:
    r = with_measurements(_report(), A.id, save=meas(0.02, 0.01), load=meas(0.03, 0.01))
    r = with_measurements(r, B.id, save=meas(0.01, 0.008, peaks=(3 << 20,)))
    r["scaling"] = _scaling(1.1)
    return r


def _attrs(page: str, name: str) -> list[str]:
    return re.findall(rf'\b{name}\s*=\s*["\']([^"\']*)["\']', page, flags=re.I)


def assert_self_contained(page: str) -> None:
    """No resource the page would load from elsewhere; links only to upstream issues."""
    low = page.lower()
    assert "<script" not in low and "<link" not in low and "<iframe" not in low
    assert "@import" not in low and "url(" not in low
    for src in _attrs(page, "src"):
        assert src.startswith("data:image/png;base64,"), src[:80]
    upstream = " ".join(k.upstream for k in KNOWN)
    for href in _attrs(page, "href"):
        assert href.startswith("https://github.com/") and href in upstream, href


def test_baseline_renders_with_its_bounds_measurements():
    r = load_report(BASELINE)
    page = render_html(r)
    assert_self_contained(page)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert f"OK: {r['summary']['cases']} cases" in page
    assert "torch 2.13.0+cpu, gloo, tier quick" in page
    assert "Timing and memory (P13, P14)" in page and "data:image/png;base64," in page
    # the matrix: one row per path, the counts of the terminal matrix
    matrix = page.split("<h2>Matrix</h2>", 1)[1].split("<h2>", 1)[0]
    assert matrix.count("<tr><td>fsdp1.") + matrix.count("<tr><td>fsdp2.") == len(r["summary"]["by_path"])
    assert "Failures (0)" in page
    # known limitations with their upstream links as plain links
    assert 'href="https://github.com/pytorch/pytorch/issues/126952"' in page
    assert "orig-params-full-osd-aliasing" in page


def test_failures_escaped_complete_with_rerun():
    page = render_html(_report())
    assert_self_contained(page)
    assert "FAILED" in page and "Failures (2)" in page
    assert NASTY not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; " \
                                 "&quot;quoted&quot; &lt;/pre&gt;" in page
    # the full detail, all 150 lines, not Markdown's first 80
    assert "exp_avg&#x27;][149]: 0.149 != 0.150" in page
    assert "exp_avg'][149]" not in render_markdown(_report())
    assert page.count("<pre>") == 2
    assert f"<code>{rerun_command(A.id).replace(chr(39), '&#x27;')}</code>" in page


def test_measurements_give_inline_png_plots():
    page = render_html(_measured_report())
    assert_self_contained(page)
    imgs = _attrs(page, "src")
    # fsdp1.full: time and memory plots (measured and a scaling entry)
    assert len(imgs) == 2 and '<img src="data:image/png;base64,' in page
    for src in imgs:
        png = base64.b64decode(src.split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
    assert "Scaling with world size" in page and "fsdp1.full/save" in page
    # worst time/bound: 0.03 / (10 * 0.03) = 0.10; worst peak/bound 4 MiB / 64 MiB = 0.06
    assert "<td>0.10</td>" in page and "<td>0.06</td>" in page


def test_html_is_deterministic():
    r = _measured_report()
    assert render_html(r) == render_html(copy.deepcopy(r))


def test_report_cli_defaults_and_refuses_the_input(tmp_path, capsys):
    src, report = tmp_path / "run.json", _measured_report()
    src.write_text(json.dumps(report))
    before = src.read_bytes()
    assert cli_main(["report", str(src)]) == 0
    assert "wrote" in capsys.readouterr().out
    page = (tmp_path / "run.html").read_text()
    assert_self_contained(page)
    assert '<img src="data:image/png;base64,' in page
    assert (tmp_path / "run.md").read_text() == render_markdown(report)
    assert cli_main(["report", str(src), "--html", str(src)]) == 2
    assert "is the input" in capsys.readouterr().err
    link = tmp_path / "alias.html"
    link.symlink_to(src)
    assert cli_main(["report", str(src), "--html", str(link)]) == 2
    assert cli_main(["report", str(src), "--md", str(tmp_path / "x"), "--html",
                     str(tmp_path / "x")]) == 2
    assert src.read_bytes() == before
    # --out names both pages (a suffix on it is replaced)
    assert cli_main(["report", str(src), "--out", str(tmp_path / "pages" / "p.json")]) == 0
    assert (tmp_path / "pages" / "p.md").read_text() == render_markdown(report)
    assert_self_contained((tmp_path / "pages" / "p.html").read_text())


def test_report_cli_refuses_other_schemas(tmp_path, capsys):
    other = tmp_path / "bench.json"
    shutil.copy(BASELINE.parent / "bench-reference.json", other)
    assert cli_main(["report", str(other)]) == 2
    err = capsys.readouterr().err
    assert str(other) in err and "fsdp-conformance/run/1" in err
    assert not (tmp_path / "bench.html").exists()
    (tmp_path / "b.json").write_text(json.dumps(bench({"a": (0.01, 0.01, None, None)})))
    assert cli_main(["report", str(tmp_path / "b.json")]) == 2
    assert "is a benchmark report; `report` renders a run report" in capsys.readouterr().err
    assert cli_main(["report", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_scaling_only_report_plots(tmp_path):
    r = _report()
    r["scaling"] = {"fsdp2.full/load": _scaling(1.0)["fsdp1.full/save"]}
    page = render_html(r)
    assert_self_contained(page)
    assert page.count('<img src="data:image/png;base64,') == 1 and "<h3>fsdp2.full</h3>" in page
