"""scripts/archscan.py counts each structure figure right on tiny synthetic package trees:
top-level modules, largest module, import cycles (function-level imports count, __init__
re-exports do not make cycles), private imports across modules/packages, function-level
imports; and its CLI prints text and JSON."""
from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "archscan.py"


def _load():
    spec = importlib.util.spec_from_file_location("archscan", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["archscan"] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


archscan = _load()


def make_tree(tmp_path: Path, files: dict[str, str], name: str = "pkg") -> Path:
    """Write ``files`` (path relative to the package -> source) under tmp_path/name."""
    root = tmp_path / name
    for rel, src in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(src))
    return root


def figures(root: Path) -> dict:
    return archscan.scan(root, with_import=False)


def test_top_level_count_excludes_init_main_and_subpackages(tmp_path):
    root = make_tree(tmp_path, {"__init__.py": "", "__main__.py": "", "a.py": "", "b.py": "",
                                "sub/__init__.py": "", "sub/c.py": "", "notes.txt": ""})
    r = figures(root)
    assert r["top_level_modules"] == {"count": 2, "names": ["a.py", "b.py"]}
    assert r["modules_total"] == 6


def test_largest_module_and_over_600(tmp_path):
    root = make_tree(tmp_path, {"__init__.py": "", "small.py": "x = 1\n" * 10,
                                "sub/__init__.py": "", "sub/big.py": "x = 1\n" * 700,
                                "mid.py": "x = 1\n" * 601, "edge.py": "x = 1\n" * 600})
    r = figures(root)
    assert r["largest_module"] == {"path": "sub/big.py", "lines": 700}
    assert r["modules_over_600_lines"] == [{"path": "sub/big.py", "lines": 700},
                                           {"path": "mid.py", "lines": 601}]


def test_cycle_through_function_level_import(tmp_path):
    root = make_tree(tmp_path, {
        "__init__.py": "",
        "runner.py": """
            def run():
                from .fix.golden import g
                return g
            """,
        "fix/__init__.py": "",
        "fix/golden.py": """
            def g():
                from ..runner import _sut, PROPS
            """,
        "other.py": "from . import runner\n",
    })
    c = figures(root)["import_cycles"]
    assert c["count"] == 1
    assert c["cycles"][0]["members"] == ["pkg.fix.golden", "pkg.runner"]
    assert ["pkg.runner", "pkg.fix.golden"] in c["cycles"][0]["edges"]


def test_two_separate_cycles_and_a_self_import(tmp_path):
    root = make_tree(tmp_path, {
        "__init__.py": "", "a.py": "from . import b\n", "b.py": "from .a import x\n",
        "c.py": "import pkg.d\n", "d.py": "def f():\n    import pkg.c\n",
        "e.py": "from .e import y\n", "f.py": "from . import a\n",
    })
    c = figures(root)["import_cycles"]
    assert [x["members"] for x in c["cycles"]] == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"],
                                                   ["pkg.e"]]


def test_init_reexport_is_not_a_cycle(tmp_path):
    # harness/__init__ re-exports from pool; pool imports a sibling and the top package's
    # submodule -- none of that is a cycle (the parent __init__ is not an implied edge)
    root = make_tree(tmp_path, {
        "__init__.py": "from .harness import get_pool\n",
        "harness/__init__.py": "from .pool import get_pool\nfrom . import errors\n",
        "harness/pool.py": "from .errors import E\nfrom ..util import h\nimport pkg.harness.errors\n",
        "harness/errors.py": "class E(Exception): pass\n",
        "util.py": "def h(): pass\n",
    })
    r = figures(root)
    assert r["import_cycles"] == {"count": 0, "cycles": []}


def test_import_of_the_package_init_itself_is_a_cycle(tmp_path):
    # but a real loop through an __init__ is found: pool takes a name from harness/__init__
    root = make_tree(tmp_path, {
        "__init__.py": "",
        "harness/__init__.py": "from .pool import get_pool\nX = 1\n",
        "harness/pool.py": "from . import X\ndef get_pool(): pass\n",
    })
    c = figures(root)["import_cycles"]
    assert [x["members"] for x in c["cycles"]] == [["pkg.harness", "pkg.harness.pool"]]


def test_from_package_import_submodule_targets_the_submodule(tmp_path):
    root = make_tree(tmp_path, {"__init__.py": "", "sub/__init__.py": "", "sub/m.py": "",
                                "a.py": "from .sub import m\nfrom . import sub\n"})
    mods = archscan.load_modules(root)
    g = archscan.import_graph(mods)
    assert g["pkg.a"] == {"pkg.sub.m", "pkg.sub"}


def test_private_imports_cross_module_and_cross_package(tmp_path):
    root = make_tree(tmp_path, {
        "__init__.py": "",
        "report/__init__.py": "_hidden = 1\n",
        "report/html.py": "_CSS = ''\ndef _e(): pass\n__all__ = []\n",
        "report/run.py": "from .html import _CSS\n",                # same package
        "bench/__init__.py": "",
        "bench/plots.py": """
            from ..report.html import _CSS, _e, __all__, public     # cross-package: 2
            from ..report import _hidden                            # cross-package: 1
            def f():
                from torch.x import _private_fn                     # external: 1
                from torch._sub import public_fn                    # private module: no
            """,
        "top.py": "from .bench.plots import _x\nfrom .top import _self\n",  # 1 cross-pkg
        "top2.py": "from .top import _y\n",                         # cross-module, same dir
    })
    p = figures(root)["private_imports"]
    assert p["cross_package"] == 4
    assert p["cross_module_internal"] == 6
    assert p["cross_module_external"] == 1
    assert p["cross_module"] == 7
    names = {(i["importer"], i["name"]): i for i in p["items"]}
    assert not names[("pkg.report.run", "_CSS")]["cross_package"]
    assert names[("pkg.bench.plots", "_CSS")]["cross_package"]
    assert names[("pkg.bench.plots", "_private_fn")]["external"]
    assert ("pkg.bench.plots", "__all__") not in names
    assert ("pkg.top", "_self") not in names


def test_function_level_imports(tmp_path):
    root = make_tree(tmp_path, {
        "__init__.py": "",
        "a.py": """
            import os                      # module level: no
            from . import b                # module level: no
            try:
                from . import c            # module level in a try: no
            except ImportError:
                pass
            class K:
                from . import b as bb      # class body: no
                def m(self):
                    from .b import x, y    # method: 1 internal
                    import json            # 1 external
            def f():
                def g():
                    if True:
                        import pkg.c       # nested: 1 internal
                return g
            async def h():
                from rich import print     # 1 external
            """,
        "b.py": "", "c.py": "",
    })
    f = figures(root)["function_imports"]
    assert f == {"count": 2, "all_statements": 4, "external": 2}


def test_parse_importtime():
    err = ("import time: self [us] | cumulative | imported package\n"
           "import time:       120 |        120 |   pkg.plugin.helpers\n"
           "import time:      3000 |      45678 | pkg.plugin\n")
    assert archscan.parse_importtime(err, "pkg.plugin") == 45678
    assert archscan.parse_importtime(err, "pkg") is None


def test_cli_text_and_json(tmp_path, capsys):
    root = make_tree(tmp_path, {"__init__.py": "", "a.py": "def f():\n    from . import b\n",
                                "b.py": "from .a import f\n"})
    assert archscan.main(["--package", str(root), "--no-import", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["import_cycles"]["count"] == 1
    assert "import_cost" not in r
    assert archscan.main(["--package", str(root), "--no-import"]) == 0
    out = capsys.readouterr().out
    assert "1. top-level modules" in out and ": 2" in out
    assert "pkg.a, pkg.b" in out
    with pytest.raises(SystemExit):
        archscan.main(["--package", str(tmp_path / "nope"), "--no-import"])


def test_import_cost_on_a_tiny_package(tmp_path):
    root = make_tree(tmp_path, {"__init__.py": "", "plugin.py": "import json\n"},
                     name="tinypkg_archscan")
    ic = archscan.import_cost(root)
    assert ic["error"] is None
    assert isinstance(ic["plugin_import_us"], int) and ic["plugin_import_us"] >= 0
    assert ic["torch_after_package"] is False and ic["torch_after_plugin"] is False
