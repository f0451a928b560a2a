"""scripts/archscan.py counts each structure figure right on tiny synthetic package trees:
top-level modules, largest module, import cycles (function-level imports count, __init__
re-exports do not make cycles), private imports across modules/packages, function-level
imports; the redesign figures 7-12 (path-name literals outside the path modules, package pairs
importing each other, function-level imports per package, Case fields, places a property is
implemented, property numbers outside the catalogue); and its CLI prints text and JSON."""
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


# --------------------------------------------------------------------------- figures 7-12

REGISTRY_SRC = """
    from dataclasses import dataclass
    @dataclass(frozen=True, kw_only=True)
    class ApiPath:
        name: str
        module: str
    PATHS = (
        ApiPath(name="fam.one", module="one_paths"),
        ApiPath(name="fam.two", module="more.two"),
    )
    NAMES = ("fam.one", "fam.two")                   # the registry itself: not counted
    """


def test_path_name_literals_outside_path_modules(tmp_path):
    root = make_tree(tmp_path, {
        "__init__.py": "",
        "sut/__init__.py": "",
        "api_paths.py": REGISTRY_SRC,
        "sut/one_paths.py": 'A = "fam.one"\nB = "fam.one/x"\n',   # path module: apart
        "sut/more/__init__.py": "",
        "sut/more/two.py": 'C = "fam.two"\n',                       # path module: apart
        "sut/paths.py": 'D = "fam.two"\n',          # not a path module here: counted
        "known/__init__.py": "",
        "known/entries.py": 'E = ["fam.one", "fam.two"]\n',         # excluded
        "run.py": '''
            """fam.one is named in this docstring: no (not the whole constant)."""
            def f(api):
                if api == "fam.one":                                # 1
                    return f"fam.two/{api}"                         # 1 (f-string part)
                return ["fam.onex", "xfam.one", "fam.one.", "fam"]  # 0
            ''',
    })
    pl = figures(root)["path_name_literals"]
    assert pl["path_names"] == ["fam.one", "fam.two"]
    assert pl["path_names_from"] == "api_paths.py"
    assert pl["count"] == 3
    assert pl["files"] == [{"path": "run.py", "count": 2}, {"path": "sut/paths.py", "count": 1}]
    assert pl["in_path_modules"] == 3
    assert pl["path_modules"] == [{"path": "sut/more/two.py", "count": 1},
                                  {"path": "sut/one_paths.py", "count": 2}]
    assert pl["sut_paths_py"] == {"count": 1, "excluded": False}
    assert pl["excluded"] == ["api_paths.py", "known/entries.py", "sut/more/two.py",
                              "sut/one_paths.py"]


def test_path_name_literals_sut_paths_is_a_path_module_and_no_registry(tmp_path):
    root = make_tree(tmp_path, {
        "__init__.py": "", "sut/__init__.py": "",
        "api_paths.py": 'P = (ApiPath(name="x.a", module="paths"),)\n',
        "sut/paths.py": 'A = "x.a"\n', "m.py": 'B = "x.a"\n'})
    pl = figures(root)["path_name_literals"]
    assert (pl["count"], pl["in_path_modules"]) == (1, 1)
    assert pl["sut_paths_py"] == {"count": 1, "excluded": True}
    empty = figures(make_tree(tmp_path, {"__init__.py": "", "m.py": 'B = "x.a"\n'}, "other"))
    assert empty["path_name_literals"]["count"] == 0
    assert empty["path_name_literals"]["path_names_from"] == "none found"
    assert empty["path_name_literals"]["sut_paths_py"] is None


def test_package_pairs_importing_each_other(tmp_path):
    root = make_tree(tmp_path, {
        "__init__.py": "",
        "cases.py": "from .c.x import y\n",
        "a/__init__.py": "",
        "a/m.py": "from ..b import n\n",                      # a -> b (b/__init__)
        "a/deep/__init__.py": "",
        "a/deep/k.py": "def f():\n    from ...b.n import z\n",  # a -> b, in a function
        "b/__init__.py": "",
        "b/n.py": "def g():\n    import pkg.a.m\n",          # b -> a, in a function
        "c/__init__.py": "",
        "c/x.py": "from .. import cases\n",                   # c -> <top>
        "d/__init__.py": "", "d/o.py": "from ..a import m\n",  # d -> a only: no pair
    })
    mp = figures(root)["package_mutual_imports"]
    assert mp["count"] == 1
    p = mp["pairs"][0]
    assert (p["a"], p["b"]) == ("a", "b")
    assert p["a_to_b"]["imports"] == 2
    assert p["a_to_b"]["site"] == "a/deep/k.py:2"
    assert p["b_to_a"] == {"imports": 1, "site": "b/n.py:2", "importer": "pkg.b.n",
                           "imported": "pkg.a.m"}
    assert mp["with_top_count"] == 1
    t = mp["with_top"][0]
    assert (t["a"], t["b"]) == ("<top>", "c")
    assert t["a_to_b"]["site"] == "cases.py:1" and t["b_to_a"]["site"] == "c/x.py:1"


def test_function_imports_by_package(tmp_path):
    root = make_tree(tmp_path, {
        "__init__.py": "",
        "top.py": "def f():\n    from . import top\n",
        "a/__init__.py": "", "a/m.py": "def f():\n    from ..a import m\n    import json\n",
        "a/sub/__init__.py": "", "a/sub/q.py": "def f():\n    from .. import m\n",
        "b/__init__.py": "", "b/n.py": "def f():\n    import pkg.a\n",
    })
    r = figures(root)
    assert r["function_imports"]["count"] == 4
    assert r["function_imports_by_package"] == [
        {"package": "a", "count": 2}, {"package": "<top>", "count": 1},
        {"package": "b", "count": 1}]


def test_case_fields(tmp_path):
    root = make_tree(tmp_path, {
        "__init__.py": "",
        "cases.py": """
            import dataclasses
            from typing import ClassVar
            @dataclasses.dataclass(kw_only=True)
            class Case:
                '''doc'''
                model: str = "mlp"
                world_size: int = 2
                api: str
                KINDS: ClassVar[tuple] = ()
                x = 1
                def f(self) -> int:
                    y: int = 1
                    return y
            """,
    })
    cf = figures(root)["case_fields"]
    assert cf["count"] == 3 and cf["fields"] == ["model", "world_size", "api"]
    assert (cf["dataclass"], cf["kw_only"], cf["frozen"]) == (True, True, False)
    other = make_tree(tmp_path, {"__init__.py": "", "sub/__init__.py": "",
                                 "sub/c.py": "from dataclasses import dataclass\n"
                                             "@dataclass(frozen=True, kw_only=False)\n"
                                             "class Case:\n    a: int\n"}, "other")
    cf = figures(other)["case_fields"]
    assert (cf["path"], cf["count"], cf["kw_only"], cf["frozen"]) == ("sub/c.py", 1, False, True)
    assert figures(make_tree(tmp_path, {"__init__.py": ""}, "none"))["case_fields"] is None
    split = make_tree(tmp_path, {"__init__.py": "", "cases.py": """
            from dataclasses import dataclass
            @dataclass(frozen=True, kw_only=True)
            class Axes:
                a: int = 1
                b: int = 2
            @dataclass(frozen=True, kw_only=True)
            class Case(Axes):
                fault: str = ""
            """}, "split")
    cf = figures(split)["case_fields"]
    assert cf["fields"] == ["a", "b", "fault"] and cf["bases"] == [("Axes", 2)]


def test_property_places(tmp_path):
    root = make_tree(tmp_path, {
        "__init__.py": "",
        "props/__init__.py": "",
        "props/one.py": ("def p3_x(): pass\ndef p10_y(): pass\ndef p1(): pass\n"
                         "def _p7_private(): pass\ndef __p7_dunder(): pass\n"),
        "props/two.py": """
            class K:
                def p3_x(self): pass
            def helper():
                def p15_inner(): pass
            def P3_upper(): pass
            def p16_none(): pass
            """,
    })
    pp = figures(root)["property_places"]
    assert pp["counts"]["P3"] == 2
    assert pp["places"]["P3"] == ["props/one.py:p3_x", "props/two.py:K.p3_x"]
    assert pp["counts"]["P1"] == 0 and pp["counts"]["P10"] == 1
    assert pp["places"]["P15"] == ["props/two.py:helper.p15_inner"]
    assert pp["places"]["P7"] == ["props/one.py:_p7_private"]  # a private one counts too
    assert pp["multiple"] == ["P3"] and pp["total"] == 5
    assert list(pp["counts"]) == [f"P{i}" for i in range(16)]


def test_property_numbers_outside_catalogue(tmp_path):
    root = make_tree(tmp_path, {
        "__init__.py": "",
        "properties/__init__.py": "",
        "properties/catalogue.py": 'PROPS = tuple(f"P{i}" for i in range(16))\nX = "P3"\n',
        "a.py": """
            ALL = tuple(f"P{i}" for i in range(16))        # 1 (the "P" part is not one)
            RT = [f"P{i}" for i in range(0, 12)]           # 1
            OTHER = range(15), range(1, 16)                # 0
            KEYS = {"P3": 1, "P12": 2}                     # 2
            NOT = ["P", "P123", "P3 load", "p3", "xP3"]    # 0
            """,
        "b.py": 'def f(p):\n    return p == "P0"\n',         # 1
    })
    pn = figures(root)["property_numbers_outside_catalogue"]
    assert pn["count"] == 5
    assert (pn["range16"], pn["range12"], pn["literals"]) == (1, 1, 3)
    assert pn["files"] == [
        {"path": "a.py", "count": 4, "range16": 1, "range12": 1, "literals": 2},
        {"path": "b.py", "count": 1, "range16": 0, "range12": 0, "literals": 1}]


def test_cli_prints_figures_7_to_12(tmp_path, capsys):
    root = make_tree(tmp_path, {
        "__init__.py": "", "sut/__init__.py": "",
        "api_paths.py": 'P = (ApiPath(name="x.a", module="paths"),)\n',
        "sut/paths.py": 'A = "x.a"\n', "m.py": 'B = "x.a/1"\n',
        "cases.py": "from dataclasses import dataclass\n@dataclass\nclass Case:\n    a: int\n",
        "p/__init__.py": "", "p/q.py": "def p2_a(): pass\ndef p2_b(): pass\n"})
    assert archscan.main(["--package", str(root), "--no-import", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    for key in ("path_name_literals", "package_mutual_imports", "function_imports_by_package",
                "case_fields", "property_places", "property_numbers_outside_catalogue"):
        assert key in r
    assert archscan.main(["--package", str(root), "--no-import"]) == 0
    out = capsys.readouterr().out
    assert "7. path-name literals outside the path modules" in out and ": 1 in 1 files" in out
    assert "in path modules: 1  (sut/paths.py 1)" in out
    assert "8. package pairs importing each other" in out
    assert "9. import statements inside functions" in out
    assert "10. Case fields: 1  (cases.py:3; @dataclass kw_only=False frozen=False)" in out
    assert "P2: 2 (p/q.py:p2_a, p/q.py:p2_b)" in out
    assert "12. property numbers written outside properties/catalogue.py: 0" in out


def test_the_package_names_paths_only_in_their_records_modules_and_known_entries():
    """An API path's name is written in its registry record, its own module and the known
    limitations' predicates, nowhere else: every other place asks the record
    (api_paths.py). A literal anywhere else fails here with its file."""
    package = SCRIPT.parents[1] / "fsdp_conformance"
    lit = figures(package)["path_name_literals"]
    assert lit["path_names_from"] == "api_paths.py" and len(lit["path_names"]) >= 10
    assert lit["count"] == 0, f"path names written outside the path modules: {lit['files']}"


def test_the_package_has_no_import_circle_and_no_two_packages_import_each_other():
    """The floors hold (issue 44): no module imports one that imports it back (at any depth),
    and no package imports one that imports it; a change that adds either fails here, before
    a layering diagram goes stale."""
    found = archscan.scan(SCRIPT.parents[1] / "fsdp_conformance", with_import=False)
    assert found["import_cycles"]["count"] == 0, found["import_cycles"]["cycles"]
    pairs = found["package_mutual_imports"]
    assert pairs["count"] == 0, pairs
