"""The package's public face is light: ``import fsdp_conformance``, importing the pytest plugin
and a pytest session that loads it (and uses none of its fixtures) import no torch; every
public name still resolves, lazily, and the documented old paths are the same objects."""
from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

import fsdp_conformance
from fsdp_conformance import user
from suites.conftest import PYTHON, ROOT, env_for_subprocess


def _env() -> dict:
    env = env_for_subprocess()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _loaded_after(statement: str) -> dict:
    code = ("import json, sys\n" + statement + "\n"
            "print(json.dumps({'torch': 'torch' in sys.modules,"
            " 'fsdp': sorted(m for m in sys.modules if m.startswith('fsdp_conformance'))}))")
    p = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("statement", [
    "import fsdp_conformance",
    "import fsdp_conformance.plugin",
    "import fsdp_conformance.user",
    "from fsdp_conformance import __version__, __all__",
])
def test_import_does_not_load_torch(statement):
    got = _loaded_after(statement)
    assert not got["torch"], got
    assert "fsdp_conformance.harness" not in got["fsdp"], got


def test_a_pytest_session_loading_the_plugin_does_not_load_torch(tmp_path):
    (tmp_path / "test_probe.py").write_text(textwrap.dedent("""
        import sys

        def test_plugin_loaded_without_torch(request):
            assert request.config.pluginmanager.has_plugin("fsdp_conformance.plugin")
            assert request.config.getoption("fsdp_tier") is None  # the plugin's option
            assert "torch" not in sys.modules, "loading the plugin imported torch"
    """))
    env = {**_env(), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # only this plugin, explicitly
    for extra in (["--co", "-q"], ["-q"]):
        p = subprocess.run([PYTHON, "-m", "pytest", "-p", "fsdp_conformance.plugin",
                            "-p", "no:cacheprovider", "--rootdir", str(tmp_path), *extra,
                            str(tmp_path / "test_probe.py")],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "1 passed" in p.stdout


def test_every_public_name_resolves():
    for mod in (fsdp_conformance, user):
        assert mod.__all__ and len(set(mod.__all__)) == len(mod.__all__)
        for name in mod.__all__:
            assert getattr(mod, name) is not None, name
        assert set(mod.__all__) <= set(dir(mod))
    with pytest.raises(AttributeError):
        fsdp_conformance.no_such_name  # noqa: B018
    from fsdp_conformance import Case, CaseResult, Verdict, check, load_report
    from fsdp_conformance.cases import Case as case_cls
    from fsdp_conformance.properties.verdict import Verdict as verdict_cls
    from fsdp_conformance.report.result import CaseResult as result_cls
    from fsdp_conformance.report.run_report import load_report as loader
    assert (Case, CaseResult, Verdict, load_report) == (case_cls, result_cls, verdict_cls, loader)
    assert check is user.check


def test_submodules_keep_their_names_next_to_the_lazy_exports():
    """``from fsdp_conformance import <subpackage>`` still gives the package, next to the
    lazily exported functions (``convert`` is the reshard conversion, not a module)."""
    from fsdp_conformance import convert, run, reshard

    assert run.__name__ == "fsdp_conformance.run"
    assert convert is reshard.convert


def test_documented_old_paths_are_the_same_objects():
    from fsdp_conformance import roundtrip, strategies, unittest_support
    from fsdp_conformance.user import driver
    from fsdp_conformance.user import strategies as user_strategies
    from fsdp_conformance.user import unittest_support as user_unittest

    assert roundtrip.check is driver.check is fsdp_conformance.check
    assert strategies.cases is user_strategies.cases
    assert strategies.fsdp_settings is user_strategies.fsdp_settings
    assert unittest_support.FSDPTestCase is user_unittest.FSDPTestCase
