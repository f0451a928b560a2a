"""pytest plugin (entry point ``pytest11``): test your own model's optimizer-state checkpoint
round trip under FSDP, on shared rank pools, xdist-safe. A thin shell over
``fsdp_conformance.roundtrip`` (usable without pytest).

Fixtures
- ``rank_pool`` (session): ``get(world_size, backend=None)`` -> the shared RankPool of this
  session (of this worker under pytest-xdist: every worker has its own pools; ports never
  collide because each pool's store binds port 0). Pools close at the end of the session.
- ``fsdp_roundtrip``: ``fsdp_roundtrip(model, data, plan=..., optimizer=..., loss=...,
  paths=..., world_sizes=..., save_fn=..., load_fn=...)`` runs the round trip and fails the
  test with every failing property's detail and a rerun line per case;
  ``fsdp_roundtrip.check(case, user=None, custom=None)`` runs one ready Case (hypothesis).
- ``fsdp_case``: ``fsdp_case(case)`` runs a zoo ``Case`` like the conformance run does.
- ``fsdp_world_size`` / ``fsdp_pool``: the world size a ``fsdp`` marker parametrized the
  test with, and the pool of that size.
- A test taking ``fsdp_conformance_case`` is parametrized over the conformance matrix of
  ``--fsdp-tier`` (ids = case ids): ``def test_it(fsdp_conformance_case, fsdp_case):
  fsdp_case(fsdp_conformance_case)`` is the conformance run as a pytest session.

Markers
- ``@pytest.mark.fsdp(world_sizes=[1, 2, "2->4"], backend=None)``: one test per world size
  (ids ``ws1``, ``ws2``, ``ws2->4``); ``fsdp_roundtrip`` then saves/loads at that size.
- ``@pytest.mark.fsdp_known(key_or_props, reason=..., symptom=..., strict=True)``: a known
  torch limitation (a key of ``known.py``, or property ids with a reason). Under
  ``fsdp_roundtrip``/``fsdp_case`` the verdicts it covers become "known" (strict: it must
  reproduce); other tests get ``xfail(strict=strict)``.
- ``gpu``: skipped, with the reason, without CUDA.

Options (each also an ini key with ``_`` for ``-``): ``--fsdp-backend``, ``--fsdp-world-sizes``
(allowed sizes; others are skipped with the reason), ``--fsdp-timeout``, ``--fsdp-tier``
(quick | full: default paths and world sizes, the matrix, the hypothesis profile),
``--fsdp-report PATH`` (the same JSON + Markdown report as ``fsdp-conformance run``, of
every case this session ran, merged across xdist workers), ``--fsdp-case ID`` (run just
that case of a test; repeatable; what failure messages print).
"""
from __future__ import annotations

import json
import os
import sys
import time

import pytest

_RESULTS = pytest.StashKey[list]()
_STARTED = pytest.StashKey[float]()
_NESTED = pytest.StashKey[bool]()
_OUTER_TIER = pytest.StashKey[object]()
# The tier of the running session, read by ``strategies.fsdp_settings`` (None: no session).
ACTIVE = {"tier": None}


def pytest_addoption(parser) -> None:
    group = parser.getgroup("fsdp-conformance")
    group.addoption("--fsdp-timeout", type=float, default=None,
                    help="per-call timeout in seconds for rank pools (default 120)")
    group.addoption("--fsdp-backend", choices=["gloo", "nccl"], default=None,
                    help="process-group backend of the pools (default: nccl with one GPU per "
                         "rank, else gloo)")
    group.addoption("--fsdp-world-sizes", default=None,
                    help="comma-separated world sizes allowed, e.g. 1,2 (others are skipped)")
    group.addoption("--fsdp-tier", choices=["quick", "full"], default=None,
                    help="quick (default): few paths/world sizes, CI hypothesis profile; "
                         "full: every FSDP1 path and world-size pair, nightly profile")
    group.addoption("--fsdp-report", default=None, metavar="PATH",
                    help="write the run report (JSON, and Markdown beside it) of every case "
                         "this session ran")
    group.addoption("--fsdp-case", action="append", default=None, metavar="ID",
                    help="run only the round-trip case with this id (repeatable)")
    parser.addini("fsdp_timeout", "per-call timeout in seconds for rank pools", default="120")
    parser.addini("fsdp_backend", "process-group backend (gloo or nccl)", default="")
    parser.addini("fsdp_world_sizes", "comma-separated world sizes allowed", default="")
    parser.addini("fsdp_tier", "quick or full", default="quick")
    parser.addini("fsdp_report", "path of the run report", default="")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "gpu: needs CUDA (skipped with a reason without it)")
    config.addinivalue_line(
        "markers", "fsdp(world_sizes=[1, 2, '2->4'], backend=None): run the test once per "
                   "world size (ids ws1, ws2, ws2->4); fsdp_roundtrip uses that size")
    config.addinivalue_line(
        "markers", "fsdp_known(key_or_props, reason='', symptom='', strict=True): a known "
                   "torch limitation of this test (a key of fsdp_conformance/known.py, or "
                   "property ids with a reason)")
    config.stash[_RESULTS] = []
    config.stash[_STARTED] = time.time()
    config.stash[_OUTER_TIER] = ACTIVE["tier"]
    # Pools alive before this session (an in-process pytest run inside another) belong to
    # whoever started them: this session leaves them open. (No import of torch here.)
    registry = sys.modules.get("fsdp_conformance.harness.registry")
    config.stash[_NESTED] = bool(registry is not None and registry.live_pools())
    ACTIVE["tier"] = tier(config)
    allowed_world_sizes(config)  # a bad value is a usage error now, not at the first test


def pytest_unconfigure(config) -> None:
    ACTIVE["tier"] = config.stash.get(_OUTER_TIER, None)


# --------------------------------------------------------------------------- settings
def _opt(config, name: str):
    """Command-line option ``name`` (its dest), else the ini key of the same name."""
    val = config.getoption(name, default=None)
    if val in (None, ""):
        val = config.getini(name) or None
    return val


def _timeout(config) -> float:
    return float(_opt(config, "fsdp_timeout") or 120)


def backend(config) -> str | None:
    return _opt(config, "fsdp_backend")


def tier(config) -> str:
    t = _opt(config, "fsdp_tier") or "quick"
    if t not in ("quick", "full"):
        raise pytest.UsageError(f"fsdp_tier must be quick or full, got {t!r}")
    return t


def allowed_world_sizes(config) -> set[int] | None:
    raw = _opt(config, "fsdp_world_sizes")
    if not raw:
        return None
    try:
        sizes = {int(x) for x in str(raw).split(",") if x.strip()}
    except ValueError:
        raise pytest.UsageError(f"--fsdp-world-sizes must be comma-separated integers, "
                                f"got {raw!r}") from None
    if not sizes or min(sizes) < 1:
        raise pytest.UsageError(f"--fsdp-world-sizes must be positive, got {raw!r}")
    return sizes


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# --------------------------------------------------------------------------- collection
def _marker_sizes(marker) -> list:
    sizes = marker.kwargs.get("world_sizes", marker.args[0] if marker.args else [2])
    return [sizes] if isinstance(sizes, (int, str)) else list(sizes)


def pytest_generate_tests(metafunc) -> None:
    config = metafunc.config
    marker = metafunc.definition.get_closest_marker("fsdp")
    if marker is None and "fsdp_conformance_case" not in metafunc.fixturenames:
        return
    from .roundtrip import pair_id, world_size_pair

    allowed = allowed_world_sizes(config)
    if marker is not None:
        be = marker.kwargs.get("backend") or backend(config)
        params = []
        for spec in _marker_sizes(marker):
            pair = world_size_pair(spec)
            marks = []
            if allowed is not None and not set(pair) <= allowed:
                marks.append(pytest.mark.skip(
                    reason=f"world size {pair_id(pair)[2:]} not in --fsdp-world-sizes "
                           f"{','.join(map(str, sorted(allowed)))}"))
            elif be == "nccl" and _gpu_count() < max(pair):
                marks.append(pytest.mark.skip(
                    reason=f"backend nccl needs {max(pair)} CUDA devices; this machine has "
                           f"{_gpu_count()}"))
            value = pair[0] if pair[0] == pair[1] else pair
            params.append(pytest.param(value, id=pair_id(pair), marks=marks))
        if "fsdp_world_size" not in metafunc.fixturenames:
            metafunc.fixturenames.append("fsdp_world_size")
        metafunc.parametrize("fsdp_world_size", params, indirect=True)
    if "fsdp_conformance_case" in metafunc.fixturenames:
        from .run import matrix

        cases = matrix.select(matrix.TIERS[tier(config)](matrix.default_paths()),
                              world_sizes=sorted(allowed or (1, 2, 3, 4)))
        metafunc.parametrize("fsdp_conformance_case", cases, ids=[c.id for c in cases])


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        uses = {"fsdp_roundtrip", "fsdp_case"} & set(getattr(item, "fixturenames", ()))
        for m in item.iter_markers("fsdp_known"):
            if uses:
                continue
            from .roundtrip import Limitation

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
@pytest.fixture(scope="session")
def rank_pool(request):
    """``rank_pool(world_size, backend=None)`` -> the session's shared RankPool."""
    from .harness import get_pool

    timeout = _timeout(request.config)
    default_backend = backend(request.config)

    def get(world_size: int, backend: str | None = None):
        return get_pool(world_size, backend or default_backend, timeout=timeout)

    return get


@pytest.fixture
def fsdp_world_size(request):
    """The world size a ``fsdp`` marker gave this test (an int, or (N, M) for "N->M");
    None for tests without the marker."""
    return getattr(request, "param", None)


def _marker_backend(request) -> str | None:
    m = request.node.get_closest_marker("fsdp")
    return (m.kwargs.get("backend") if m is not None else None) or backend(request.config)


@pytest.fixture
def fsdp_pool(request, fsdp_world_size, rank_pool):
    """The shared pool of this test's world size (the save side's for "N->M"; 2 without
    a ``fsdp`` marker)."""
    ws = fsdp_world_size if fsdp_world_size is not None else 2
    return rank_pool(ws if isinstance(ws, int) else ws[0], _marker_backend(request))


class Roundtrip:
    """The ``fsdp_roundtrip`` fixture (see ``roundtrip.check`` for every argument)."""

    def __init__(self, request):
        from .roundtrip import Limitation

        self._request = request
        config = request.config
        self.backend = _marker_backend(request)
        self.timeout = _timeout(config)
        self.tier = tier(config)
        self.allowed = allowed_world_sizes(config)
        self.only = config.getoption("fsdp_case", default=None) or None
        self.known = [Limitation.of(*m.args, **m.kwargs)
                      for m in request.node.iter_markers("fsdp_known")]
        callspec = getattr(request.node, "callspec", None)
        param = callspec.params.get("fsdp_world_size") if callspec is not None else None
        self.default_world_sizes = [param] if param is not None else None
        self.results: list = []

    def _record(self, result) -> None:
        self.results.append(result)
        self._request.config.stash[_RESULTS].append(result)

    def rerun(self, case) -> str:
        return f"pytest '{self._request.node.nodeid}' --fsdp-case '{case.id}'"

    def _pairs(self, world_sizes):
        from .roundtrip import DEFAULT_PAIRS, world_size_pair

        pairs = [world_size_pair(w) for w in (world_sizes or self.default_world_sizes
                                              or DEFAULT_PAIRS[self.tier])]
        if self.allowed is not None:
            kept = [p for p in pairs if set(p) <= self.allowed]
            if not kept:
                pytest.skip(f"no world-size pair of {pairs} within --fsdp-world-sizes "
                            f"{','.join(map(str, sorted(self.allowed)))}")
            pairs = kept
        return pairs

    def _fail_clean(self, fn, *args, **kwargs):
        from .roundtrip import RoundtripFailure

        try:
            return fn(*args, **kwargs)
        except RoundtripFailure as exc:
            message = str(exc)
        pytest.fail(message, pytrace=False)  # outside the except: no chained repeat

    def __call__(self, model, data, *, world_sizes=None, **kwargs) -> list:
        """Round-trip ``model`` (see ``roundtrip.check``); returns the CaseResults."""
        from .roundtrip import check

        kwargs.setdefault("tier", self.tier)
        results = self._fail_clean(
            check, model, data, world_sizes=self._pairs(world_sizes), backend=self.backend,
            timeout=self.timeout, known=self.known, only=self.only, rerun=self.rerun,
            on_result=self._record, **kwargs)
        if self.only and not results:
            pytest.skip(f"no case of this test matches --fsdp-case {self.only}")
        return results

    def check(self, case, user=None, custom=None):
        """Run one ready ``Case`` (a zoo model, or ``user``'s; through a built-in path or
        ``custom``); fail the test if a property fails. Returns the CaseResult."""
        from .roundtrip import run_checked

        if self.allowed is not None and not {case.world_size, case.dst_world_size} <= self.allowed:
            pytest.skip(f"{case.id}: world sizes outside --fsdp-world-sizes")
        return self._fail_clean(run_checked, [case], user, custom, backend=self.backend,
                                timeout=self.timeout, known=self.known, rerun=self.rerun,
                                on_result=self._record)[0]


@pytest.fixture
def fsdp_roundtrip(request) -> Roundtrip:
    """Round-trip your model's optimizer state through FSDP and judge P1-P11 (see
    ``Roundtrip``)."""
    return Roundtrip(request)


@pytest.fixture
def fsdp_case(request):
    """``fsdp_case(case)``: run a zoo ``Case`` as the conformance run does (known.py
    applies; a known limitation that no longer reproduces fails as "fixed upstream?")."""
    rt = Roundtrip(request)

    def run(case):
        r = rt.check(case)
        fixed = {p: v for p, v in r.properties.items() if v.fixed_upstream}
        if fixed:
            pytest.fail(f"{case.id}: fixed upstream? " + "; ".join(
                f"{p}: known limitation {v.known!r} did not reproduce" for p, v in fixed.items())
                + " -- retire the entry in fsdp_conformance/known.py", pytrace=False)
        return r

    return run


# --------------------------------------------------------------------------- report
def _encode(r) -> dict:
    return {"case": r.case.to_dict(), "timings": dict(r.timings),
            "properties": {p: [v.status, v.detail, v.known] for p, v in r.properties.items()}}


def _decode(d: dict):
    from .cases import Case
    from .properties.verdict import Verdict
    from .report.run_report import CaseResult

    return CaseResult(Case(**d["case"]), {p: Verdict(*v) for p, v in d["properties"].items()},
                      d["timings"])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist controller: collect a worker's results for the report."""
    data = getattr(node, "workeroutput", {}).get("fsdpc_results")
    if data:
        node.config.stash[_RESULTS].extend(_decode(d) for d in json.loads(data))


def write_report(config, path: str) -> None:
    from .properties.run_props import TOLERANCES
    from .report.run_report import build_report, write_run_report

    results = config.stash[_RESULTS]
    sizes = sorted({w for r in results for w in (r.case.world_size, r.case.dst_world_size)})
    report = build_report(
        results, tier=tier(config), backend=backend(config) or "gloo", seed=0,
        world_sizes=sizes, wall_time_s=time.time() - config.stash[_STARTED],
        argv=["pytest", *config.invocation_params.args],
        selection=config.getoption("keyword", default=None) or None,
        tolerances={k: {"rtol": r, "atol": a} for k, (r, a) in TOLERANCES.items()})
    write_run_report(report, path, os.path.splitext(path)[0] + ".md")


def pytest_sessionfinish(session, exitstatus) -> None:
    config = session.config
    try:
        if hasattr(config, "workerinput"):  # xdist worker: hand results to the controller
            config.workeroutput["fsdpc_results"] = json.dumps(
                [_encode(r) for r in config.stash[_RESULTS]])
        else:
            path = _opt(config, "fsdp_report")
            if path:
                write_report(config, str(path))
    finally:
        registry = sys.modules.get("fsdp_conformance.harness.registry")
        if registry is not None and not config.stash.get(_NESTED, False):
            registry.close_pools()
