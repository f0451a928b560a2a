#!/usr/bin/env python3
"""Structure figures of a Python package, each re-measurable by running this script.

    python scripts/archscan.py                 # text report on ../fsdp_conformance
    python scripts/archscan.py --json          # the same figures, machine-readable
    python scripts/archscan.py --package PATH  # scan another package directory
    python scripts/archscan.py --no-import     # skip figure 6 (it imports the package)

Figures 1-5 are a static AST scan (nothing is imported); figure 6 runs two subprocesses.
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

Stdlib only.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
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
    return "\n".join(L)


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
