"""``fsdp-conformance bench reference --quick``: runs end to end (small sizes, few rounds) and
writes a pytest-benchmark-like JSON with every figure the full run reports."""
from __future__ import annotations

import json
import time

from fsdp_conformance import cli


def test_bench_reference_quick_writes_the_report(tmp_path, capsys):
    out = tmp_path / "bench.json"
    t0 = time.perf_counter()
    rc = cli.main(["bench", "reference", "--quick", "--out", str(out)])
    elapsed = time.perf_counter() - t0
    assert rc in (0, 1)  # 1: a target missed (timings on a shared machine); still a report
    assert elapsed < 60, f"--quick took {elapsed:.0f} s"
    text = capsys.readouterr().out
    assert "gather / floor" in text and f"wrote {out}" in text
    report = json.loads(out.read_text())
    assert report["schema"] == "fsdp-conformance/bench/1" and report["bench"] == "reference"
    for key in ("machine_info", "commit_info", "datetime", "version", "benchmarks", "targets",
                "results"):
        assert key in report, key
    assert {"torch_version", "cpu_count", "mem_total_kb"} <= set(report["machine_info"])
    ops = {(b["group"], b["params"]["op"]) for b in report["benchmarks"]}
    assert ops == {("1e6", "floor"), ("1e6", "gather"), ("1e6", "reshard"),
                   ("torch", "torch_full_optim_state_dict"), ("torch", "gather"),
                   ("torch", "floor")}
    for b in report["benchmarks"]:
        assert set(b) >= {"name", "group", "fullname", "params", "stats", "extra_info"}
        assert set(b["stats"]) >= {"min", "max", "mean", "median", "stddev", "rounds", "data"}
        assert b["stats"]["rounds"] == len(b["stats"]["data"]) >= 1
        assert b["extra_info"]["gb_per_s"] > 0 and b["extra_info"]["bytes"] > 0
    for op in ("gather", "reshard", "torch_full_optim_state_dict"):
        b = next(b for b in report["benchmarks"] if b["params"]["op"] == op)
        m = b["extra_info"]["memory"]
        assert m["peak_delta_bytes"] > 0 and m["output_bytes"] > 0 and m["unit_bytes"] > 0
    res = report["results"]
    assert set(res) == {"gather_x_floor", "reshard_peak_over_output_in_units", "misses"}
    assert (rc == 1) == bool(res["misses"])
    # the memory bound is deterministic, unlike timings: it must hold even in a smoke run
    assert res["reshard_peak_over_output_in_units"]["1e6"] <= 1.0
