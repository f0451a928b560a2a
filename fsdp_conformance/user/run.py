"""Running one user case on the shared pools through the one lifecycle (run/lifecycle.py):
save, load and judge it in the controller. Never raises for a torch or rank failure.

Rules
- Zoo cases without a custom path run as any case of the conformance run (``kind_of``).
- A user model through a built-in path is a ``UserModelKind`` case; the user's own
  save/load functions a ``CustomPathKind`` case (user/kinds.py), and under a kill
  (``Case.crash``, P16) a ``CustomCrashKind`` case (user/crash_kind.py).
- Verdicts go through the known torch limitations (in the lifecycle), then through the
  declared limitations (``limitations.apply_declared``).
"""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from ..cases import Case
from ..run.kinds import kind_of
from ..run.lifecycle import CaseEnv, execute
from .crash_kind import CustomCrashKind
from .kinds import CustomPathKind, UserModelKind
from .limitations import Limitation, apply_declared, known_view
from .model import CustomPath, UserModel
from ..options import RunOptions


def run_user_case(case: Case, user: UserModel | None = None, custom: CustomPath | None = None,
                  options: RunOptions = RunOptions.for_user(), *,
                  declared: Sequence[Limitation] = (), hits: set | None = None):
    """Save, load and judge one case on the shared pools (module rules); its CaseResult."""
    rundir = Path(tempfile.mkdtemp(prefix="fsdpc-rt-"))
    try:
        env = CaseEnv(rundir=rundir, options=options)
        if custom is not None and case.crash:
            kind = CustomCrashKind(custom=custom, user=user)
        elif custom is not None:
            kind = CustomPathKind(custom=custom, user=user)
        elif user is not None:
            kind = UserModelKind(user=user)
        else:
            kind = kind_of(case)
        r = execute(case, env, kind)
        return dataclasses.replace(r, properties=apply_declared(
            r.properties, declared, hits, case=known_view(case, user)),
            setup=describe_setup(case, user, custom))
    finally:
        shutil.rmtree(rundir, ignore_errors=True)


def _name(ref) -> str | None:
    return None if ref is None else ref.target


def describe_setup(case: Case, user: UserModel | None, custom: CustomPath | None) -> dict:
    """A user's case as the user set it up, for the report (``CaseResult.setup``): the
    case's fields name the suite's axes (``scheduler`` "exp" is "a scheduler steps", the
    zoo's where the user gave none; ``app_state`` is the run's own DCP app-state path), so
    this says whose pieces ran and what the user's checkpoint holds."""
    out: dict = {}
    if user is not None:
        out.update(model=_name(user.factory), data=_name(user.data),
                   optimizer=(user.optimizer if isinstance(user.optimizer, str)
                              else _name(user.optimizer)),
                   loss=_name(user.loss) or "the suite's (mean square of the output)",
                   shard_fn=_name(user.shard_fn), traits=list(user.traits))
    if case.scheduler:
        mine = user is not None and user.scheduler is not None
        out["scheduler"] = (_name(user.scheduler) if mine else
                            f"the zoo's {case.scheduler!r} (you gave none; a training-state "
                            f"checkpoint must hold one)")
    else:
        out["scheduler"] = None
    if custom is not None:
        out.update(save_fn=_name(custom.save), load_fn=_name(custom.load),
                   load_model=_name(custom.load_model),
                   checkpoint=("the training state (model, optimizer, scheduler, step)"
                               if custom.app_state else "the optimizer only"),
                   scheduler_built=("after load_fn, from the step it restored"
                                    if case.scheduler_after_load else
                                    "before load_fn, which restores it") if case.scheduler
                   else None)
    else:
        out["checkpoint"] = f"the built-in path {case.api}"
    out["checkpoints_in_chain"] = case.links
    return out

