"""The command line says its version (a conventional CLI: issue 35)."""
from __future__ import annotations

import pytest

from fsdp_conformance import __version__
from fsdp_conformance.cli import main


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    import platform
    from importlib import metadata

    out = capsys.readouterr().out.strip()  # and the torch and Python it runs with
    assert out.startswith(f"fsdp-conformance {__version__} (torch {metadata.version('torch')}, "
                          f"Python {platform.python_version()}, "), out
