"""The pytest plugin's implementation: options and their values, the ``fsdp`` and
``fsdp_known`` markers at collection, the ``fsdp_roundtrip`` / ``fsdp_case`` fixture objects,
and the session's run report (merged across pytest-xdist workers). ``fsdp_conformance.plugin``
is the shell pytest loads: its hooks and fixtures call the functions here.

Rules
- No torch at import, and none while a session that uses no fsdp fixture or marker loads,
  configures and collects: modules that import torch are imported inside the functions that
  need them.
- Options are read as the command-line option, else the ini key of the same name.
- Results of every round trip the session runs are kept on ``config.stash``; an xdist worker
  hands them to the controller (``workeroutput``), which writes the one report.
- Pools alive before this session (an in-process pytest run inside another) belong to
  whoever started them: the session leaves them open.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import KW_ONLY, dataclass

import pytest

from ..options import DEFAULT_TIMEOUT_S, RunOptions
from ..known.declared import declared_reason
from .limitations import Limitation
from .spec import ACTIVE, DEFAULT_PAIRS, TIERS, pair_id, pair_text, world_size_pair

RESULTS = pytest.StashKey[list]()
STARTED = pytest.StashKey[float]()
NESTED = pytest.StashKey[bool]()
OUTER_TIER = pytest.StashKey[object]()
REGISTRY = "fsdp_conformance.harness.registry"
WORKER_KEY = "fsdpc_results"
CANDIDATES = pytest.StashKey[set]()
"""Every case id a round trip of this session built, before ``--fsdp-case`` kept some."""
CANDIDATES_KEY = "fsdpc_candidates"
UNMATCHED = pytest.StashKey[str]()
"""Why ``--fsdp-case`` failed the session (an id no test's case has), if it did."""


# --------------------------------------------------------------------------- options
def add_options(parser) -> None:
    group = parser.getgroup("fsdp-conformance")
    group.addoption("--fsdp-timeout", type=float, default=None,
                    help="per-call timeout in seconds for rank pools (default 120)")
    group.addoption("--fsdp-backend", choices=["gloo", "nccl"], default=None,
                    help="process-group backend of the pools (default: nccl with one GPU per "
                         "rank, else gloo)")
    group.addoption("--fsdp-world-sizes", default=None,
                    help="comma-separated world sizes allowed, e.g. 1,2 (others are skipped)")
    group.addoption("--fsdp-tier", choices=list(TIERS), default=None,
                    help="quick (default): few paths/world sizes, CI hypothesis profile; "
                         "full: every FSDP1 path and world-size pair, nightly profile")
    group.addoption("--fsdp-report", default=None, metavar="PATH",
                    help="write the run report (JSON, and Markdown beside it) of every case "
                         "this session ran")
    group.addoption("--fsdp-case", action="append", default=None, metavar="ID",
                    help="run only the round-trip case with this id (repeatable)")
    group.addoption("--fsdp-crash", action="store_true", default=False,
                    help="add crash cases (P16) to every check of your own save_fn/load_fn: "
                         "your save killed at the default points (CheckOptions.crash=True)")
    group.addoption("--fsdp-reproducer", action="store_true", default=False,
                    help="print a standalone reproducer script under each failing case "
                         "(default: the failure, its likely cause and the rerun line only)")
    parser.addini("fsdp_timeout", "per-call timeout in seconds for rank pools",
                  default=str(DEFAULT_TIMEOUT_S))
    parser.addini("fsdp_backend", "process-group backend (gloo or nccl)", default="")
    parser.addini("fsdp_world_sizes", "comma-separated world sizes allowed", default="")
    parser.addini("fsdp_tier", "quick or full", default="quick")
    parser.addini("fsdp_report", "path of the run report", default="")


def configure(config) -> None:
    config.addinivalue_line("markers", "gpu: needs CUDA (skipped with a reason without it)")
    config.addinivalue_line(
        "markers", "fsdp(world_sizes=[1, 2, '2->4'], backend=None): run the test once per "
                   "world size (ids ws1, ws2, ws2->4); fsdp_roundtrip uses that size")
    config.addinivalue_line(
        "markers", "fsdp_known(key_or_props, reason='', symptom='', strict=True): a known "
                   "torch limitation of this test (a key of fsdp_conformance/known/entries.py, or "
                   "property ids with a reason)")
    config.stash[RESULTS] = []
    config.stash[STARTED] = time.time()
    config.stash[OUTER_TIER] = ACTIVE["tier"]
    registry = sys.modules.get(REGISTRY)  # only if loaded: no import of torch here
    config.stash[NESTED] = bool(registry is not None and registry.live_pools())
    ACTIVE["tier"] = tier(config)
    allowed_world_sizes(config)  # a bad value is a usage error now, not at the first test


def unconfigure(config) -> None:
    ACTIVE["tier"] = config.stash.get(OUTER_TIER, None)


def option(config, name: str):
    """Command-line option ``name`` (its dest), else the ini key of the same name."""
    val = config.getoption(name, default=None)
    if val in (None, ""):
        val = config.getini(name) or None
    return val


def timeout(config) -> float:
    return float(option(config, "fsdp_timeout") or DEFAULT_TIMEOUT_S)


def backend(config) -> str | None:
    return option(config, "fsdp_backend")


def tier(config) -> str:
    t = option(config, "fsdp_tier") or "quick"
    if t not in TIERS:
        raise pytest.UsageError(f"fsdp_tier must be quick or full, got {t!r}")
    return t


def allowed_world_sizes(config) -> set[int] | None:
    raw = option(config, "fsdp_world_sizes")
    if not raw:
        return None
    from ..usage import UsageError, parse_world_sizes

    try:
        return set(parse_world_sizes(raw, "--fsdp-world-sizes"))
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def marker_backend(request) -> str | None:
    """The backend of the test's ``fsdp`` marker, else the session's."""
    m = request.node.get_closest_marker("fsdp")
    return (m.kwargs.get("backend") if m is not None else None) or backend(request.config)


@dataclass(frozen=True)
class RoundtripSettings:
    """What a round-trip test runs with: the session's options and the test's markers."""

    _: KW_ONLY
    backend: str | None
    """Process-group backend (the ``fsdp`` marker's, else ``--fsdp-backend``; None: auto)."""
    timeout: float
    """Per-call timeout of the rank pools, in seconds."""
    tier: str
    """quick or full: the default paths and world-size pairs."""
    allowed: set[int] | None
    """``--fsdp-world-sizes`` (None: every size)."""
    only: tuple[str, ...] | None
    """``--fsdp-case`` ids (None: every case)."""
    known: tuple[Limitation, ...]
    """The test's ``fsdp_known`` markers."""
    world_sizes: tuple | None
    """The world size an ``fsdp`` marker parametrized the test with, as a one-item list
    (None: no marker)."""

    @classmethod
    def of(cls, request) -> "RoundtripSettings":
        config = request.config
        only = config.getoption("fsdp_case", default=None) or None
        callspec = getattr(request.node, "callspec", None)
        param = callspec.params.get("fsdp_world_size") if callspec is not None else None
        return cls(backend=marker_backend(request), timeout=timeout(config), tier=tier(config),
                   allowed=allowed_world_sizes(config), only=tuple(only) if only else None,
                   known=tuple(Limitation.of(*m.args, **m.kwargs)
                               for m in request.node.iter_markers("fsdp_known")),
                   world_sizes=(param,) if param is not None else None)


# --------------------------------------------------------------------------- collection
def marker_sizes(marker) -> list:
    sizes = marker.kwargs.get("world_sizes", marker.args[0] if marker.args else [2])
    return [sizes] if isinstance(sizes, (int, str)) else list(sizes)


def generate_tests(metafunc) -> None:
    """One test per world size of an ``fsdp`` marker; the conformance matrix for a test
    taking ``fsdp_conformance_case``."""
    config = metafunc.config
    marker = metafunc.definition.get_closest_marker("fsdp")
    if marker is None and "fsdp_conformance_case" not in metafunc.fixturenames:
        return
    allowed = allowed_world_sizes(config)
    if marker is not None:
        be = marker.kwargs.get("backend") or backend(config)
        params = []
        for spec in marker_sizes(marker):
            pair = world_size_pair(spec)
            marks = []
            if allowed is not None and not set(pair) <= allowed:
                marks.append(pytest.mark.skip(
                    reason=f"world size {pair_text(pair)} not in --fsdp-world-sizes "
                           f"{','.join(map(str, sorted(allowed)))}"))
            elif be == "nccl" and gpu_count() < max(pair):
                marks.append(pytest.mark.skip(
                    reason=f"backend nccl needs {max(pair)} CUDA devices; this machine has "
                           f"{gpu_count()}"))
            value = pair[0] if pair[0] == pair[1] else pair
            params.append(pytest.param(value, id=pair_id(pair), marks=marks))
        if "fsdp_world_size" not in metafunc.fixturenames:
            metafunc.fixturenames.append("fsdp_world_size")
        metafunc.parametrize("fsdp_world_size", params, indirect=True)
    if "fsdp_conformance_case" in metafunc.fixturenames:
        from ..run import matrix

        cases = matrix.select(matrix.TIERS[tier(config)](matrix.default_paths()),
                              world_sizes=sorted(allowed or (1, 2, 3, 4)))
        metafunc.parametrize("fsdp_conformance_case", cases, ids=[c.id for c in cases])


def mark_items(config, items) -> None:
    """``fsdp_known`` on a test without a round-trip fixture: xfail; ``gpu`` without CUDA:
    skip, with the reason; with ``--fsdp-case``, only the tests that run round trips are
    kept (the others deselected), so the report's rerun line reruns just that case."""
    if config.getoption("fsdp_case", default=None):
        fixtures = {"fsdp_roundtrip", "fsdp_case"}
        other = [i for i in items if not fixtures & set(getattr(i, "fixturenames", ()))]
        if other:
            config.hook.pytest_deselected(items=other)
            items[:] = [i for i in items if i not in other]
    for item in items:
        uses = {"fsdp_roundtrip", "fsdp_case"} & set(getattr(item, "fixturenames", ()))
        for m in item.iter_markers("fsdp_known"):
            if uses:
                continue
            lim = Limitation.of(*m.args, **m.kwargs)
            item.add_marker(pytest.mark.xfail(
                reason=f"known torch limitation {lim.key}: {lim.reason}", strict=lim.strict))
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none (torch "
                                   f"{torch.__version__}, cuda available: False)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


# --------------------------------------------------------------------------- fixtures
def pool_getter(config):
    """The ``rank_pool`` fixture's value: ``get(world_size, backend=None)`` -> the session's
    shared RankPool."""
    from ..harness import get_pool

    timeout_s = timeout(config)
    default_backend = backend(config)

    def get(world_size: int, backend: str | None = None):
        return get_pool(world_size, backend or default_backend, timeout=timeout_s)

    return get


class Roundtrip:
    """The ``fsdp_roundtrip`` fixture (see ``driver.check`` for every argument)."""

    def __init__(self, request):
        self._request = request
        s = RoundtripSettings.of(request)
        self.settings = s
        self.backend, self.timeout, self.tier, self.allowed = (s.backend, s.timeout, s.tier,
                                                              s.allowed)
        self.only = list(s.only) if s.only else None
        self.known = list(s.known)
        self.default_world_sizes = list(s.world_sizes) if s.world_sizes else None
        self.results: list = []

    def _record(self, result) -> None:
        self.results.append(result)
        self._request.config.stash[RESULTS].append(result)

    def _candidates(self, ids) -> None:
        self._request.config.stash.setdefault(CANDIDATES, set()).update(ids)

    def rerun(self, case) -> str:
        return f"pytest '{self._request.node.nodeid}' --fsdp-case '{case.id}'"

    def _pairs(self, world_sizes):
        """The world-size specs to run (``spec.parse_sizes`` forms, kept as given: an HSDP
        spec carries its mesh), within ``--fsdp-world-sizes``."""
        specs = list(world_sizes or self.default_world_sizes or DEFAULT_PAIRS[self.tier])
        if self.allowed is not None:
            kept = [w for w in specs if set(world_size_pair(w)) <= self.allowed]
            if not kept:
                pytest.skip(f"no world-size pair of {specs} within --fsdp-world-sizes "
                            f"{','.join(map(str, sorted(self.allowed)))}")
            specs = kept
        return specs

    def _fail_clean(self, fn, *args, **kwargs):
        from .failures import RoundtripFailure

        try:
            return fn(*args, **kwargs)
        except RoundtripFailure as exc:
            message = str(exc)
            if exc.brief and not self._request.config.getoption("fsdp_reproducer",
                                                                  default=False):
                message = (exc.brief + "\n(a standalone reproducer script of each case: "
                           "rerun with --fsdp-reproducer)")
        pytest.fail(message, pytrace=False)  # outside the except: no chained repeat

    def __call__(self, model, data, *, world_sizes=None, **kwargs) -> list:
        """Round-trip ``model`` (see ``driver.check``: keyword arguments or ``options=``, a
        ``CheckOptions``); the session's tier, backend, timeout, declared limitations and
        case selection apply. Returns the CaseResults."""
        from .driver import check

        kwargs.setdefault("tier", self.tier)
        opts = kwargs.get("options")
        if self._request.config.getoption("fsdp_crash", default=False) and (
                kwargs.get("save_fn") is not None
                or (opts is not None and opts.save_fn is not None)):
            kwargs.setdefault("crash", True)  # --fsdp-crash
        if world_sizes is None and kwargs.get("options") is not None:
            world_sizes = kwargs["options"].world_sizes
        results = self._fail_clean(
            check, model, data, world_sizes=self._pairs(world_sizes), backend=self.backend,
            timeout=self.timeout, known=self.known, only=self.only, rerun=self.rerun,
            on_result=self._record, on_cases=self._candidates, **kwargs)
        if self.only and not results:
            pytest.skip(f"no case of this test matches --fsdp-case {self.only}")
        return results

    def zoo(self, save_fn, load_fn, **kwargs) -> list:
        """Your ``save_fn`` / ``load_fn`` on the suite's zoo models (``driver.check_zoo``):
        ``fsdp_roundtrip.zoo(save_fn=..., load_fn=...)``; returns the CaseResults."""
        from .driver import check_zoo

        return self._fail_clean(check_zoo, save_fn, load_fn, backend=self.backend,
                                timeout=self.timeout, known=self.known, only=self.only,
                                rerun=self.rerun, on_result=self._record,
                                on_cases=self._candidates, **kwargs)

    def check(self, case, user=None, custom=None):
        """Run one ready ``Case`` (a zoo model, or ``user``'s; through a built-in path or
        ``custom``); fail the test if a property fails. Returns the CaseResult."""
        from .driver import run_checked

        if self.allowed is not None and not {case.world_size, case.dst_world_size} <= self.allowed:
            pytest.skip(f"{case.id}: world sizes outside --fsdp-world-sizes")
        return self._fail_clean(run_checked, [case], user, custom, RunOptions.for_user(
            backend=self.backend, timeout=self.timeout), known=self.known, rerun=self.rerun,
            on_result=self._record)[0]


def case_runner(request):
    """The ``fsdp_case`` fixture's value: ``run(case)`` runs a zoo ``Case`` as the
    conformance run does; a known limitation that no longer reproduces fails."""
    rt = Roundtrip(request)

    def run(case):
        r = rt.check(case)
        fixed = {p: v for p, v in r.properties.items() if v.fixed_upstream}
        if fixed:
            pytest.fail(f"{case.id}: fixed upstream? " + "; ".join(
                f"{p}: known limitation {v.known!r} did not reproduce" for p, v in fixed.items())
                + " -- retire the entry in fsdp_conformance/known/entries.py", pytrace=False)
        return r

    return run


# --------------------------------------------------------------------------- report
def encode_result(r) -> dict:
    return {"case": r.case.to_dict(), "timings": dict(r.timings), "rerun": r.rerun,
            "setup": dict(r.setup),
            "properties": {p: [v.status, v.detail, v.known] for p, v in r.properties.items()}}


def decode_result(d: dict):
    from ..cases import Case
    from ..properties.verdict import Verdict
    from ..report.run_report import CaseResult

    return CaseResult(Case(**d["case"]), {p: Verdict(*v) for p, v in d["properties"].items()},
                      d["timings"], rerun=d.get("rerun", ""), setup=d.get("setup") or {})


def collect_worker(node) -> None:
    """xdist controller: collect a worker's results for the report."""
    data = getattr(node, "workeroutput", {}).get(WORKER_KEY)
    if data:
        node.config.stash[RESULTS].extend(decode_result(d) for d in json.loads(data))
    seen = getattr(node, "workeroutput", {}).get(CANDIDATES_KEY)
    if seen:
        node.config.stash.setdefault(CANDIDATES, set()).update(json.loads(seen))


def write_report(config, path: str) -> None:
    from ..properties.precision import TOLERANCES
    from ..report.run_report import build_report, write_run_report

    results = config.stash[RESULTS]
    sizes = sorted({w for r in results for w in (r.case.world_size, r.case.dst_world_size)})
    report = build_report(
        results, tier=tier(config), backend=backend(config) or "gloo", seed=0,
        world_sizes=sizes, wall_time_s=time.time() - config.stash[STARTED],
        argv=["pytest", *config.invocation_params.args],
        selection=config.getoption("keyword", default=None) or None,
        tolerances={k: {"rtol": r, "atol": a} for k, (r, a) in TOLERANCES.items()})
    write_run_report(report, path, os.path.splitext(path)[0] + ".md")


def terminal_summary(terminalreporter, config) -> None:
    """After the tests: one line per known torch limitation the session's round trips met
    (as pytest lists xfails), and each case that ran twice because a rank died; passing
    tests hide both otherwise."""
    results = config.stash.get(RESULTS, [])
    unmatched = config.stash.get(UNMATCHED, "")
    if unmatched:
        terminalreporter.write_sep("=", "fsdp-conformance: --fsdp-case matched nothing",
                                   red=True)
        for line in unmatched.splitlines():
            terminalreporter.write_line(f"ERROR {line}")

    known: dict[str, tuple[set, list]] = {}
    declared: dict[str, str] = {}
    for r in results:
        for p, v in r.properties.items():
            if v.status == "known" and v.known:
                props, ids = known.setdefault(v.known, (set(), []))
                props.add(p)
                if r.case.id not in ids:
                    ids.append(r.case.id)
                if declared_reason(v.detail, v.known):
                    declared[v.known] = declared_reason(v.detail, v.known)
    reruns = [r for r in results if getattr(r, "rerun", "")]
    if not known and not reruns:
        return
    from ..report.run_report import prop_key

    terminalreporter.write_sep("=", "fsdp-conformance: known torch limitations met")
    for key, (props, ids) in sorted(known.items()):
        why = f" [declared by your tests: {declared[key]}]" if key in declared else ""
        terminalreporter.write_line(
            f"KNOWN {key}{why}: {len(ids)} case{'s' if len(ids) != 1 else ''} "
            f"({', '.join(sorted(props, key=prop_key))}), e.g. {ids[0]}")
    for r in reruns:
        terminalreporter.write_line(f"RERUN {r.case.id}: a rank died in the first attempt "
                                    f"({r.rerun.splitlines()[0]})")


def _unmatched_cases(config) -> str:
    """Each ``--fsdp-case`` id that no case of this session ran (a typo, or a case of a
    test not selected), with the closest ids the session's round trips built; "" when
    every id ran or none was given."""
    import difflib

    only = config.getoption("fsdp_case", default=None) or []
    if config.getoption("collectonly", default=False):
        return ""  # nothing runs: nothing to match
    ran = {r.case.id for r in config.stash.get(RESULTS, [])}
    missing = [i for i in only if i not in ran]
    if not missing:
        return ""
    seen = sorted(config.stash.get(CANDIDATES, set()))
    lines = []
    for i in missing:
        close = difflib.get_close_matches(i, seen, n=3, cutoff=0.5)
        lines.append(f"--fsdp-case {i!r}: no case of the tests that ran has this id"
                     + (f"; did you mean {' or '.join(map(repr, close))}?" if close else
                        f" ({len(seen)} case ids seen; a test's failure prints its own)"))
    return "\n".join(lines)


def finish(session) -> None:
    """Hand the results to the xdist controller, or write the report; close this session's
    pools."""
    config = session.config
    try:
        if hasattr(config, "workerinput"):  # xdist worker: hand results to the controller
            config.workeroutput[WORKER_KEY] = json.dumps(
                [encode_result(r) for r in config.stash[RESULTS]])
            config.workeroutput[CANDIDATES_KEY] = json.dumps(
                sorted(config.stash.get(CANDIDATES, set())))
        else:
            unmatched = _unmatched_cases(config)
            if unmatched:  # a mistyped --fsdp-case must not pass CI as "skipped"
                config.stash[UNMATCHED] = unmatched
                if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
                    session.exitstatus = pytest.ExitCode.USAGE_ERROR
            path = option(config, "fsdp_report")
            if path:
                write_report(config, str(path))
    finally:
        registry = sys.modules.get(REGISTRY)
        if registry is not None and not config.stash.get(NESTED, False):
            registry.close_pools()
