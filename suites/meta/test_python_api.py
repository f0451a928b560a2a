"""The public face is small and written down (hypothesis's rule: ``__all__`` equals the
public set): docs/reference/python-api.md names exactly ``fsdp_conformance.__all__`` (but
``__version__``), and the public modules it lists each import without error and have an
``__all__`` whose every name exists. Everything else is internal."""
from __future__ import annotations

import importlib
import re

import fsdp_conformance
from suites.conftest import ROOT

PAGE = ROOT / "docs" / "reference" / "python-api.md"


def _first_cells(section: str) -> set[str]:
    """The backticked names in the first cell of every table row of ``section``."""
    names = set()
    for line in section.splitlines():
        m = re.match(r"^\|\s*`([\w.]+)`\s*\|", line)
        if m:
            names.add(m.group(1))
    return names


def _sections() -> tuple[str, str]:
    text = PAGE.read_text()
    top, _, modules = text.partition("## Public modules")
    return top.partition("## `fsdp_conformance`")[2], modules


def test_the_page_names_exactly_the_packages_all():
    top, _ = _sections()
    public = set(fsdp_conformance.__all__) - {"__version__"}
    named = _first_cells(top)
    assert named == public, (f"on the page, not in __all__: {sorted(named - public)}; "
                             f"in __all__, not on the page: {sorted(public - named)}")


def test_every_public_module_imports_and_its_all_names_what_it_has():
    _, modules = _sections()
    listed = _first_cells(modules)
    assert "fsdp_conformance.reference" in listed and len(listed) >= 5, listed
    for name in sorted(listed):
        mod = importlib.import_module(name)
        names = getattr(mod, "__all__", None)
        assert names, f"{name} has no __all__"
        missing = [n for n in names if not hasattr(mod, n)]
        assert not missing, f"{name}.__all__ names what it does not have: {missing}"


def test_the_reproducer_scripts_import_only_the_public_face():
    """What a failure hands the user to run (``user.failures.reproducer``) imports only the
    names this page calls public."""
    from fsdp_conformance.cases import Case
    from fsdp_conformance.user.failures import reproducer

    script = reproducer(Case(api="fsdp1.full"))
    imports = [ln for ln in script.splitlines() if ln.startswith(("from ", "import "))]
    assert imports == ["from fsdp_conformance import Case",
                       "from fsdp_conformance.roundtrip import CustomPath, Ref, UserModel, "
                       "reproduce"], imports
    _, modules = _sections()
    assert "fsdp_conformance.roundtrip" in _first_cells(modules)
    compile(script, "reproducer.py", "exec")
