"""``run --shard I/N`` and ``merge`` (run/shards.py, report/merge.py): parts that a CI job
matrix can run apart and join again."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from fsdp_conformance.cli import main
from fsdp_conformance.report.merge import merge_reports
from fsdp_conformance.run import matrix
from fsdp_conformance.run.saves import by_save
from fsdp_conformance.run.shards import BOUNDS_COST, parse_shard, split
from fsdp_conformance.usage import UsageError

QUICK = matrix.quick(matrix.default_paths())
BASELINE = Path(__file__).resolve().parents[2] / "reports" / "baseline-quick-torch2.13.0-cpu.json"


def test_the_parts_cover_the_selection_once_keep_saves_and_paths_together_and_balance():
    parts = split(QUICK, 4)
    ids = [c.id for p in parts for c in p]
    assert sorted(ids) == sorted(c.id for c in QUICK) and len(set(ids)) == len(ids)
    part_of = {c.id: k for k, p in enumerate(parts) for c in p}
    for group in by_save([(i, c) for i, c in enumerate(QUICK) if not c.bounds]):
        assert len({part_of[c.id] for _, c in group}) == 1  # one save serves them
    for api in {c.api for c in QUICK if c.bounds}:  # each path's scaling fit in one part
        assert len({part_of[c.id] for c in QUICK if c.bounds and c.api == api}) == 1
    cost = [sum(BOUNDS_COST if c.bounds else 1 for c in p) for p in parts]
    assert max(cost) <= 1.15 * min(cost), cost
    # a function of the ids alone: the tier in another order gives the same parts
    again = split(list(reversed(QUICK)), 4)
    assert [sorted(c.id for c in p) for p in again] == [sorted(c.id for c in p) for p in parts]


def test_shard_specs_are_checked(capsys):
    assert parse_shard("2/4") == (2, 4)
    for bad in ("0/4", "5/4", "2", "a/b"):
        with pytest.raises(ValueError, match="--shard is written I/N"):
            parse_shard(bad)
    one = [c for c in QUICK if c.id.startswith("fsdp2.full/adam/mlp.nested/dtensor/ws2/")][:1]
    with pytest.raises(ValueError, match="cannot fill 2 parts"):
        split(one, 2)
    assert main(["run", "--shard", "3/2", "--list"]) == 2
    assert "--shard is written I/N" in capsys.readouterr().err


def _part(doc: dict, ids: list[str], index: int, count: int) -> dict:
    d = copy.deepcopy(doc)
    d["cases"] = [c for c in d["cases"] if c["id"] in ids]
    d["selected_ids"] = list(ids)
    d["shard"] = {"index": index, "count": count, "case_ids": []}
    return d


def test_merge_joins_the_parts_and_an_incomplete_or_foreign_set_is_named(tmp_path):
    from fsdp_conformance.report.run_report import summarize

    base = json.loads(BASELINE.read_text())
    base["cases"] = [c for c in base["cases"] if not c.get("bounds")][:30]
    ids = [c["id"] for c in base["cases"]]
    files = []
    for k, part in enumerate((ids[:10], ids[10:25], ids[25:]), start=1):
        f = tmp_path / f"p{k}.json"
        f.write_text(json.dumps(_part(base, part, k, 3)))
        files.append(f)
    merged = merge_reports(files)
    assert [c["id"] for c in merged["cases"]] == sorted(ids)
    assert merged["summary"] == summarize(base["cases"]) and merged["ok"] == base["ok"]
    assert not merged.get("incomplete") and merged["selected_ids"] == []
    assert [p["shard"] for p in merged["parts"]] == ["1/3", "2/3", "3/3"]
    short = merge_reports(files[::2])
    assert short["incomplete"] == "part(s) 2/3 not given" and not short["ok"]
    lost = json.loads(files[1].read_text())
    lost["cases"].pop()
    files[1].write_text(json.dumps(lost))
    assert "part 2/3" in merge_reports(files)["incomplete"]
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps(_part(base, ids[:1], 2, 3)))
    with pytest.raises(UsageError, match="part 2/3 given twice"):
        merge_reports([files[0], files[1], twice])
    other = _part(base, ids[25:], 3, 3)
    other["torch_version"] = "2.15.0"
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(UsageError, match="torch_version is '2.15.0'"):
        merge_reports([files[0], tmp_path / "other.json"])
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(base))
    with pytest.raises(UsageError, match="not a part of a run"):
        merge_reports([whole])
