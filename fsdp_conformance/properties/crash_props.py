"""P16: after a save killed at a chosen point (sut/crash_points.py), the load must restore the
newest checkpoint that is complete on disk exactly, or fail with an error that says the
checkpoint is incomplete. Decided by the crash cases (run/crash_kind.py, user/crash_kind.py).

Rules
- Save 1 completed (at step N); save 2 (step N + 1) was killed at its point. Save 2 is
  complete on disk only where every file its whole copy wrote is there with the same bytes
  and any DCP ``.metadata`` is its own commit (``run.crash_kind.complete_on_disk``: a save
  whose ranks but one had written everything, and the killed rank had nothing to write, is
  complete); the newest complete save is then save 2, else save 1.
- The state a correct load gives rank r from each save is the reference's
  (``FamilyReference.loaded_shard`` of the full dict that save wrote: save 2's from its
  whole copy), compared bitwise as P3 compares.
- The load returned on every rank: pass only where every rank holds the newest complete
  save's state. The other save on every rank (save 2's data read through what save 1
  committed; save 1 although save 2 is complete), a mix (each entry one save's, named by
  key and save; a tensor pieced from both) or entries that are neither save's fail, each
  with a headline of its own and the keys that came from which save.
- The load raised: where save 2 is incomplete, pass when every rank that raised names the
  damage or the missing file (``INCOMPLETE_WORDS``, or the file's name) and no rank died or
  was left waiting; a rank that returned beside them is named (the job stops on the error;
  its state is not judged). A hang, a rank left waiting in a collective, a dead rank, an
  error that does not say the checkpoint is incomplete, or any error where save 2 is
  complete on disk fail.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ..harness.errors import RankError, RankTimeout
from .fault_props import died_while_loading, exception_line, left_waiting, sorted_failures
from .verdict import Verdict, fail, passed

INCOMPLETE_WORDS = ("metadata", "no such file", "not found", "does not exist", "incomplete",
                    "corrupt", "truncat", "eof", "unexpected end", "zip", "archive",
                    "central directory", "checksum", "crc", "unpickl", "failed reading")
"""Words that say a checkpoint is incomplete or damaged, in a rank's exception line."""

_WHOLE = {"save 1": "save 1", "save 2": "save 2", "mix": "both saves"}
_ABSENT = object()  # a key one save does not have
_SHOWN = 8  # keys listed per save in a mix
_FROM = {"save 1": "from save 1", "save 2": "from save 2",
         "both": "with elements of both saves", "neither": "from neither save"}


def classify(got: dict, want_1: dict, want_2: dict) -> tuple[str, dict[str, list[str]]]:
    """Which save ``got`` is: ``"save 1"``, ``"save 2"``, ``"mix"`` or ``"neither"``, and
    the entries (by key) that came from each: ``"save 1"``, ``"save 2"``, ``"both"`` (a
    tensor whose every element is one save's, some of each) and ``"neither"`` (a value, an
    element, a shape or a key no save has there). Entries equal in both saves count for
    neither list."""
    keys: dict[str, list[str]] = {"save 1": [], "save 2": [], "both": [], "neither": []}
    a, b, g = _leaves(want_1), _leaves(want_2), _leaves(got)
    for k in sorted(set(a) | set(b) | set(g), key=str):
        if k not in g or (k not in a and k not in b):
            keys["neither"].append(k)
            continue
        same_1, same_2 = _elements(g[k], a.get(k, _ABSENT)), _elements(g[k], b.get(k, _ABSENT))
        if same_1 is True and same_2 is True:
            continue
        if same_1 is True:
            keys["save 1"].append(k)
        elif same_2 is True:
            keys["save 2"].append(k)
        elif same_1 is not False and same_2 is not False and bool((same_1 | same_2).all()):
            keys["both"].append(k)
        else:
            keys["neither"].append(k)
    if keys["neither"]:
        return "neither", keys
    if not keys["save 2"] and not keys["both"]:
        return "save 1", keys
    if not keys["save 1"] and not keys["both"]:
        return "save 2", keys
    return "mix", keys


def _leaves(d: Any, prefix: str = "") -> dict[str, Any]:
    """``{key path: value}`` of every leaf of nested dicts and lists (``state['fc.w']['step']``
    style, as the state diffs name them)."""
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_leaves(v, f"{prefix}[{k!r}]" if prefix else repr(k) if not
                               isinstance(k, str) else k))
        return out
    if isinstance(d, (list, tuple)):
        out = {}
        for i, v in enumerate(d):
            out.update(_leaves(v, f"{prefix}[{i}]"))
        return out
    return {prefix: d}


def _elements(got: Any, want: Any) -> Any:
    """True where ``got`` equals ``want`` bitwise (tensors: dtype, shape and every element,
    NaN equal to NaN), False where they cannot be compared element by element or a plain
    value differs, else the boolean tensor of equal elements."""
    import torch

    if want is _ABSENT:
        return False
    if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
        if got.dtype != want.dtype or got.shape != want.shape:
            return False
        same = (got == want) | (torch.isnan(got) & torch.isnan(want)) \
            if got.is_floating_point() else got == want
        return True if bool(same.all()) else same
    if isinstance(got, torch.Tensor) or isinstance(want, torch.Tensor):
        return False
    return got == want


def _listed(keys: list[str]) -> str:
    more = f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else ""
    return ", ".join(keys[:_SHOWN]) + more


def p16_verdict(desc: str, outcome: Any, views: Callable[[Any], tuple[dict, dict, dict]],
                world_size: int, *, incomplete: str, files: Sequence[str] = ()) -> Verdict:
    """P16 of the load after the kill (module rules). ``desc``: the kill in words;
    ``outcome``: the load's records (``sut.records.LoadRecord``, one per rank) or the pool's
    ``RankError``; ``views(record)``: save 1's and save 2's state for the record's rank and
    what it loaded, each in the view the reference compares (the weights too, where the
    load under test restores them); ``files``: the checkpoint's file names an error may
    name; ``incomplete``: what save 2 lacks on disk ("": it is complete)."""
    newest = "save 1" if incomplete else "save 2"
    state = (f"save 2 is not complete on disk ({incomplete})" if incomplete else
             "save 2 is complete on disk (every file written, its own commit)")
    if isinstance(outcome, RankTimeout):
        return fail(f"{desc}: the load hung (no rank finished in time):\n{outcome}")
    if isinstance(outcome, RankError):
        if not incomplete:
            return fail(f"{desc}: the load raised although save 2 is complete on disk:\n"
                        f"{sorted_failures(outcome)[3] or outcome}")
        return _raised(desc, outcome, world_size, files, state)
    kinds: dict[str, list[int]] = {}
    lines = []
    for rec in outcome:
        want_1, want_2, got = views(rec)
        kind, keys = classify(got, want_1, want_2)
        kinds.setdefault(kind, []).append(rec.rank)
        if kind != newest:
            lines += [f"rank {rec.rank}: {len(v)} {_FROM[who]}: {_listed(v)}"
                      for who, v in keys.items() if v]
    ranks = sorted(r for rs in kinds.values() for r in rs)
    body = "\n".join(lines)
    if set(kinds) == {newest}:
        return passed(f"{desc}: restored {newest} exactly on every rank ({len(ranks)} "
                      f"rank(s), bitwise); {state}")
    if "neither" in kinds:
        return fail(f"{desc}: loaded silently state that is neither save's on rank(s) "
                    f"{kinds['neither']}; {state}:\n{body}")
    if set(kinds) == {"save 2"}:
        return fail(f"{desc}: loaded silently save 2 on every rank, although {state}:\n{body}")
    if set(kinds) == {"save 1"}:
        return fail(f"{desc}: loaded save 1 on every rank, although {state}:\n{body}")
    where = ", ".join(f"{_WHOLE[k]} on rank(s) {kinds[k]}" for k in ("save 1", "save 2", "mix")
                      if k in kinds)
    return fail(f"{desc}: loaded silently a mix of save 1 and save 2 ({where}); {state}:\n"
                f"{body}")


def _raised(desc: str, outcome: RankError, world_size: int, files: Sequence[str],
            state: str) -> Verdict:
    raised, stuck, died, msgs = sorted_failures(outcome)
    if died:
        return died_while_loading(desc, died, msgs)
    if stuck:
        return left_waiting(desc, raised, stuck, msgs)
    unclear = [f.rank for f in raised if not _says_incomplete(exception_line(f.detail), files)]
    if unclear:
        return fail(f"{desc}: rank(s) {unclear} raised an error that does not say the "
                    f"checkpoint is incomplete:\n{msgs}")
    quiet = sorted(set(range(world_size)) - {f.rank for f in outcome.failures})
    also = (f"\nrank(s) {quiet} returned from the load (not judged: the job stops on the "
            f"error)" if quiet else "")
    return passed(f"{desc}: the load refused the incomplete checkpoint with a clear error; "
                  f"{state}:\n{msgs}{also}")


def _says_incomplete(line: str, files: Sequence[str]) -> bool:
    low = line.lower()
    return any(w in low for w in INCOMPLETE_WORDS) or any(f and f in line for f in files)


def views_of(refs: Any, saved: Sequence[Any], weights: Sequence[dict | None] = ()
             ) -> Callable[[Any], tuple[dict, dict, dict]]:
    """``views(record)`` for ``p16_verdict``: for the record's rank, each save's state as a
    correct load at the load layout of ``refs`` (the case's ``FamilyRefs``) gives it (the
    reference's ``loaded_shard`` of the full dict the save wrote: ``saved``, one
    ``properties.view.Saved`` per save; a file per rank: that rank's own), and the loaded
    state, in the reference's compared view. ``weights``: each save's full params (rank
    0's), where the load under test restores the weights: rank 0's loaded params
    (``params_loaded``) are compared too."""
    fam, dst = refs.family, refs.dst

    def source(s, rank: int) -> dict:
        return s.per_rank.get(rank, s.full) if s.per_rank else s.full

    def views(rec) -> tuple[dict, dict, dict]:
        want = [fam.vs_reference(fam.loaded_shard(dst, source(s, rec.rank), rec.rank,
                                                  refs.exp), dst, rec.rank) for s in saved]
        got = fam.vs_reference(rec.loaded, dst, rec.rank)
        if weights and rec.rank == 0 and getattr(rec, "params_loaded", None) is not None:
            want = [{**w, "weights": p} for w, p in zip(want, weights)]
            got = {**got, "weights": rec.params_loaded}
        return want[0], want[1], got

    return views
