"""The gate end to end (fsdp_conformance/gate/upgrade.py), with this interpreter on both sides."""
from __future__ import annotations

import json
import subprocess
import sys


def test_gate_end_to_end_on_this_interpreter(tmp_path):
    """The whole gate with this interpreter on both sides (no environment built): fresh
    fixtures, two runs on a narrow selection, the comparison, gate.md/gate.json, exit 0."""
    out = tmp_path / "gate"
    # two normal cases and the golden cases of fresh fixtures the quick tier's rotation over
    # the load paths sends through fsdp1.full with SGD-momentum on the nested MLP
    select = "fsdp1.full/sgd_momentum/mlp.nested not ws4"
    proc = subprocess.run(
        [sys.executable, "-m", "fsdp_conformance.cli", "gate", "--candidate-python",
         sys.executable, "--baseline-python", sys.executable, "--bench", "none",
         "-k", select, "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "gate.json").read_text())
    assert summary["verdict"] == "no regression"
    assert summary["compare_exit_codes"] == {"run": 0}
    for side in ("baseline", "candidate"):
        run = json.loads((out / side / "run.json").read_text())
        ids = [c["id"] for c in run["cases"]]
        assert "fsdp1.full/sgd_momentum/mlp.nested/flat/ws3->1/fp64" in ids
        assert any("/golden:" in i for i in ids)  # the baseline's fresh fixtures were loaded
    md = (out / "gate.md").read_text()
    assert "NO REGRESSION" in md and "golden fixtures (P12)" in md
    assert "## Comparison of the run reports" in md and "\n# " not in md.split("\n", 1)[1]
    assert (out / "fixtures").is_dir() and (out / "logs").is_dir()

