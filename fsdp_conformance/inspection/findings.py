"""The findings every input format shares (:func:`findings_for`), and a zip member
failing its CRC-32 (:func:`damage_findings`).

Rules
-----
Findings: ``warning`` (``strict`` turns any into exit 1) or ``note`` (a fact that is normal
  for what it names): an empty ``state``; params listed in a group with no state (a note
  when the optimizer is stateless, SGD with momentum 0, or LBFGS with state under its first
  param only); state for a param in no group; a
  param in two groups; an empty group; int and str keys mixed; params whose state has
  different names (a note for Adafactor's two forms); ``step`` differing across params or ranks; ``step`` stored as a Python
  number for some params and a tensor for others; NaN/Inf in a state tensor; per-element
  state in several floating dtypes; names with FSDP wrapper prefixes; one rank's part of a
  sharded checkpoint in a single file; a zip member failing its CRC-32; param groups or
  steps that disagree across ranks; a ShardedTensor or DTensor world size other than the
  number of files; rank files with a gap in their numbering; state on some ranks only (a
  note).
(The per-rank and one-file findings are made where those formats are read: ``per_rank``,
``one_file``.)
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

from ..reshard.inputs import WRAPPER_PREFIXES
from .describe import FLAT_MARKER, group_index, is_stateless
from .load import LoadedFile
from .summary import Finding, GroupInfo, ParamInfo

_ADAFACTOR_STATES = {("col_var", "row_var", "step"), ("step", "variance")}
"""The two state forms of torch.optim.Adafactor (optim/_adafactor.py: factored for a param
of 2 or more dims, unfactored for a 1-D one)."""


def damage_findings(files: Sequence[Path], loaded: Sequence[LoadedFile]) -> list[Finding]:
    return [Finding(level="warning", code="crc-mismatch",
                    message=f"{f}: zip member {lf.damaged!r} fails its CRC-32 check: the file "
                            "changed after torch.save wrote it; values read from it may be wrong")
            for f, lf in zip(files, loaded) if lf.damaged]


def few(items: Iterable, n: int = 6) -> str:
    items = list(items)
    s = ", ".join(repr(x) for x in items[:n])
    return s + (f", ... ({len(items)} in all)" if len(items) > n else "")


def findings_for(params: Sequence[ParamInfo], groups: Sequence[GroupInfo], key_type: str,
                 optimizer: str | None) -> list[Finding]:
    """The findings every format shares (see the module docstring)."""
    out: list[Finding] = []
    stateless = is_stateless(groups, optimizer)
    listed = group_index(groups)
    with_state = [p.key for p in params if p.state]
    if key_type == "mixed":
        keys = list(dict.fromkeys(list(listed) + with_state))
        out.append(Finding(level="warning", code="mixed-keys",
                           message=f"keys mix int ids "
                                   f"({few([k for k in keys if isinstance(k, int)], 3)}) "
                                   "and names "
                                   f"({few([k for k in keys if isinstance(k, str)], 3)}): "
                                   "no optimizer or FSDP API loads such a dict"))
    if not with_state:
        if stateless:
            out.append(Finding(level="note", code="empty-state",
                               message="state is empty: normal for SGD with "
                                       "momentum 0 (stateless)"))
        else:
            out.append(Finding(level="warning", code="empty-state",
                               message=f"state is empty{f' for {optimizer}' if optimizer else ''}: "
                                       "the optimizer never stepped, or its state was not saved"))
    else:
        have = set(with_state)
        missing = [k for k in listed if k not in have]
        held_once = optimizer == "LBFGS" and with_state == list(listed)[:1]
        if missing:
            level = "note" if stateless or held_once else "warning"
            why = ("normal for SGD with momentum 0" if stateless else
                   "normal for LBFGS, which holds its state once, under its first param"
                   if held_once else
                   "normal for frozen params and params that never got a gradient; otherwise "
                   "their state was lost")
            out.append(Finding(level=level, code="no-state",
                               message=f"{len(missing)} of {len(listed)} params in param groups "
                                       f"have no "
                                       f"state ({why}): {few(missing)}"))
    orphans = [k for k in with_state if k not in listed]
    if orphans:
        out.append(Finding(level="warning", code="not-in-group",
                           message=f"{len(orphans)} params have state but are in no param group: "
                                   f"{few(orphans)}"))
    twice = [k for k, gs in listed.items() if len(gs) > 1]
    if twice:
        out.append(Finding(level="warning", code="in-two-groups",
                           message=f"params listed in more than one param group: {few(twice)}"))
    for g in groups:
        if not g.params:
            out.append(Finding(level="warning", code="empty-group",
                               message=f"param group {g.index} has no params "
                                       f"(hyperparameters {few(sorted(g.hyper), 4)})"))
    names = Counter(tuple(sorted(s.name for s in p.state)) for p in params if p.state)
    if len(names) > 1:
        example = {n: next(p.key for p in params if tuple(sorted(s.name for s in p.state)) == n)
                   for n in names}
        factored = optimizer == "Adafactor" and set(names) <= _ADAFACTOR_STATES
        out.append(Finding(level="note" if factored else "warning", code="state-names-differ",
                           message="params hold different state: " + "; ".join(
                               f"{list(n)} x{c} (e.g. {example[n]!r})"
                               for n, c in names.most_common())
                           + (": normal for Adafactor (row_var and col_var for a param of 2 "
                              "or more dims, variance for a 1-D one)" if factored else "")))
    out += _step_findings(params)
    bad = [(p.key, s.name, s.nonfinite) for p in params for s in p.state if s.nonfinite]
    if bad:
        out.append(Finding(level="warning", code="nonfinite",
                           message=f"NaN/Inf in {len(bad)} state tensors: " + ", ".join(
                               f"{k!r}[{n!r}] ({c} elements)" for k, n, c in bad[:6])
                           + (" ..." if len(bad) > 6 else "")))
    dtypes = Counter(s.dtype for p in params for s in p.state
                     if s.per_element and s.dtype in _FLOAT_DTYPES)
    if len(dtypes) > 1:
        out.append(Finding(level="warning", code="dtype-mixture",
                           message="per-element state in several dtypes: " + ", ".join(
                               f"{d} x{n}" for d, n in sorted(dtypes.items()))))
    prefixed = [p.key for p in params if isinstance(p.key, str) and FLAT_MARKER not in p.key
                and any(w in p.key for w in WRAPPER_PREFIXES)]
    prefixed += [k for k in listed if isinstance(k, str) and FLAT_MARKER not in k
                 and any(w in k for w in WRAPPER_PREFIXES) and k not in prefixed]
    if prefixed:
        out.append(Finding(level="warning", code="wrapper-prefix",
                           message=f"{len(prefixed)} names carry wrapper prefixes "
                                   f"({few(WRAPPER_PREFIXES, 3)}): the wrapped model's names, not "
                                   "the plain FQNs a loader of another wrapping expects: "
                                   f"{few(prefixed, 3)}"))
    return out


_FLOAT_DTYPES = {"float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}


def _step_findings(params: Sequence[ParamInfo]) -> list[Finding]:
    out = []
    steps = [(p.key, p.step) for p in params if p.step is not None]
    values = Counter(v for _, v in steps)
    if len(values) > 1:
        first = {v: next(k for k, x in steps if x == v) for v in values}
        out.append(Finding(level="warning", code="step-disagree",
                           message="step differs across params: " + ", ".join(
                               f"{v!r} x{n} (e.g. {first[v]!r})" for v, n in values.most_common())))
    kinds = Counter(p.step_kind for p in params if p.step_kind is not None)
    if len(kinds) > 1:
        first = {k: next(p.key for p in params if p.step_kind == k) for k in kinds}
        out.append(Finding(level="warning", code="step-kind-mixed",
                           message="step is a tensor for some params and a Python number for "
                                   "others: "
                                   + ", ".join(f"{k} x{n} (e.g. {first[k]!r})"
                                       for k, n in sorted(kinds.items()))))
    return out
