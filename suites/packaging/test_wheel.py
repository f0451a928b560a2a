"""The package works installed, outside the repository: the wheel ``pip wheel .`` builds,
installed into a new virtual environment, runs ``fsdp-conformance`` (P12 from the golden
fixtures it ships) and the plugin in a user's own test folder.

The new environment takes torch, numpy, pytest and the other dependencies from this test's
own environment (a .pth line to its site-packages, after the new environment's own, where
the wheel is): installing torch again would cost minutes and test pip, not this package.
The installed copy is the one that runs: the test checks where the module comes from.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from suites.conftest import ROOT, env_for_subprocess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A new virtual environment with the wheel installed; its bin/ folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q",
                    "--disable-pip-version-check", "-w", str(tmp / "dist")],
                   check=True, timeout=300, cwd=tmp)
    wheel = next((tmp / "dist").glob("fsdp_conformance-*.whl"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True
                          ).stdout.strip()
    (Path(site) / "zz_outer_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "-q",
                    "--disable-pip-version-check", str(wheel)], check=True, timeout=300)
    where = subprocess.run([str(py), "-c", "import fsdp_conformance; print("
                            "fsdp_conformance.__file__)"], check=True, capture_output=True,
                           text=True, cwd=tmp).stdout.strip()
    assert where.startswith(site), f"fsdp_conformance came from {where}, not the wheel"
    return venv / "bin"


def _run(args, cwd, timeout=600):
    env = env_for_subprocess()
    env.pop("PYTHONPATH", None)
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_installed_command_runs_the_conformance_run_with_its_shipped_fixtures(installed,
                                                                                    tmp_path):
    v = _run([str(installed / "fsdp-conformance"), "--version"], tmp_path)
    assert v.returncode == 0 and v.stdout.startswith("fsdp-conformance 0.1.0"), v.stdout
    import torch  # the version names the torch the command sees

    assert f"(torch {torch.__version__}, Python " in v.stdout, v.stdout
    p = _run([str(installed / "fsdp-conformance"), "run", "-k", "fsdp2.sharded and golden",
              "--bounds", "off", "--out", "r.json"], tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    p12 = [c["properties"]["P12"]["status"] for c in report["cases"]]
    assert p12 and all(s in ("pass", "known") for s in p12), p12
    assert "pass" in p12
    assert not (tmp_path / ".gate-venvs").exists()


def test_a_users_trainer_test_passes_under_plain_pytest_in_their_own_folder(installed,
                                                                            tmp_path):
    project = tmp_path / "project"
    (project / "examples").mkdir(parents=True)
    (project / "examples" / "__init__.py").write_text("")
    for name in ("fsdp2_trainer.py", "test_fsdp2_trainer.py"):
        shutil.copy(ROOT / "examples" / name, project / "examples" / name)
    p = _run([str(installed / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
              "examples/test_fsdp2_trainer.py", "-k", "not 2x2"], project)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "3 passed" in p.stdout, p.stdout[-2000:]
