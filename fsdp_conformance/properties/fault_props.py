"""P15: a load of damaged input (run/faults.py damages it) must fail on every rank, quickly,
with an error that names the problem.

Rule: pass when every rank raised, quickly, and the error names the problem (the param or
key for dict faults; for file faults the file's name or a word that says the file is
damaged: corrupt, truncated, archive, EOF, checksum...). Fail when the load succeeded (a
silent wrong load), when some ranks raised while others were left waiting (a hang in the
making), when a rank died, when it timed out, or when the error does not name the offending
param or key.
"""
from __future__ import annotations

import re
from typing import Any

from ..cases import Case
from ..harness.errors import RankError, RankTimeout
from .verdict import Verdict, fail, passed


_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Warning)\b.*")
# Words that say a file is damaged, for file faults (the file's name counts too).
_FILE_WORDS = ("corrupt", "truncat", "archive", "zip", "eof", "central directory", "checksum",
               "crc", "unexpected end")


def exception_line(text: str) -> str:
    """The exception line of a traceback (its last ``SomeError: ...`` line)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    hits = [ln for ln in lines if _EXC_LINE.match(ln)]
    return hits[-1] if hits else (lines[-1] if lines else text)


def sorted_failures(outcome: RankError) -> tuple[list, list, list, str]:
    """A failed load's ranks by what happened: (raised, stuck: left waiting or hung, died),
    and each raising rank's exception line, one per line."""
    raised = [f for f in outcome.failures if f.kind.startswith("exception")]
    stuck = [f for f in outcome.failures if f.kind in ("stuck-after-error", "hung")]
    died = [f for f in outcome.failures if f.kind == "died"]
    msgs = "\n".join(f"rank {f.rank}: {exception_line(f.detail)}" for f in raised)
    return raised, stuck, died, msgs


def died_while_loading(desc: str, died: list, msgs: str) -> Verdict:
    """The failure of a load where rank processes died (P15, P16: one wording)."""
    return fail(f"{desc}: rank(s) {[f.rank for f in died]} died while loading "
                f"({died[0].detail.strip()[:200]}):\n{msgs}")


def left_waiting(desc: str, raised: list, stuck: list, msgs: str) -> Verdict:
    """The failure of a load where some ranks raised and others were left in a collective
    (P15, P16: one wording, the one the strand entries' ``STRANDED`` headline matches)."""
    return fail(f"{desc}: rank(s) {[f.rank for f in raised]} raised but rank(s) "
                f"{[f.rank for f in stuck]} were left waiting in a collective:\n{msgs}")


def p15_verdict(case: Case, what: dict[str, Any], outcome: Any) -> Verdict:
    """Judge the load of damaged input (module docstring)."""
    desc = f"{what['kind']} in {what['file']}" + (f" ({what['names'][0]})" if what["names"] else "")
    if isinstance(outcome, RankTimeout):
        return fail(f"{desc}: the load hung (no rank finished in time):\n{outcome}")
    if not isinstance(outcome, RankError):
        return fail(f"{desc}: loaded silently on every rank: no error was raised")
    raised, stuck, died, msgs = sorted_failures(outcome)
    if died:
        return died_while_loading(desc, died, msgs)
    quiet = sorted(set(range(case.dst_world_size)) - {f.rank for f in outcome.failures})
    if quiet:
        return fail(f"{desc}: rank(s) {[f.rank for f in raised]} raised but rank(s) {quiet} "
                    f"loaded silently:\n{msgs}")
    if stuck:
        return left_waiting(desc, raised, stuck, msgs)
    text = "\n".join(exception_line(f.detail) for f in raised)
    if what["names"]:
        if not any(str(n) in text for n in what["names"]):
            return fail(f"{desc}: every rank raised, but the error does not name "
                        f"{what['names'][0]!r}:\n{msgs}")
    elif not (what["file"] in text or any(w in text.lower() for w in _FILE_WORDS)):
        return fail(f"{desc}: every rank raised, but the error names neither the file nor "
                    f"the damage:\n{msgs}")
    return passed(f"{desc}: every rank raised a clear error:\n{msgs}")
