"""State-dict diff that names the key, the param, the element range and the owning rank.

Rules
-----
* Dicts are compared as mappings, key by key (key order is irrelevant); lists and
  tuples element by element; never by hashing serialised bytes.
* Tensors: dtype, device, shape are compared first; values then, if dtype and shape
  agree. ``exact=True``: bitwise (floats viewed as same-width ints, so ``-0.0 != 0.0``),
  except that NaN equals NaN whatever its payload. ``exact=False``:
  ``|a-b| <= atol + rtol*|b|`` with NaN == NaN.
* The optimizer's step counter (state key ``step``) is compared exactly whatever the
  tolerance: a step of 5 or 3 against 4 is a wrong step, not a rounding error.
* Non-tensor values: same type and ``==`` (NaN == NaN); hyperparameters in
  ``param_groups`` are compared the same way, every key, including extra keys
  (``initial_lr``) and ``params`` lists (order matters).
* A value difference reports the first and last differing flat index, how many
  differ and the max abs difference; with ``owner(fqn, flat_index) -> rank`` the
  ranks owning the differing elements (first/last and, for up to 4096 differing
  elements, all of them) are reported too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
STEP_KEY = "step"  # the optimizer's step counter: exact in every comparison


@dataclass(frozen=True)
class Difference:
    """One difference between expected and actual.

    ``kind``: missing | unexpected | type | dtype | device | shape | value | length.
    ``expected``/``got``: short descriptions. For ``value`` on tensors: ``first``,
    ``last`` (flat indices), ``count``, ``max_abs`` and, with an owner function,
    ``ranks``.
    """

    path: str
    kind: str
    expected: Any = None
    got: Any = None
    param: str | None = None
    state_key: str | None = None
    first: int | None = None
    last: int | None = None
    count: int | None = None
    max_abs: float | None = None
    ranks: tuple[int, ...] = ()

    def describe(self) -> str:
        s = f"{self.path}: {self.kind}"
        if self.kind == "value" and self.first is not None:
            s += (f" at elements {self.first}..{self.last} ({self.count} differ, max abs diff "
                  f"{self.max_abs:.6g})")
            if self.ranks:
                s += f", owned by rank{'s' if len(self.ranks) > 1 else ''} {', '.join(map(str, self.ranks))}"
        if self.expected is not None or self.got is not None:
            s += f"; expected {self.expected}, got {self.got}"
        return s


def _short(x: Any, limit: int = 80) -> str:
    if isinstance(x, torch.Tensor):
        if x.numel() <= 4:
            return f"tensor({x.detach().cpu().tolist()}, dtype={x.dtype})"
        return f"tensor(shape={tuple(x.shape)}, dtype={x.dtype})"
    s = repr(x)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _key(k: Any) -> str:
    return repr(k)


def _scalar_equal(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        r = a == b
        return bool(r)
    except Exception:
        return False


def _value_diff(e: torch.Tensor, a: torch.Tensor, exact: bool, rtol: float, atol: float) -> torch.Tensor:
    """Boolean mask (flattened) of differing elements; e and a have equal dtype/shape."""
    e = e.detach().cpu().reshape(-1)
    a = a.detach().cpu().reshape(-1)
    if e.dtype == torch.bool:
        return e != a
    if e.is_complex():
        e, a = torch.view_as_real(e).reshape(-1), torch.view_as_real(a).reshape(-1)
        m = _value_diff(e, a, exact, rtol, atol).view(-1, 2)
        return m.any(dim=1)
    if e.is_floating_point():
        nan_both = e.isnan() & a.isnan()
        if exact:
            iv = _INT_VIEW[e.element_size()]
            diff = e.view(iv) != a.view(iv)
        else:
            e64, a64 = e.double(), a.double()
            diff = ~torch.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True)
        return diff & ~nan_both
    if exact or (rtol == 0 and atol == 0):
        return e != a
    return (e.double() - a.double()).abs() > atol + rtol * e.double().abs()


def diff_state_dicts(
    expected: Any,
    actual: Any,
    *,
    exact: bool = True,
    rtol: float = 0.0,
    atol: float = 0.0,
    owner: Callable[[str, int], int] | None = None,
    path: str = "",
) -> list[Difference]:
    """All differences between ``expected`` and ``actual`` (see the module docstring)."""
    out: list[Difference] = []
    _diff(expected, actual, path, out, exact=exact, rtol=rtol, atol=atol, owner=owner, param=None, skey=None)
    return out


def _diff(e, a, path, out, *, exact, rtol, atol, owner, param, skey) -> None:
    if isinstance(e, Mapping) and isinstance(a, Mapping):
        for k in sorted(set(e) | set(a), key=_key):
            p = str(k) if (path == "" and isinstance(k, str) and k.isidentifier()) else f"{path}[{k!r}]"
            in_state = path == "state"
            prm = k if in_state and isinstance(k, (str, int)) else param
            sk = k if param is not None and skey is None and not in_state else skey
            if k not in a:
                out.append(Difference(p or repr(k), "missing", _short(e[k]), "<absent>", prm, sk))
            elif k not in e:
                out.append(Difference(p or repr(k), "unexpected", "<absent>", _short(a[k]), prm, sk))
            else:
                _diff(e[k], a[k], p, out, exact=exact, rtol=rtol, atol=atol, owner=owner,
                      param=prm if in_state else param, skey=sk)
        return
    if isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor):
        where = dict(param=param, state_key=skey)
        bad = False
        if e.dtype != a.dtype:
            out.append(Difference(path, "dtype", str(e.dtype), str(a.dtype), **where))
            bad = True
        if e.device != a.device:
            out.append(Difference(path, "device", str(e.device), str(a.device), **where))
        if tuple(e.shape) != tuple(a.shape):
            out.append(Difference(path, "shape", tuple(e.shape), tuple(a.shape), **where))
            bad = True
        if bad:
            return
        mask = _value_diff(e, a, exact or skey == STEP_KEY, rtol, atol)
        idx = mask.nonzero().reshape(-1)
        if idx.numel() == 0:
            return
        ef = e.detach().cpu().reshape(-1)
        af = a.detach().cpu().reshape(-1)
        if ef.is_complex() or ef.dtype == torch.bool:
            max_abs = float("nan")
        else:
            d = (ef[idx].double() - af[idx].double()).abs()
            max_abs = float(d.nan_to_num(float("inf")).max()) if d.numel() else 0.0
        first, last = int(idx[0]), int(idx[-1])
        ranks: tuple[int, ...] = ()
        if owner is not None and isinstance(param, str):
            sample = idx if idx.numel() <= 4096 else torch.stack([idx[0], idx[-1]])
            try:
                ranks = tuple(sorted({int(owner(param, int(i))) for i in sample.tolist()}))
            except (KeyError, IndexError, ValueError):  # a key the owner map does not know
                ranks = ()  # (a flat param's local shard, say): report the diff without ranks
        exp_s = _short(ef[first]) if idx.numel() == 1 else f"{_short(float(ef[first]) if not ef.dtype == torch.bool else bool(ef[first]))} at {first}"
        got_s = _short(af[first]) if idx.numel() == 1 else f"{_short(float(af[first]) if not af.dtype == torch.bool else bool(af[first]))} at {first}"
        out.append(Difference(path, "value", exp_s, got_s, param, skey, first, last, int(idx.numel()),
                              max_abs, ranks))
        return
    if isinstance(e, (list, tuple)) and isinstance(a, (list, tuple)) and type(e) is type(a):
        if len(e) != len(a):
            out.append(Difference(path, "length", len(e), len(a), param, skey))
            if path.endswith("['params']"):
                out.append(Difference(path, "value", _short(list(e)), _short(list(a)), param, skey))
                return
        for i, (x, y) in enumerate(zip(e, a)):
            _diff(x, y, f"{path}[{i}]", out, exact=exact, rtol=rtol, atol=atol, owner=owner,
                  param=param, skey=skey)
        return
    if type(e) is not type(a):
        out.append(Difference(path, "type", f"{type(e).__name__} {_short(e)}", f"{type(a).__name__} {_short(a)}",
                              param, skey))
        return
    if not _scalar_equal(e, a):
        out.append(Difference(path, "value", _short(e), _short(a), param, skey))


def format_diff(diffs: list[Difference], limit: int = 20) -> str:
    """Readable multi-line text, at most ``limit`` differences."""
    if not diffs:
        return "state dicts are equal"
    lines = [f"{len(diffs)} difference{'s' if len(diffs) != 1 else ''}:"]
    lines += ["  " + d.describe() for d in diffs[:limit]]
    if len(diffs) > limit:
        lines.append(f"  ... and {len(diffs) - limit} more")
    return "\n".join(lines)


def assert_state_dicts_equal(expected: Any, actual: Any, *, exact: bool = True, rtol: float = 0.0,
                             atol: float = 0.0, owner: Callable[[str, int], int] | None = None,
                             limit: int = 20, msg: str = "") -> None:
    """Raise ``AssertionError`` with :func:`format_diff` text if the dicts differ."""
    diffs = diff_state_dicts(expected, actual, exact=exact, rtol=rtol, atol=atol, owner=owner)
    if diffs:
        raise AssertionError((msg + "\n" if msg else "") + format_diff(diffs, limit))
