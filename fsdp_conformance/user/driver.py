"""The round trip of a user's own model (and, optionally, their own save/load code) through
FSDP optimizer-state checkpointing, judged by the conformance properties: ``check``. The
library behind the pytest plugin's ``fsdp_roundtrip`` fixture and ``FSDPTestCase``; it works
without pytest too::

    from fsdp_conformance import check
    check("mypkg.models:make_model", "mypkg.models:batch", plan=["encoder", "head"],
          optimizer="mypkg.models:make_optimizer")      # raises RoundtripFailure on a failure

Rules
- Everything the ranks need crosses as an import reference (``refs.Ref``); the user model is
  checked and named in the controller (``model.user_model``).
- Built-in API paths (``sut.roundtrip``): every property of ``runner.evaluate``. The user's own
  save/load (``model.CustomPath``): see ``verdicts``.
- Verdicts go through ``known/entries.py``, then through the limitations the caller declares
  (``limitations.Limitation``); a failing property, or a strict declared limitation that
  matches nothing, raises ``RoundtripFailure`` with every failing case's detail, a rerun line
  and a standalone reproducer.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..cases import Case
from .cases import user_cases
from .check_options import CheckOptions
from .failures import RoundtripFailure, failing, failure_message
from .limitations import Limitation
from .model import CustomPath, UserModel, user_model
from .protocols import DataFn, LoadFn, ModelFactory, Rerun, ResultSink, SaveFn
from .run import run_user_case
from ..options import DEFAULT_TIMEOUT_S, RunOptions


def check(model: ModelFactory | str | None = None, data: DataFn | str | None = None, *,
          options: CheckOptions | None = None, **fields: Any) -> list:
    """Round-trip a user's model through the chosen paths and world-size specs (or through
    their own ``save_fn``/``load_fn``), judge every property and raise
    :class:`RoundtripFailure` if any fails. Returns the CaseResults.

    Everything besides the model and the data factories is a field of
    :class:`CheckOptions` (user/check_options.py: one docstring per field), given as keyword
    arguments (``check(make_model, batch, plan=["encoder"], world_sizes=["2->3"])``) or as
    ``options=`` (keyword arguments then replace its fields). ``fsdp_version`` 2 (the
    default) shards with ``fully_shard`` on a DeviceMesh, 1 with FSDP1;
    ``save_fn(state, directory)`` / ``load_fn(state, directory)`` checkpoint the whole
    training state (``TrainState``), ``(model, optimizer, directory)`` functions the
    optimizer only."""
    if model is None or data is None:
        raise TypeError("check needs a model factory and a data factory")
    o = CheckOptions.of(options, **fields)
    user = user_model(model, data, plan=o.plan, load_plan=o.load_plan, optimizer=o.optimizer,
                      loss=o.loss, ignored=o.ignored, name=o.name, shard_fn=o.shard_fn,
                      scheduler=o.scheduler)
    custom = (CustomPath.of(o.save_fn, o.load_fn, o.custom_name, family=f"fsdp{o.fsdp_version}",
                            setup=o.setup_fn)
              if o.save_fn is not None else None)
    cases = user_cases(user, paths=o.paths, world_sizes=o.world_sizes,
                       use_orig_params=o.use_orig_params, custom=custom, steps=o.steps,
                       resume_steps=o.resume_steps, batch=o.batch, dtype=o.dtype, seed=o.seed,
                       groups=o.groups, tier=o.tier, fsdp_version=o.fsdp_version,
                       links=o.links, scheduler_after_load=o.scheduler_after_load,
                       crash=o.crash)
    if o.on_cases is not None:
        o.on_cases([c.id for c in cases])
    if o.only:
        cases = [c for c in cases if c.id in set(o.only)]
    run_options = RunOptions.for_user(backend=o.backend, timeout=o.timeout)
    return run_checked(cases, user, custom, run_options, known=o.known, rerun=o.rerun,
                       on_result=o.on_result)


ZOO_SWEEP = ("mlp", "tied", "frozen", "late_frozen", "unused", "buffers", "conv")
"""The zoo models ``check_zoo`` runs a user's save/load on: nested wrapping, tied weights,
frozen and late-frozen params, a param the forward never uses, buffers (and an ignored
module), convolutions."""


def zoo_cases(custom: CustomPath, *, models: Sequence[str] = ZOO_SWEEP,
              world_sizes: Sequence = ("2", "2->3"), optimizer: str = "adamw",
              seed: int = 0, links: int = 2) -> list[Case]:
    """The cases of a zoo sweep (``check_zoo``): each zoo model wrapped per submodule
    ("nested") at each world-size spec, plus the extras that change what a save meets: two
    param groups, and bfloat16 params (on "mlp"); each a chain of ``links`` checkpoints
    (``CheckOptions.links``)."""
    from .spec import parse_sizes
    from ..zoo import MODELS

    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise ValueError(f"models {unknown} are not zoo models; the zoo has {sorted(MODELS)}")
    out = []
    for n, m, hsdp in (parse_sizes(w) for w in world_sizes):
        common = dict(api=custom.api, optimizer=optimizer, plan="nested", world_size=n,
                      load_world_size=m if m != n else None, seed=seed,
                      strategy="HYBRID_SHARD" if hsdp else "FULL_SHARD",
                      scheduler=custom.app_state, links=links)
        out += [Case(model=name, **common) for name in models]
        if "mlp" in models:
            out += [Case(model="mlp", groups=2, **common),
                    Case(model="mlp", dtype="bf16", **common)]
    return out


def check_zoo(save_fn: SaveFn | str, load_fn: LoadFn | str, *,
              models: Sequence[str] = ZOO_SWEEP, world_sizes: Sequence = ("2", "2->3"),
              optimizer: str = "adamw", fsdp_version: int = 2, custom_name: str | None = None,
              seed: int = 0, links: int = 2, setup_fn=None, backend: str | None = None,
              timeout: float = DEFAULT_TIMEOUT_S,
              known: Sequence = (), only: Sequence[str] | None = None,
              rerun: Rerun | None = None, on_result: ResultSink | None = None,
              on_cases=None) -> list:
    """Run the user's own ``save_fn`` / ``load_fn`` on the suite's zoo models
    (``zoo_cases``: buffers, tied weights, frozen and late-frozen params, an unused param,
    two param groups, bfloat16, HSDP with an "RxS" spec; each a chain of ``links``
    checkpoints; through ``setup_fn`` where given, the user's own construction) instead of
    their own model, so a save
    path that breaks on a buffer or a frozen param is found before their next model meets
    it; judged as ``check`` judges a custom path. Raises :class:`RoundtripFailure` naming
    each case that failed."""
    custom = CustomPath.of(save_fn, load_fn, custom_name, family=f"fsdp{fsdp_version}",
                           setup=setup_fn)
    cases = zoo_cases(custom, models=models, world_sizes=world_sizes, optimizer=optimizer,
                      seed=seed, links=links)
    if on_cases is not None:  # CheckOptions.on_cases
        on_cases([c.id for c in cases])
    if only:
        cases = [c for c in cases if c.id in set(only)]
    options = RunOptions.for_user(backend=backend, timeout=timeout)
    return run_checked(cases, None, custom, options, known=known, rerun=rerun,
                       on_result=on_result)


def run_checked(cases: Sequence[Case], user: UserModel | None = None,
                custom: CustomPath | None = None, options: RunOptions = RunOptions.for_user(),
                *, known: Sequence = (), rerun: Rerun | None = None,
                on_result: ResultSink | None = None) -> list:
    """Run ``cases``; raise :class:`RoundtripFailure` if any property fails or errors, or if
    a strict declared limitation matched nothing."""
    declared = [Limitation.of(k) if not isinstance(k, Limitation) else k for k in known]
    hits: set = set()
    results = []
    for case in cases:
        r = run_user_case(case, user, custom, options, declared=declared, hits=hits)
        results.append(r)
        if on_result is not None:
            on_result(r)
    if any(failing(r) for r in results):
        raise RoundtripFailure(failure_message(results, user=user, custom=custom, rerun=rerun),
                               results, brief=failure_message(results, user=user, custom=custom,
                                                              rerun=rerun, scripts=False))
    unused = [d for d in declared if d.strict and d.key not in hits]
    if unused and results:
        raise RoundtripFailure(
            "declared known limitation(s) did not reproduce in any case: "
            + ", ".join(repr(d.key) for d in unused)
            + "\n(fixed upstream? remove the declaration, or pass strict=False)\ncases: "
            + ", ".join(r.case.id for r in results), results)
    return results


def reproduce(case: Case, user: UserModel | None = None, custom: CustomPath | None = None,
              *, backend: str | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> int:
    """Run one case, print every verdict; 0 if none fails or errors, else 1 (what the
    reproducers printed by failure messages call)."""
    r = run_user_case(case, user, custom, RunOptions.for_user(backend=backend, timeout=timeout))
    for p, v in r.properties.items():
        print(f"{p:>4} {v.status:6} {v.detail.splitlines()[0] if v.detail else ''}")
    bad = failing(r)
    if bad:
        print("\n" + failure_message([r], user=user, custom=custom))
    return 1 if bad else 0
