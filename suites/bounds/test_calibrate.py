"""``bounds calibrate`` on real ranks: a bounds case whose path raises is listed, with
torch's error, under ``unmeasured``, and every other case is still calibrated."""
from __future__ import annotations

import argparse
import json
import re

from fsdp_conformance.bounds import cli
from fsdp_conformance.run import matrix


def test_calibrate_lists_a_case_whose_path_raises_and_fits_the_others(tmp_path, monkeypatch):
    # torch 2.13's dcp-zero-local-shard-falls-back-to-old-keys: the bounds model's 3-row last
    # layer leaves rank 3 of 4 without a shard, and fsdp1.dsd_sharded's load raises there
    cases = [c for c in matrix.quick(matrix.default_paths())
             if c.bounds and c.api == "fsdp1.dsd_sharded" and c.world_size in (1, 4)]
    assert [c.world_size for c in cases] == [1, 4]
    monkeypatch.setattr(cli, "_cases", lambda args: cases)
    out = tmp_path / "cal.json"
    args = argparse.Namespace(runs=1, out=str(out), refit=False, backend=None, timeout=120.0,
                              tier="quick", world_sizes=None)
    assert cli.calibrate(args) == 0
    data = json.loads(out.read_text())
    [(case_id, error)] = data["unmeasured"].items()
    assert case_id == cases[1].id
    assert re.fullmatch(r"rank \d: RuntimeError: Missing key in checkpoint state_dict: "
                        r"optim\.param_groups\.", error), error
    assert set(data["work"]) == {"fsdp1.dsd_sharded/save/ws1/scaled500000",
                                 "fsdp1.dsd_sharded/load/ws1/scaled500000"}
