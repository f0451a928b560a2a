#!/usr/bin/env python3
"""Structure figures of a Python package, each re-measurable by running this script.

    python scripts/archscan.py                 # text report on ../fsdp_conformance
    python scripts/archscan.py --json          # the same figures, machine-readable
    python scripts/archscan.py --package PATH  # scan another package directory
    python scripts/archscan.py --no-import     # skip figure 6 (it imports the package)

Figures 1-5 and 7-12 are a static AST scan (nothing is imported); figure 6 runs two
subprocesses.
Definitions (each function below states its rule in full):

1. top-level modules: ``*.py`` files directly in the package directory, not counting
   ``__init__.py`` and ``__main__.py`` (subpackages are not modules here).
2. module size: lines of every ``.py`` file at any depth (``wc -l``); the largest, and every
   module over 600 lines.
3. import cycles: strongly connected components (size > 1, or a module importing itself)
   of the internal import graph, imports at any depth counted.
4. private imports: ``from X import _name`` (not dunder) with X another module; counted
   across modules (own + external X) and, separately, across packages (own X in another
   directory).
5. imports inside functions: ``import``/``from`` statements inside a function body that
   import the package's own modules (all such statements reported too).
6. import cost: cumulative microseconds of ``import <pkg>.plugin`` under ``-X importtime``
   and whether ``torch`` is in ``sys.modules`` after ``import <pkg>`` / ``import <pkg>.plugin``.

Figures 7-12 (static too) are the ones an architecture redesign is measured by, before ->
after; "package" there is a direct subdirectory of the scanned package, the files directly in
it being the pseudo-package ``<top>``:

7. path-name literals (JSON ``path_name_literals``): string constants equal to a registered
   API path name (``ApiPath(name=...)`` in ``api_paths.py``, read by AST) or starting
   with one followed by ``/``, per file, outside the path modules (their ``module=``),
   ``api_paths.py`` and ``known/entries.py``; the path modules' own count apart.
8. package pairs importing each other (``package_mutual_imports``), imports at any depth,
   with one import site each way; pairs with ``<top>`` apart.
9. figure 5's function-level imports of the package's own modules per importing package
   (``function_imports_by_package``).
10. ``Case`` fields (``case_fields``): annotated assignments in the dataclass body of
   ``cases.py``'s ``Case``, and its ``kw_only`` / ``frozen`` flags.
11. places a property is implemented (``property_places``): functions named ``p<N>_*`` (or
    ``_p<N>_*``),
   N = 0..15, per property.
12. property numbers outside ``properties/catalogue.py``
   (``property_numbers_outside_catalogue``): ``range(16)``, ``range(12)`` and ``"P<n>"``
   string literals, per file.

Stdlib only.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

BIG_MODULE_LINES = 600
NOT_COUNTED_TOP = ("__init__.py", "__main__.py")


# --------------------------------------------------------------------------- the module set

@dataclass
class Module:
    """One ``.py`` file of the scanned package."""
    name: str            # dotted name, e.g. "pkg.report.diff"; a package's __init__ is "pkg.report"
    path: Path
    package: str         # dotted name of the directory (package) the file lies in
    is_init: bool
    lines: int
    tree: ast.Module = field(repr=False)


def module_name(root: Path, path: Path) -> tuple[str, str, bool]:
    """(dotted module name, dotted package name, is __init__) of ``path`` under package ``root``.

    Rule: the name is the path relative to the parent of ``root`` with ``/`` as ``.``;
    ``pkg/sub/__init__.py`` is the module ``pkg.sub``; the package of a file is the directory
    it lies in (so ``pkg.sub``'s own package is ``pkg.sub``)."""
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    is_init = parts[-1] == "__init__"
    if is_init:
        parts = parts[:-1]
        return ".".join(parts), ".".join(parts), True
    return ".".join(parts), ".".join(parts[:-1]), False


def count_lines(text: str) -> int:
    """Line count as ``wc -l`` gives it: the number of newline characters."""
    return text.count("\n")


def load_modules(root: Path) -> dict[str, Module]:
    """Every ``.py`` file under ``root`` (any depth, ``__pycache__`` skipped), parsed."""
    mods: dict[str, Module] = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        name, package, is_init = module_name(root, path)
        mods[name] = Module(name, path, package, is_init, count_lines(text),
                            ast.parse(text, filename=str(path)))
    return mods


# --------------------------------------------------------------------------- import walking

@dataclass
class ImportSite:
    """One import statement and where it sits."""
    node: ast.Import | ast.ImportFrom
    in_function: bool


def import_sites(tree: ast.Module) -> Iterator[ImportSite]:
    """Every ``import``/``from ... import`` statement at any depth, with whether it lies
    inside a function (``def``/``async def``/``lambda``, at any nesting: a method, a nested
    function, an ``if`` or ``try`` inside a function). Class bodies and module-level
    ``if``/``try`` blocks are not functions."""
    def walk(node: ast.AST, in_fn: bool) -> Iterator[ImportSite]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield ImportSite(child, in_fn)
            fn = in_fn or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from walk(child, fn)
    yield from walk(tree, False)


def resolve_from_base(mod: Module, node: ast.ImportFrom) -> str | None:
    """The absolute dotted name of ``X`` in ``from X import ...`` as written in ``mod``.

    Rule: level 0 is ``X`` itself; level n is the importing module's package (for an
    ``__init__`` that is the package itself) with n-1 trailing parts dropped, then ``.X``
    appended. None when the relative import climbs above the top."""
    if node.level == 0:
        return node.module
    base = mod.package.split(".")
    drop = node.level - 1
    if drop >= len(base):
        return None
    base = base[: len(base) - drop]
    if node.module:
        base += node.module.split(".")
    return ".".join(base)


def nearest_module(name: str, mods: dict[str, Module]) -> str | None:
    """``name`` if it is a scanned module, else its longest dotted prefix that is one."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in mods:
            return cand
        parts.pop()
    return None


def import_targets(mod: Module, node: ast.Import | ast.ImportFrom,
                   mods: dict[str, Module]) -> list[str]:
    """The scanned modules one import statement in ``mod`` depends on (the graph's edges).

    Rules:
    - ``import a.b.c``: the module ``a.b.c`` (or its longest prefix that is a module).
      Parent packages' ``__init__`` files, which Python also runs, are *not* edges: counting
      them would make every ``pkg/__init__`` that imports its own submodule a cycle with
      each submodule that imports anything from ``pkg``.
    - ``from X import n``: ``X.n`` when that is a submodule, else ``X`` (a module, or a
      package's ``__init__``); one edge per name.
    - ``from X import *``: ``X``.
    - Imports of anything outside the scanned package give no edge."""
    out: list[str] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            t = nearest_module(alias.name, mods)
            if t:
                out.append(t)
        return out
    base = resolve_from_base(mod, node)
    if base is None:
        return out
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if alias.name != "*" and sub in mods:
            out.append(sub)
        elif base in mods:
            out.append(base)
        else:
            t = nearest_module(base, mods)
            if t:
                out.append(t)
    return out


# --------------------------------------------------------------------------- figures 1-2

def top_level_modules(root: Path) -> list[str]:
    """Figure 1. File names of the ``*.py`` files directly in ``root``, excluding
    ``__init__.py`` and ``__main__.py`` (package plumbing, not modules of their own);
    subpackages are not counted."""
    return sorted(p.name for p in root.glob("*.py") if p.name not in NOT_COUNTED_TOP)


def module_sizes(mods: dict[str, Module], root: Path) -> list[tuple[str, int]]:
    """Figure 2. (path relative to ``root``, line count) of every ``.py`` file at any depth,
    largest first (ties by path). Lines are ``wc -l`` lines."""
    rows = [(m.path.relative_to(root).as_posix(), m.lines) for m in mods.values()]
    return sorted(rows, key=lambda r: (-r[1], r[0]))


# --------------------------------------------------------------------------- figure 3

def import_graph(mods: dict[str, Module]) -> dict[str, set[str]]:
    """Internal import graph: module -> the modules it imports (``import_targets``), from
    imports at any depth (module level and inside functions alike)."""
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for m in mods.values():
        for site in import_sites(m.tree):
            graph[m.name].update(import_targets(m, site.node, mods))
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    comps: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(sorted(comp))
    return sorted(comps)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Figure 3. The import cycles: strongly connected components of ``import_graph`` with
    more than one member, plus any module that imports itself. One cycle per component,
    however many distinct loops run through it."""
    return [c for c in strongly_connected(graph)
            if len(c) > 1 or c[0] in graph.get(c[0], ())]


def cycle_edges(graph: dict[str, set[str]], comp: list[str]) -> list[tuple[str, str]]:
    """The import edges that stay inside one component (what makes it a cycle)."""
    members = set(comp)
    return sorted((a, b) for a in comp for b in graph[a] if b in members)


# --------------------------------------------------------------------------- figure 4

@dataclass
class PrivateImport:
    importer: str      # module doing the import
    source: str        # module (or package __init__) the name comes from, or the external name
    name: str
    line: int
    external: bool     # X is outside the scanned package (torch, ...)
    cross_package: bool


def is_private(name: str) -> bool:
    """A ``_private`` name: one leading underscore, not a dunder (``__all__``, ``__version__``)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(mods: dict[str, Module]) -> list[PrivateImport]:
    """Figure 4. Each name ``_n`` (``is_private``) in ``from X import _n`` at any depth where
    X is a module other than the importing one. One entry per imported name. ``X`` is the
    module named in the statement (``from .pkg import _n`` takes ``_n`` from
    ``pkg/__init__``; a private *submodule* ``from . import _m`` counts with ``_m`` as the
    name). ``import a._b`` and ``from a._b import c`` (private *modules*, public names) are
    not counted.

    - ``external``: X is not in the scanned package (``from torch... import _f``).
    - ``cross_package``: for an internal X, the importing file's directory differs from the
      directory X lives in (for a package ``__init__`` X, the package's own directory): so
      ``from .util import _h`` between siblings is cross-module only, and
      ``from ..report.html import _e`` is cross-package too. False for external X (it is
      reported apart)."""
    out: list[PrivateImport] = []
    for m in mods.values():
        for site in import_sites(m.tree):
            node = site.node
            if not isinstance(node, ast.ImportFrom):
                continue
            base = resolve_from_base(m, node)
            if base is None or base == m.name:
                continue
            src = mods.get(base)
            internal = src is not None or nearest_module(base, mods) is not None
            for alias in node.names:
                if is_private(alias.name):
                    out.append(PrivateImport(
                        m.name, base, alias.name, node.lineno, not internal,
                        src is not None and src.package != m.package))
    return sorted(out, key=lambda p: (p.importer, p.line, p.name))


# --------------------------------------------------------------------------- figure 5

def function_imports(mods: dict[str, Module]) -> list[tuple[str, int, bool]]:
    """Figure 5. (module, line, internal?) of every ``import``/``from`` *statement* inside a
    function body (``import_sites``), whatever it imports; ``internal`` says whether it
    imports a module of the scanned package (``import_targets`` non-empty, relative imports
    included). The figure is the internal ones (deferred imports of the package's own
    modules: the ones a redesign can remove); stdlib/third-party ones (lazy torch, rich,
    matplotlib) are reported apart. A statement importing several names counts once."""
    out = []
    for m in mods.values():
        for site in import_sites(m.tree):
            if site.in_function:
                out.append((m.name, site.node.lineno,
                            bool(import_targets(m, site.node, mods))))
    return sorted(out)


# --------------------------------------------------------------------------- figure 6

def _run_py(code: list[str], root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root.parent)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return subprocess.run([sys.executable, *code], capture_output=True, text=True,
                          env=env, cwd=str(root.parent), timeout=600)


def parse_importtime(stderr: str, module: str) -> int | None:
    """Cumulative microseconds of ``module`` from ``-X importtime`` output (the line
    ``import time: <self> | <cumulative> | <name>`` whose stripped name is ``module``)."""
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:"):].split("|")
        if len(parts) == 3 and parts[2].strip() == module:
            try:
                return int(parts[1].strip())
            except ValueError:
                return None
    return None


def import_cost(root: Path) -> dict[str, Any]:
    """Figure 6. ``python -X importtime -c "import <pkg>.plugin"`` in a fresh interpreter
    (this one's ``sys.executable``, the package's parent first on ``PYTHONPATH``): the
    cumulative µs of ``<pkg>.plugin``; and, in another fresh interpreter, whether ``torch``
    is in ``sys.modules`` after ``import <pkg>`` and then after ``import <pkg>.plugin``.
    One run each: the time is a single sample (a warm file cache, this machine)."""
    pkg = root.name
    r = _run_py(["-X", "importtime", "-c", f"import {pkg}.plugin"], root)
    us = parse_importtime(r.stderr, f"{pkg}.plugin")
    probe = (f"import sys, json; import {pkg}; a = 'torch' in sys.modules; "
             f"import {pkg}.plugin; b = 'torch' in sys.modules; print(json.dumps([a, b]))")
    p = _run_py(["-c", probe], root)
    torch_pkg = torch_plugin = None
    error = None
    if p.returncode == 0:
        torch_pkg, torch_plugin = json.loads(p.stdout.strip().splitlines()[-1])
    else:
        error = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
    if r.returncode != 0 and error is None:
        error = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
    return {"plugin_import_us": us, "torch_after_package": torch_pkg,
            "torch_after_plugin": torch_plugin, "python": sys.executable, "error": error}


# --------------------------------------------------------------------------- figures 7-12
#
# The figures an architecture redesign is measured by, before -> after. Each is a static AST
# scan like 1-5. "Package" in figures 8 and 9 is a *direct* subdirectory of the scanned
# package (run, golden, sut, ...): every file under ``<root>/<dir>/`` at any depth belongs
# to ``<dir>``; the files directly in the root (``cases.py``, ``__init__.py``,
# ``__main__.py``...) belong to the pseudo-package ``"<top>"``.

TOP = "<top>"
TOP_N = 10
REGISTRY = "api_paths.py"
KNOWN_ENTRIES = "known/entries.py"
CATALOGUE = "properties/catalogue.py"
CASES = "cases.py"
SUT_PATHS = "sut/paths.py"
PROPERTY_IDS = range(16)


def rel_path(m: Module, root: Path) -> str:
    """``m``'s file relative to the package directory, ``/``-separated."""
    return m.path.relative_to(root).as_posix()


def subpackage(m: Module, root: Path) -> str:
    """The direct subdirectory of ``root`` that ``m``'s file lies under, or ``"<top>"``."""
    parts = m.path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else TOP


def str_constants(tree: ast.AST) -> Iterator[ast.Constant]:
    """Every ``str`` constant node at any depth (docstrings and the literal parts of
    f-strings included)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node


def _kw_str(call: ast.Call, key: str) -> str | None:
    for kw in call.keywords:
        if kw.arg == key and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
            return kw.value.value
    return None


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def api_paths(mods: dict[str, Module], root: Path) -> tuple[list[tuple[str, str | None]], str]:
    """The registered API paths as (name, module) from the ``ApiPath(name=..., module=...)``
    calls (keyword string literals) in ``api_paths.py``, in source order, duplicates
    dropped; and where they were read. If that file has none (or is missing), every
    ``ApiPath(name=...)`` call under ``sut/`` is read instead (a redesign may move the
    records next to their modules). Nothing is imported."""
    def collect(files: list[Module]) -> list[tuple[str, str | None]]:
        out: list[tuple[str, str | None]] = []
        seen: set[str] = set()
        for m in files:
            for node in ast.walk(m.tree):
                if isinstance(node, ast.Call) and _call_name(node.func) == "ApiPath":
                    name = _kw_str(node, "name")
                    if name and name not in seen:
                        seen.add(name)
                        out.append((name, _kw_str(node, "module")))
        return out
    reg = [m for m in mods.values() if rel_path(m, root) == REGISTRY]
    found = collect(reg)
    if found:
        return found, REGISTRY
    sut = sorted((m for m in mods.values() if rel_path(m, root).startswith("sut/")),
                 key=lambda m: rel_path(m, root))
    found = collect(sut)
    return found, ("sut/ (any ApiPath call)" if found else "none found")


def path_module_files(modules: list[str | None], mods: dict[str, Module], root: Path) -> list[str]:
    """The files (relative to ``root``) of the path modules: ``module="x.y"`` is
    ``sut/x/y.py``; where it names a package (``sut/x/y/__init__.py``) every file under that
    package is the path module's."""
    files: set[str] = set()
    all_rel = {rel_path(m, root) for m in mods.values()}
    for mod in modules:
        if not mod:
            continue
        base = "sut/" + mod.replace(".", "/")
        if base + ".py" in all_rel:
            files.add(base + ".py")
        elif base + "/__init__.py" in all_rel:
            files.update(r for r in all_rel if r.startswith(base + "/"))
    return sorted(files)


def is_path_literal(s: str, names: list[str]) -> bool:
    """``s`` is a path name, or a path name followed by ``/`` and anything."""
    return any(s == n or s.startswith(n + "/") for n in names)


def path_name_literals(mods: dict[str, Module], root: Path) -> dict[str, Any]:
    """Figure 7. String constants (``str_constants``: one per constant node) equal to a
    registered API path name or starting with one followed by ``/`` (``is_path_literal``;
    names from ``api_paths``). ``count`` and ``files`` cover every module except the path
    modules (``path_module_files``), ``api_paths.py`` and ``known/entries.py`` (the known
    entries' predicates may name paths); ``in_path_modules`` counts the path modules apart,
    and ``sut_paths_py`` is ``sut/paths.py``'s own count with whether it was excluded (today
    it is the FSDP1 path module)."""
    paths, source = api_paths(mods, root)
    names = [n for n, _ in paths]
    pmods = path_module_files([m for _, m in paths], mods, root)
    excluded = set(pmods) | {REGISTRY, KNOWN_ENTRIES}
    per_file: dict[str, int] = {}
    for m in mods.values():
        n = sum(1 for c in str_constants(m.tree) if is_path_literal(c.value, names)) if names else 0
        if n:
            per_file[rel_path(m, root)] = n
    outside = {f: n for f, n in per_file.items() if f not in excluded}
    in_pm = {f: per_file.get(f, 0) for f in pmods}
    has_sut_paths = any(rel_path(m, root) == SUT_PATHS for m in mods.values())
    return {
        "count": sum(outside.values()),
        "files": [{"path": f, "count": n}
                  for f, n in sorted(outside.items(), key=lambda x: (-x[1], x[0]))],
        "in_path_modules": sum(in_pm.values()),
        "path_modules": [{"path": f, "count": n} for f, n in in_pm.items()],
        "sut_paths_py": ({"count": per_file.get(SUT_PATHS, 0),
                          "excluded": SUT_PATHS in excluded} if has_sut_paths else None),
        "excluded": sorted(excluded),
        "path_names": names,
        "path_names_from": source,
    }


def mutual_package_imports(mods: dict[str, Module], root: Path) -> dict[str, Any]:
    """Figure 8. Unordered package pairs {A, B}, A != B (``subpackage``), where a file of A
    imports a module of B and a file of B imports a module of A; imports at any depth
    (module level and inside functions), edges as ``import_targets`` gives them. Each pair
    has the number of import statements each way and the first site each way (file:line,
    by file then line). Pairs with ``"<top>"`` on one side are listed apart (``with_top``)."""
    sites: dict[tuple[str, str], list[tuple[str, int, str, str]]] = {}
    for m in mods.values():
        a = subpackage(m, root)
        for site in import_sites(m.tree):
            for t in sorted(set(import_targets(m, site.node, mods))):
                b = subpackage(mods[t], root)
                if a != b:
                    sites.setdefault((a, b), []).append(
                        (rel_path(m, root), site.node.lineno, m.name, t))
    def way(a: str, b: str) -> dict[str, Any]:
        rows = sorted(set(sites[(a, b)]))
        f, line, imp, tgt = rows[0]
        return {"imports": len({(x[0], x[1]) for x in rows}), "site": f"{f}:{line}",
                "importer": imp, "imported": tgt}

    pairs = [{"a": a, "b": b, "a_to_b": way(a, b), "b_to_a": way(b, a)}
             for (a, b) in sorted(sites) if a < b and (b, a) in sites]
    # put "<top>" first in its pairs so a reader sees it on the left
    top = []
    for p in pairs:
        if TOP in (p["a"], p["b"]):
            if p["b"] == TOP:
                p = {"a": TOP, "b": p["a"], "a_to_b": p["b_to_a"], "b_to_a": p["a_to_b"]}
            top.append(p)
    between = [p for p in pairs if TOP not in (p["a"], p["b"])]
    return {"count": len(between), "pairs": between,
            "with_top_count": len(top), "with_top": sorted(top, key=lambda p: p["b"])}


def function_imports_by_package(mods: dict[str, Module], root: Path,
                                fimps: list[tuple[str, int, bool]]) -> list[dict[str, Any]]:
    """Figure 9. Figure 5's internal function-level import statements counted per importing
    package (``subpackage``), most first (ties by name)."""
    per: dict[str, int] = {}
    for name, _line, internal in fimps:
        if internal:
            p = subpackage(mods[name], root)
            per[p] = per.get(p, 0) + 1
    return [{"package": p, "count": n} for p, n in sorted(per.items(), key=lambda x: (-x[1], x[0]))]


def _is_classvar(ann: ast.expr) -> bool:
    """``ClassVar``/``ClassVar[...]`` or the ``KW_ONLY`` sentinel (dotted or not, or as a
    string annotation): not a dataclass field."""
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        return ann.value.split("[")[0].split(".")[-1].strip() in ("ClassVar", "KW_ONLY")
    node = ann.value if isinstance(ann, ast.Subscript) else ann
    return _call_name(node) in ("ClassVar", "KW_ONLY")


def case_fields(mods: dict[str, Module], root: Path) -> dict[str, Any] | None:
    """Figure 10. The ``Case`` class of ``cases.py`` (else the first ``class Case`` anywhere
    in the package, by path): its fields (annotated assignments ``x: T`` / ``x: T = v``
    directly in the class body, ``ClassVar`` and the ``KW_ONLY`` sentinel not counted), and
    whether its ``@dataclass(...)`` decorator passes ``kw_only=True`` and ``frozen=True``
    (literal True; a bare ``@dataclass`` has neither). Fields of base classes defined in the
    same module (``class Case(Axes)``) count too, each base named with its count. None when
    there is no ``Case``."""
    ordered = sorted(mods.values(), key=lambda m: (rel_path(m, root) != CASES, rel_path(m, root)))
    for m in ordered:
        for node in m.tree.body:
            if not (isinstance(node, ast.ClassDef) and node.name == "Case"):
                continue
            classes = {c.name: c for c in m.tree.body if isinstance(c, ast.ClassDef)}

            def own(cls: ast.ClassDef) -> list[str]:
                return [st.target.id for st in cls.body
                        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
                        and not _is_classvar(st.annotation)]

            def inherited(cls: ast.ClassDef) -> list[tuple[str, list[str]]]:
                out = []
                for b in cls.bases:
                    base = classes.get(b.id) if isinstance(b, ast.Name) else None
                    if base is not None:
                        out += inherited(base) + [(base.name, own(base))]
                return out

            parts = inherited(node)
            fields = [f for _, fs in parts for f in fs] + own(node)
            flags = {"kw_only": False, "frozen": False}
            is_dc = False
            for dec in node.decorator_list:
                fn = dec.func if isinstance(dec, ast.Call) else dec
                if _call_name(fn) != "dataclass":
                    continue
                is_dc = True
                if isinstance(dec, ast.Call):
                    for kw in dec.keywords:
                        if kw.arg in flags:
                            flags[kw.arg] = (isinstance(kw.value, ast.Constant)
                                             and kw.value.value is True)
            return {"path": rel_path(m, root), "line": node.lineno, "count": len(fields),
                    "fields": fields, "dataclass": is_dc, **flags,
                    "bases": [(name, len(fs)) for name, fs in parts]}
    return None


def functions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """(qualified name within the module, node) of every ``def``/``async def`` at any depth
    (``f``, ``K.m``, ``f.g``)."""
    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                q = prefix + child.name
                yield q, child
                yield from walk(child, q + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, prefix + child.name + ".")
            else:
                yield from walk(child, prefix)
    yield from walk(tree, "")


def property_places(mods: dict[str, Module], root: Path) -> dict[str, Any]:
    """Figure 11. For each property P0..P16: the functions at any depth whose own name
    starts with ``p<N>_`` or, private, ``_p<N>_`` (``p3_loaded``, ``_p7_custom``; ``p1_``
    does not match ``p10_x``), as
    ``<file relative to root>:<qualified name>``, sorted. ``multiple`` lists the properties
    implemented in more than one place."""
    places: dict[str, list[str]] = {f"P{i}": [] for i in PROPERTY_IDS}
    for m in mods.values():
        for q, node in functions(m.tree):
            for i in PROPERTY_IDS:
                if node.name.lstrip("_").startswith(f"p{i}_") and \
                        len(node.name) - len(node.name.lstrip("_")) <= 1:
                    places[f"P{i}"].append(f"{rel_path(m, root)}:{q}")
    places = {k: sorted(v) for k, v in places.items()}
    return {"counts": {k: len(v) for k, v in places.items()},
            "places": places,
            "multiple": [k for k, v in places.items() if len(v) > 1],
            "total": sum(len(v) for v in places.values())}


def _range_n(node: ast.Call) -> int | None:
    """N of ``range(N)`` / ``range(0, N)`` with literal ints, else None."""
    if _call_name(node.func) != "range" or not isinstance(node.func, ast.Name) or node.keywords:
        return None
    args = node.args
    if len(args) == 2 and isinstance(args[0], ast.Constant) and args[0].value == 0:
        args = args[1:]
    if len(args) == 1 and isinstance(args[0], ast.Constant) and type(args[0].value) is int:
        return args[0].value
    return None


PROP_LITERAL = re.compile(r"P\d{1,2}")


def property_numbers(mods: dict[str, Module], root: Path) -> dict[str, Any]:
    """Figure 12. Property numbers written outside ``properties/catalogue.py``: calls
    ``range(16)`` / ``range(12)`` (also ``range(0, 16)``...), and string constants that are
    exactly ``P<1-2 digits>`` (``"P3"``; not ``"P3 load"``, not the ``"P"`` of
    ``f"P{i}"``). Counted per file, most first."""
    per: dict[str, dict[str, int]] = {}
    for m in mods.values():
        f = rel_path(m, root)
        if f == CATALOGUE:
            continue
        c = {"range16": 0, "range12": 0, "literals": 0}
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Call):
                n = _range_n(node)
                if n in (16, 12):
                    c[f"range{n}"] += 1
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and PROP_LITERAL.fullmatch(node.value)):
                c["literals"] += 1
        if any(c.values()):
            per[f] = c
    files = sorted(({"path": f, "count": sum(c.values()), **c} for f, c in per.items()),
                   key=lambda x: (-x["count"], x["path"]))
    return {"count": sum(x["count"] for x in files),
            "range16": sum(x["range16"] for x in files),
            "range12": sum(x["range12"] for x in files),
            "literals": sum(x["literals"] for x in files),
            "files": files}


# --------------------------------------------------------------------------- report

def scan(root: Path, *, with_import: bool = True) -> dict[str, Any]:
    """All figures for the package directory ``root``, as a JSON-able dict."""
    root = root.resolve()
    mods = load_modules(root)
    top = top_level_modules(root)
    sizes = module_sizes(mods, root)
    graph = import_graph(mods)
    cycles = import_cycles(graph)
    priv = private_imports(mods)
    fimps = function_imports(mods)
    out: dict[str, Any] = {
        "package": str(root),
        "modules_total": len(mods),
        "top_level_modules": {"count": len(top), "names": top},
        "largest_module": ({"path": sizes[0][0], "lines": sizes[0][1]} if sizes else None),
        "modules_over_600_lines": [{"path": p, "lines": n} for p, n in sizes
                                   if n > BIG_MODULE_LINES],
        "import_cycles": {
            "count": len(cycles),
            "cycles": [{"members": c, "edges": [list(e) for e in cycle_edges(graph, c)]}
                       for c in cycles]},
        "private_imports": {
            "cross_module": len(priv),
            "cross_module_internal": sum(1 for p in priv if not p.external),
            "cross_module_external": sum(1 for p in priv if p.external),
            "cross_package": sum(1 for p in priv if p.cross_package),
            "items": [{"importer": p.importer, "source": p.source, "name": p.name,
                       "line": p.line, "external": p.external,
                       "cross_package": p.cross_package} for p in priv]},
        "function_imports": {
            "count": sum(1 for f in fimps if f[2]),
            "all_statements": len(fimps),
            "external": sum(1 for f in fimps if not f[2])},
    }
    if with_import:
        out["import_cost"] = import_cost(root)
    out.update({
        "path_name_literals": path_name_literals(mods, root),
        "package_mutual_imports": mutual_package_imports(mods, root),
        "function_imports_by_package": function_imports_by_package(mods, root, fimps),
        "case_fields": case_fields(mods, root),
        "property_places": property_places(mods, root),
        "property_numbers_outside_catalogue": property_numbers(mods, root),
    })
    return out


def render(r: dict[str, Any]) -> str:
    """The text report."""
    L = [f"archscan: {r['package']}  ({r['modules_total']} .py files)", ""]
    t = r["top_level_modules"]
    L.append(f"1. top-level modules (*.py directly in the package, not __init__/__main__): "
             f"{t['count']}")
    L.append("   " + " ".join(t["names"]))
    lm = r["largest_module"]
    if lm:
        L.append(f"2. largest module: {lm['path']} ({lm['lines']} lines)")
    big = r["modules_over_600_lines"]
    L.append(f"   modules over {BIG_MODULE_LINES} lines: {len(big)}")
    for b in big:
        L.append(f"     {b['lines']:6d}  {b['path']}")
    c = r["import_cycles"]
    L.append(f"3. import cycles (SCCs, imports at any depth): {c['count']}")
    for cyc in c["cycles"]:
        L.append(f"   - {len(cyc['members'])} modules: " + ", ".join(cyc["members"]))
        for a, b in cyc["edges"]:
            L.append(f"       {a} -> {b}")
    p = r["private_imports"]
    L.append(f"4. private-name imports (from X import _name, X another module, not dunder): "
             f"cross-module {p['cross_module']} ({p['cross_module_internal']} from the "
             f"package's own modules + {p['cross_module_external']} external); "
             f"cross-package (own modules, other directory) {p['cross_package']}")
    for it in p["items"]:
        mark = "ext" if it["external"] else ("pkg" if it["cross_package"] else "   ")
        L.append(f"   [{mark}] {it['importer']}:{it['line']}  {it['name']}  "
                 f"from {it['source']}")
    L.append("       ([pkg] = cross-package: the importer's directory differs from the "
             "source's; [ext] = outside the package)")
    f = r["function_imports"]
    L.append(f"5. import statements inside functions, of the package's own modules: "
             f"{f['count']}  (all function-level import statements: {f['all_statements']}, "
             f"{f['external']} of them stdlib/third-party)")
    ic = r.get("import_cost")
    if ic is not None:
        us = ic["plugin_import_us"]
        L.append("6. import cost: "
                 + (f"import {Path(r['package']).name}.plugin = {us} us cumulative "
                    f"({us / 1e3:.1f} ms, one -X importtime sample)" if us is not None
                    else "plugin import time not found"))
        L.append(f"   torch in sys.modules after `import pkg`: {ic['torch_after_package']}; "
                 f"after `import pkg.plugin`: {ic['torch_after_plugin']}")
        if ic["error"]:
            L.append(f"   error: {ic['error']}")
    else:
        L.append("6. import cost: skipped (--no-import)")
    L.extend(render_redesign(r))
    return "\n".join(L)


def _top(rows: list[dict[str, Any]], n: int = TOP_N) -> list[str]:
    out = [f"     {x['count']:5d}  {x['path']}" for x in rows[:n]]
    if len(rows) > n:
        out.append(f"       ... {len(rows) - n} more files, "
                   f"{sum(x['count'] for x in rows[n:])} more")
    return out


def render_redesign(r: dict[str, Any]) -> list[str]:
    """The text of figures 7-12."""
    L: list[str] = []
    pl = r["path_name_literals"]
    L.append(f"7. path-name literals outside the path modules (str constants == a registered "
             f"path name or '<name>/...'): {pl['count']} in {len(pl['files'])} files")
    L.append(f"   path names: {len(pl['path_names'])} from {pl['path_names_from']}; not "
             f"counted: {', '.join(pl['excluded'])}")
    L.extend(_top(pl["files"]))
    L.append(f"   in path modules: {pl['in_path_modules']}  ("
             + (", ".join(f"{x['path']} {x['count']}" for x in pl["path_modules"]) or "none")
             + ")")
    sp = pl["sut_paths_py"]
    if sp is not None and not sp["excluded"]:
        L.append(f"   {SUT_PATHS} alone (not a path module, counted above): {sp['count']}")
    mp = r["package_mutual_imports"]
    L.append(f"8. package pairs importing each other (direct subdirectories, imports at any "
             f"depth): {mp['count']}  (+ {mp['with_top_count']} with top-level modules "
             f"{TOP})")

    def pair(p: dict[str, Any]) -> list[str]:
        ab, ba = p["a_to_b"], p["b_to_a"]
        return [f"   - {p['a']} <-> {p['b']}",
                f"       {p['a']} -> {p['b']}: {ab['imports']} imports, e.g. {ab['site']} "
                f"({ab['importer']} -> {ab['imported']})",
                f"       {p['b']} -> {p['a']}: {ba['imports']} imports, e.g. {ba['site']} "
                f"({ba['importer']} -> {ba['imported']})"]
    for p in mp["pairs"]:
        L.extend(pair(p))
    if mp["with_top"]:
        L.append(f"   with {TOP} (*.py directly in the package): {mp['with_top_count']}")
        for p in mp["with_top"]:
            L.extend(pair(p))
    fb = r["function_imports_by_package"]
    L.append(f"9. import statements inside functions, of the package's own modules, per "
             f"importing package (figure 5: {r['function_imports']['count']}; top 8 of "
             f"{len(fb)}):")
    L.append("   " + (", ".join(f"{x['package']} {x['count']}" for x in fb[:8]) or "none"))
    cf = r["case_fields"]
    if cf is None:
        L.append("10. Case fields: no class Case found")
    else:
        split = "".join(f" = {n} {c} +" for n, c in cf.get("bases", []))
        own = cf["count"] - sum(c for _, c in cf.get("bases", []))
        L.append(f"10. Case fields: {cf['count']}{split + f' its own {own}' if split else ''}  "
                 f"({cf['path']}:{cf['line']}; "
                 f"{'@dataclass' if cf['dataclass'] else 'not a dataclass'} "
                 f"kw_only={cf['kw_only']} frozen={cf['frozen']})")
    pp = r["property_places"]
    L.append(f"11. places a property is implemented (functions named p<N>_* or _p<N>_*, any "
             f"depth): "
             f"{pp['total']}; properties in more than one place: {len(pp['multiple'])}")
    L.append("   " + " ".join(f"{k}:{n}" for k, n in pp["counts"].items()))
    for k in pp["multiple"]:
        L.append(f"   {k}: {pp['counts'][k]} ({', '.join(pp['places'][k])})")
    pn = r["property_numbers_outside_catalogue"]
    L.append(f"12. property numbers written outside {CATALOGUE}: {pn['count']}  "
             f"(range(16) {pn['range16']}, range(12) {pn['range12']}, \"P<n>\" literals "
             f"{pn['literals']}) in {len(pn['files'])} files")
    L.extend(_top(pn["files"]))
    return L


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", type=Path,
                    default=Path(__file__).resolve().parents[1] / "fsdp_conformance",
                    help="package directory to scan (default: the fsdp_conformance next to "
                         "this script's directory)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--no-import", action="store_true",
                    help="skip figure 6 (import time / torch), which imports the package")
    a = ap.parse_args(argv)
    if not a.package.is_dir():
        ap.error(f"--package {a.package}: not a directory")
    r = scan(a.package, with_import=not a.no_import)
    print(json.dumps(r, indent=2) if a.json else render(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
