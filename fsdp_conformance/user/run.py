"""Running one user case on the shared pools through the one lifecycle (run/lifecycle.py):
save, load and judge it in the controller. Never raises for a torch or rank failure.

Rules
- Zoo cases without a custom path run as any case of the conformance run (``kind_of``).
- A user model through a built-in path is a ``UserModelKind`` case; the user's own
  save/load functions a ``CustomPathKind`` case (user/kinds.py).
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
        if custom is not None:
            kind = CustomPathKind(custom=custom, user=user)
        elif user is not None:
            kind = UserModelKind(user=user)
        else:
            kind = kind_of(case)
        r = execute(case, env, kind)
        return dataclasses.replace(r, properties=apply_declared(
            r.properties, declared, hits, case=known_view(case, user)))
    finally:
        shutil.rmtree(rundir, ignore_errors=True)
