"""What a rank's failure in a user's stage reads as: each rank that died or raised, the ranks
left waiting, and the frames of the user's own code.

Rules
- A rank that died is the cause: the others' errors (a peer's "Connection reset") follow
  from it, and its log's faulthandler stack says where it died.
- A traceback is cut to the user's own frames (not this package's, not an installed
  library's), then the frame that raised and the exception.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..properties.fault_props import exception_line


def _tail(tb: str, lines: int = 12) -> str:
    return "\n".join(tb.strip().splitlines()[-lines:])


_FRAME = re.compile(r'\s*File "(?P<file>[^"]+)", line \d+, in .*')
_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])


def _library_frame(path: str) -> bool:
    return ("site-packages" in path or "dist-packages" in path or path.startswith(_PACKAGE_DIR)
            or path.startswith("<") or "/lib/python3" in path)


def user_frames(tb: str, tail: int = 4) -> str:
    """A traceback cut to what the user needs: the frames of the user's own code (not this
    package's, not an installed library's), then the frame that raised and the exception.
    The whole traceback's last lines when no user frame is in it."""
    # Python 3.11's position markers (^^^, ~~~) point into lines this cut may drop
    lines = [ln for ln in tb.strip().splitlines() if ln.strip(" ^~")]
    keep, i = [], 0
    while i < len(lines):
        m = _FRAME.match(lines[i])
        if m and not _library_frame(m.group("file")):
            keep.append(lines[i])
            if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]):
                keep.append(lines[i + 1])
                i += 1
        i += 1
    if not keep:
        return "\n".join(lines[-8:])
    frames = [j for j, ln in enumerate(lines) if _FRAME.match(ln)]
    last = lines[frames[-1]:] if frames else lines[-tail:]
    if last and last[0] in keep:  # it raised in the user's own frame
        return "\n".join(["your code:"] + keep + last[2:])
    return "\n".join(["your code:"] + keep + ["where it raised:"] + last)


def _crash_site(log: str, n: int = 10) -> str:
    """The first ``n`` lines of the faulthandler report in a dead rank's log (innermost
    frame first: where it died), or the log's last ``n`` lines when there is none."""
    lines = log.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith(("Fatal Python error", "Current thread", "Thread 0x"))), None)
    return "\n".join(lines[start:start + n] if start is not None else lines[-n:])


def rank_error_text(exc) -> str:
    """A RankError as: each rank that died (how: a signal, an exit code) and the last lines
    of its log (a faulthandler stack), each raising rank's exception line, the ranks left
    waiting, then the first traceback's user frames. A rank that died is the cause: the
    others' errors (a peer's "Connection reset") follow from it."""
    fails = list(getattr(exc, "failures", []))
    died = [f for f in fails if f.kind == "died"]
    raised = [f for f in fails if f.kind.startswith("exception")]
    waiting = [f for f in fails if f not in died and f not in raised]
    lines = [f"rank {f.rank}: died, {f.detail.strip()}" for f in died]
    lines += [f"rank {f.rank}: {exception_line(f.detail)}" for f in raised]
    if waiting:
        lines.append(f"rank(s) {[f.rank for f in waiting]}: {waiting[0].kind} "
                     f"(blocked in a collective the failing rank never joined?)")
    if died and died[0].log_tail.strip():
        lines += [f"rank {died[0].rank}'s log, where it died:", _crash_site(died[0].log_tail)]
    if raised and not died:
        lines += ["traceback of rank %d:" % raised[0].rank, user_frames(raised[0].detail)]
    elif waiting and not died:
        lines.append(_tail(waiting[0].detail, 8))
    return "\n".join(lines) or str(exc)
